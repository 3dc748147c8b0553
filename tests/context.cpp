// context.hpp: ranks, real and emulated hosts.
#include "support.hpp"

#include <thread>

TEST_CASE("Context reports the world and one real host for one machine", "[context]") {
  auto& ctx = test::world();
  int n = 0, r = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  CHECK(ctx.size() == n);
  CHECK(ctx.rank() == r);
  CHECK(ctx.is_root() == (r == 0));
  // mpiexec on one machine: every rank shares the one host.
  CHECK(ctx.topology().num_hosts() == 1);
  CHECK(ctx.topology().local_size() == n);
  CHECK(ctx.topology().local_rank() == r);
  CHECK(ctx.threads() >= 1);
  int hs = 0;
  MPI_Comm_size(ctx.host_comm(), &hs);
  CHECK(hs == n);
}

TEST_CASE("Context emulates hosts of k ranks", "[context]") {
  const int k = GENERATE(1, 2, 3);
  px::Context ctx(MPI_COMM_WORLD, px::ContextOptions{k});
  const auto& t = ctx.topology();
  const int n = ctx.size(), r = ctx.rank();
  CHECK(t.num_hosts() == (n + k - 1) / k);
  CHECK(t.host() == r / k);
  CHECK(t.local_rank() == r % k);
  CHECK(t.local_size() == std::min(k, n - (r / k) * k));
  for (int p = 0; p < n; ++p) CHECK(t.same_host(p) == (p / k == r / k));
  const auto mates = t.ranks_of_host(t.host());
  CHECK(static_cast<int>(mates.size()) == t.local_size());
  CHECK(mates.front() == (r / k) * k);
  int hs = 0;
  MPI_Comm_size(ctx.host_comm(), &hs);
  CHECK(hs == t.local_size());
}

TEST_CASE("Context rejects a negative ranks_per_host on every rank", "[context]") {
  const std::string msg = test::error_of([] { px::Context bad(MPI_COMM_WORLD, px::ContextOptions{-2}); });
  CHECK_THAT(msg, Catch::Contains("ranks_per_host") && Catch::Contains("-2"));
}

TEST_CASE("Context reduces metrics over the ranks", "[context][metrics]") {
  auto& ctx = test::world();
  const int n = ctx.size(), r = ctx.rank();
  CHECK(ctx.sum(r + 1) == n * (n + 1) / 2);
  CHECK(ctx.sum(std::int64_t{1} << 40) == (std::int64_t{1} << 40) * n);
  CHECK(ctx.sum(0.5f) == 0.5f * static_cast<float>(n));
  CHECK(ctx.mean(static_cast<double>(r)) == (n - 1) / 2.0);
  CHECK(ctx.mean(r) == (n - 1) / 2.0);
  CHECK(ctx.max(r) == n - 1);
  CHECK(ctx.min(10.0 - r) == 10.0 - (n - 1));
  const std::vector<double> mine{1.0 * r, 2.0, -1.0 * r};
  const std::vector<double> sums = ctx.sum(mine);
  CHECK(sums == std::vector<double>{n * (n - 1) / 2.0, 2.0 * n, -n * (n - 1) / 2.0});
}

namespace {

/// Sets an environment variable for the scope, then restores it.
class EnvScope {
 public:
  EnvScope(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~EnvScope() {
    if (had_) ::setenv(name_.c_str(), old_.c_str(), 1);
    else ::unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

}  // namespace

TEST_CASE("Context fails fast when the launcher started more ranks than MPI joined", "[context][launcher]") {
  const int n = test::world().size();
  const std::string more = std::to_string(n + 3), same = std::to_string(n);
  {
    // hydra's variable.
    EnvScope pmi("PMI_SIZE", more.c_str());
    CHECK_THAT(test::error_of([] { px::Context c(MPI_COMM_WORLD); }),
               Catch::Contains("PMI_SIZE=" + more) && Catch::Contains("MPI_COMM_WORLD has " + same));
    px::ContextOptions off;
    off.check_launcher = false;
    CHECK_NOTHROW(px::Context(MPI_COMM_WORLD, off));
    EnvScope env_off("PARALLAX_CHECK_LAUNCHER", "0");
    CHECK_NOTHROW(px::Context(MPI_COMM_WORLD));
  }
  {
    // srun without a PMI the MPI understands: no PMI_SIZE, Slurm's count.
    EnvScope pmi("PMI_SIZE", nullptr), ompi("OMPI_COMM_WORLD_SIZE", nullptr);
    EnvScope task("SLURM_PROCID", "0"), tasks("SLURM_NTASKS", more.c_str());
    CHECK_THAT(test::error_of([] { px::Context c(MPI_COMM_WORLD); }), Catch::Contains("SLURM_NTASKS=" + more));
    EnvScope step("SLURM_STEP_NUM_TASKS", same.c_str());  // the step's own count wins, and agrees
    CHECK_NOTHROW(px::Context(MPI_COMM_WORLD));
  }
  {
    // mpiexec inside an allocation of more tasks (a batch script, no srun task).
    EnvScope pmi("PMI_SIZE", same.c_str()), tasks("SLURM_NTASKS", more.c_str()), task("SLURM_PROCID", "0");
    CHECK_NOTHROW(px::Context(MPI_COMM_WORLD));
  }
}

TEST_CASE("emulated hosts count the machine's ranks for oversubscription", "[context]") {
  // Every test rank runs on this machine: one emulated host per rank still
  // shares its cores with all of them.
  px::ContextOptions o;
  o.ranks_per_host = 1;
  px::Context each(MPI_COMM_WORLD, o);
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  CHECK(each.topology().local_size() == 1);
  CHECK(each.topology().oversubscribed() == (hw > 0 && each.size() > hw));
}

TEST_CASE("Context names the hosts and counts the machine's ranks", "[context][hosts]") {
  auto& ctx = test::world();
  const auto& t = ctx.topology();
  // One machine: every rank shares its kernel, whatever the hosts.
  CHECK(t.machine_ranks() == ctx.size());
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(name, &length);
  CHECK(t.host_name(0) == name);
  CHECK(t.rank_host_names() == std::vector<std::string>(static_cast<std::size_t>(ctx.size()), name));

  px::Context emulated(MPI_COMM_WORLD, px::ContextOptions{2});
  const auto& e = emulated.topology();
  CHECK(e.machine_ranks() == ctx.size());
  for (int r = 0; r < ctx.size(); ++r)
    CHECK(e.rank_host_names()[static_cast<std::size_t>(r)] == std::string(name) + "/" + std::to_string(r / 2));
}

TEST_CASE("a diagnosis names the hosts whose ranks it lost", "[context][hosts]") {
  using px::detail::Position;
  const std::vector<std::string> names{"px0", "px0", "px1", "px1", "px2", "px2"};
  Position mine = Position::make(4, 17, "allreduce", {"w", "RingAllReduce"});
  std::vector<std::optional<Position>> heard(6);
  heard[0] = mine;
  heard[1] = mine;
  heard[5] = mine;  // rank 5 answered: px2 lost only rank 4; px1 lost both
  const std::string report = px::detail::diagnose(0, mine, heard, "gave up after 10 ms", names);
  CHECK_THAT(report, Catch::Matchers::Contains("Ranks 2, 3, 4 did not arrive"));
  CHECK_THAT(report, Catch::Matchers::Contains("Lost: host px1 (all 2 of its ranks); rank 4 of host px2; this rank is on px0."));
  // Without names (or with a list of the wrong length) nothing is guessed.
  CHECK_THAT(px::detail::diagnose(0, mine, heard, "x", {}), !Catch::Matchers::Contains("Lost:"));
  CHECK_THAT(px::detail::diagnose(0, mine, heard, "x", {"a"}), !Catch::Matchers::Contains("Lost:"));
}

TEST_CASE("a diagnosis names the trainer call each rank is in, then the engine call", "[context][diagnosis]") {
  using px::detail::Position;
  Position outside = Position::make(3, 9, "alltoallv_unsized", {"", "ShardedPS"});
  CHECK(outside.describe() == "alltoallv_unsized #9 (ShardedPS, several variables) at step 3");
  Position mine, theirs;
  {
    const px::detail::UserCall step("step");
    mine = Position::make(3, 9, "allreduce", {"", "control"});
    {
      const px::detail::UserCall save("save");  // nested: the inner call is named
      CHECK_THAT(Position::make(3, 10, "allgather", {"", "checkpoint"}).describe(),
                 Catch::Matchers::StartsWith("save(), in allgather #10"));
    }
    CHECK(px::detail::user_call().load() == std::string("step"));
  }
  CHECK(px::detail::user_call().load() == nullptr);
  {
    const px::detail::UserCall lookup("lookup");
    theirs = Position::make(3, 9, "alltoallv_unsized", {"emb", "ShardedPS"});
  }
  std::vector<std::optional<Position>> heard{mine, theirs};
  const std::string report = px::detail::diagnose(0, mine, heard, "gave up after 10 ms");
  CHECK_THAT(report, Catch::Matchers::Contains("rank 0 gave up after 10 ms in step(), in allreduce #9 (the step's "
                                               "control exchange) at step 3."));
  CHECK_THAT(report, Catch::Matchers::Contains("Rank 1 is in lookup(), in alltoallv_unsized #9 (variable 'emb') at "
                                               "step 3 instead."));
}
