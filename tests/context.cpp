// context.hpp: ranks, real and emulated hosts.
#include "support.hpp"

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
