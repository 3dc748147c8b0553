#pragma once
/// @file
/// The process's place in the job: MPI start-up, ranks, and which ranks share
/// a host (real hosts from MPI_Comm_split_type, or emulated groups for tests).

#include <parallax/detail/exit_monitor.hpp>
#include <parallax/detail/fault.hpp>
#include <parallax/detail/mpi.hpp>
#include <parallax/error.hpp>

#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace parallax {

/// Settings of a Context. Every field has a working default.
struct ContextOptions {
  /// Ranks that count as one host, for local aggregation and for splitting
  /// byte counts into intra- and inter-host. 0: the real hosts
  /// (MPI_COMM_TYPE_SHARED), unless the environment sets
  /// PARALLAX_RANKS_PER_HOST. Ranks r with equal r / ranks_per_host share a host.
  int ranks_per_host = 0;
  /// OpenMP threads per rank for HostSpace kernels. 0: OMP_NUM_THREADS if set,
  /// else the machine's hardware threads divided among the ranks on it (at least 1).
  int threads = 0;
  /// Make an exception that escapes main abort the whole job (MPI_Abort) with
  /// its message, instead of leaving the other ranks waiting.
  bool abort_on_uncaught_exception = true;
  /// Fail at start-up, naming both numbers, when the launcher's rank count
  /// (PMI_SIZE, OMPI_COMM_WORLD_SIZE, or an srun task's
  /// SLURM_STEP_NUM_TASKS / SLURM_NTASKS) differs from MPI_COMM_WORLD's
  /// size: e.g. `srun` without a PMI the MPI understands starts N
  /// single-rank jobs that would each train alone. PARALLAX_CHECK_LAUNCHER=0
  /// turns it off.
  bool check_launcher = true;
};

namespace detail {

/// The launcher's count of ranks disagreeing with `world` ranks, as a
/// sentence naming the variable, or "" when they agree or nothing says.
/// Slurm's counts are read only in an srun task (SLURM_PROCID set) that no
/// other launcher described, since `mpiexec` inside an allocation may
/// rightly start fewer ranks than the allocation has.
inline std::string launcher_mismatch(int world) {
  auto read = [](const char* name) -> long {
    const char* v = std::getenv(name);
    return v && *v ? std::atol(v) : -1;
  };
  auto differs = [&](const char* name, long said) {
    return said > 0 && said != world
               ? concat("parallax: the launcher started ", said, " ranks (", name, "=", said,
                        ") but MPI_COMM_WORLD has ", world,
                        ": the MPI library did not join the launcher's processes into one job (under Slurm: "
                        "srun --mpi=pmi2 or pmix, as this MPI was built for; see docs/cluster.md). "
                        "PARALLAX_CHECK_LAUNCHER=0 skips this check")
               : std::string();
  };
  const long pmi = read("PMI_SIZE"), ompi = read("OMPI_COMM_WORLD_SIZE");
  if (auto m = differs("PMI_SIZE", pmi); !m.empty()) return m;
  if (auto m = differs("OMPI_COMM_WORLD_SIZE", ompi); !m.empty()) return m;
  if (pmi > 0 || ompi > 0 || read("SLURM_PROCID") < 0) return "";
  const long step = read("SLURM_STEP_NUM_TASKS");
  return step > 0 ? differs("SLURM_STEP_NUM_TASKS", step) : differs("SLURM_NTASKS", read("SLURM_NTASKS"));
}

/// An identifier of the running kernel (Linux's boot_id): ranks that share
/// it share a machine's cores, whatever network namespace or container each
/// runs in. 0 where it cannot be read.
inline std::uint64_t machine_id() {
  std::FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f == nullptr) return 0;
  char text[64] = {};
  const std::size_t n = std::fread(text, 1, sizeof(text) - 1, f);
  std::fclose(f);
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(text[i])) * 1099511628211ull;
  return n > 0 ? h : 0;
}

}  // namespace detail

/// Who is where: rank, size, and the host of every rank. Immutable.
class Topology {
 public:
  Topology() = default;
  /// @param machine_ranks ranks running on this rank's machine, when hosts
  ///        are emulated (several emulated hosts on one machine); 0: the host's.
  /// @param host_names name of each host (index = host number); empty: unnamed.
  Topology(int rank, std::vector<int> host_of, int machine_ranks = 0, std::vector<std::string> host_names = {})
      : rank_(rank), host_of_(std::move(host_of)), machine_ranks_(machine_ranks), host_names_(std::move(host_names)) {
    local_size_ = 0;
    num_hosts_ = host_of_.empty() ? 0 : *std::max_element(host_of_.begin(), host_of_.end()) + 1;
    for (int r = 0; r < size(); ++r) {
      if (host_of_[r] == host()) {
        if (r < rank_) ++local_rank_;
        ++local_size_;
      }
    }
  }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return static_cast<int>(host_of_.size()); }
  /// Host of a rank, numbered 0..num_hosts()-1 in order of each host's lowest rank.
  int host_of(int rank) const noexcept { return host_of_[static_cast<std::size_t>(rank)]; }
  int host() const noexcept { return host_of(rank_); }
  int num_hosts() const noexcept { return num_hosts_; }
  /// This rank's index among the ranks of its host, and how many there are.
  int local_rank() const noexcept { return local_rank_; }
  int local_size() const noexcept { return local_size_; }
  bool same_host(int peer) const noexcept { return host_of(peer) == host(); }
  /// This machine runs more ranks than it has hardware threads: waiting
  /// ranks then take turns on the cores (RingOptions::adapt_to_oversubscription,
  /// engine::Options::yield). The ranks of the machine count, not those of
  /// the host: with emulated hosts, or hosts that are network namespaces or
  /// containers of one machine, they share its cores (and the kernel's
  /// network stack, which spinning ranks starve: docs/cluster.md).
  bool oversubscribed() const noexcept {
    const int threads = static_cast<int>(std::thread::hardware_concurrency());
    return threads > 0 && machine_ranks() > threads;
  }
  /// The ranks on host h, ascending.
  std::vector<int> ranks_of_host(int h) const {
    std::vector<int> out;
    for (int r = 0; r < size(); ++r)
      if (host_of_[r] == h) out.push_back(r);
    return out;
  }
  const std::vector<int>& hosts() const noexcept { return host_of_; }
  /// Host h's name: the processor name MPI gives its ranks (the hostname),
  /// with "/h" appended for emulated hosts; "" when unnamed.
  std::string host_name(int h) const {
    return static_cast<std::size_t>(h) < host_names_.size() ? host_names_[static_cast<std::size_t>(h)] : std::string();
  }
  /// The host name of every rank, by rank (empty when unnamed): what a
  /// diagnosis prints for the ranks it lost.
  std::vector<std::string> rank_host_names() const {
    if (host_names_.empty()) return {};
    std::vector<std::string> out;
    for (int r = 0; r < size(); ++r) out.push_back(host_name(host_of(r)));
    return out;
  }
  /// Ranks running on this rank's machine (sharing its kernel, so its cores),
  /// at least its host's: more than the host's where hosts are emulated, or
  /// are network namespaces or containers of one machine.
  int machine_ranks() const noexcept { return std::max(local_size_, machine_ranks_); }

 private:
  int rank_ = 0;
  std::vector<int> host_of_{0};
  int num_hosts_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  int machine_ranks_ = 0;
  std::vector<std::string> host_names_;
};

/// The job as parallax sees it. Construct one per process, before any
/// variable: `px::Context ctx(argc, argv);`.
///
/// The context holds a duplicate of the given communicator with
/// MPI_ERRORS_RETURN, so MPI failures surface as parallax::mpi_error.
class Context {
 public:
  /// Initialises MPI (MPI_THREAD_SERIALIZED: a trainer's communication
  /// thread makes calls, never beside another thread's) if nobody has yet,
  /// and finalises it on destruction if it did.
  Context(int& argc, char**& argv, ContextOptions options = {});

  /// Joins an already initialised MPI over `comm` (MPI_COMM_WORLD by default).
  explicit Context(MPI_Comm comm = MPI_COMM_WORLD, ContextOptions options = {});

  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  /// Ends the job as one: where this Context initialised MPI, every rank
  /// first waits (up to the collectives' deadline, PARALLAX_TIMEOUT_MS) for
  /// every other rank to reach this point, so a rank that vanished without
  /// finishing (killed, or exited with status 0 mid-training) fails the job
  /// on the survivors, naming it, instead of leaving them in MPI_Finalize.
  /// After a failure anywhere, the job is aborted (MPI_Abort, status 1).
  /// MPI_Abort and MPI_Finalize can block forever once the network is gone
  /// (a cut link to the launcher, a TCP transport waiting on a closed peer):
  /// a rank still in either after the grace period exits by itself, with
  /// status 1 from the abort and 0 from a finalize that every rank reached.
  ~Context();

  int rank() const noexcept { return topology_.rank(); }
  int size() const noexcept { return topology_.size(); }
  bool is_root() const noexcept { return rank() == 0; }
  const Topology& topology() const noexcept { return topology_; }
  /// The job's communicator (a duplicate owned by the context).
  MPI_Comm comm() const noexcept { return comm_; }
  /// The ranks of this rank's host (real or emulated), ordered by rank.
  MPI_Comm host_comm() const noexcept { return host_comm_; }
  int threads() const noexcept { return threads_; }
  /// Whether MPI lets a thread other than the one that initialised it make
  /// calls, one thread at a time (MPI_THREAD_SERIALIZED or more): what a
  /// trainer's communication thread needs.
  bool serialized_threads() const {
    int level = MPI_THREAD_SINGLE;
    PARALLAX_MPI_CHECK(MPI_Query_thread(&level));
    return level >= MPI_THREAD_SERIALIZED;
  }

  // Reductions for metrics and bookkeeping (a loss, an accuracy, a count)
  // over every rank of the job: each rank passes its value and gets the
  // result. Collective, under the collectives' deadline
  // (PARALLAX_TIMEOUT_MS): a rank that never arrives is named, the job is
  // marked failed, and timeout_error is thrown. Gradients are the trainer's
  // business, not these.

  /// The sum over the ranks of x (int, std::int64_t, float or double).
  template <class T>
  T sum(T x) const {
    reduce(&x, 1, ReduceOp::sum);
    return x;
  }
  /// The sums over the ranks, element by element (every rank passes as many).
  template <class T>
  std::vector<T> sum(std::vector<T> x) const {
    reduce(x.data(), x.size(), ReduceOp::sum);
    return x;
  }
  /// The mean over the ranks of x, in double precision.
  template <class T>
  double mean(T x) const {
    return static_cast<double>(sum(static_cast<double>(x))) / size();
  }
  template <class T>
  T max(T x) const {
    reduce(&x, 1, ReduceOp::max);
    return x;
  }
  template <class T>
  T min(T x) const {
    reduce(&x, 1, ReduceOp::min);
    return x;
  }

 private:
  template <class T>
  void reduce(T* x, std::size_t n, ReduceOp op) const {
    static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>,
                  "Context reductions take int, std::int64_t, float or double values");
    MPI_Request request = MPI_REQUEST_NULL;
    PARALLAX_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, x, detail::to_mpi_count(n), detail::mpi_datatype(data_type_of_v<T>),
                                      detail::mpi_op(op), comm_, &request));
    const auto timeout = detail::timeout_from_environment();
    if (!wait_until_deadline(request, timeout, false)) throw timeout_error(report_lost("Context::sum/max/min", "metrics", timeout));
  }

  /// Completes `request` by polling it until the deadline (zero: none),
  /// yielding between polls on an oversubscribed machine, or sleeping where
  /// `sleep` (teardown). False when the deadline passed or a peer is lost.
  bool wait_until_deadline(MPI_Request& request, std::chrono::milliseconds timeout, bool sleep) const {
    const auto until = std::chrono::steady_clock::now() + timeout;
    const bool yield = topology_.oversubscribed();
    for (;;) {
      int done = 0;
      if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
      if (done) return true;
      if (timeout.count() > 0 && std::chrono::steady_clock::now() >= until) return false;
      if (sleep) std::this_thread::sleep_for(std::chrono::microseconds(200));
      else if (yield) std::this_thread::yield();
    }
  }

  /// After a call of the Context's own missed its deadline: marks the job
  /// failed, compares notes with the ranks that also gave up (as a failed
  /// engine call does), prints the diagnosis and returns it.
  std::string report_lost(const char* op, const char* policy, std::chrono::milliseconds timeout) const {
    detail::job_failed() = true;
    detail::Position mine;
    std::strncpy(mine.op, op, sizeof(mine.op) - 1);
    std::strncpy(mine.policy, policy, sizeof(mine.policy) - 1);
    const auto grace = detail::grace_for(timeout);
    const auto heard = end_channel_->exchange(mine, grace);
    const std::string report = detail::diagnose(rank(), mine, heard, detail::concat("gave up after ", timeout.count(), " ms"),
                                                topology_.rank_host_names());
    std::fprintf(stderr, "%s\n", report.c_str());
    std::fflush(stderr);
    end_channel_->settle(heard, grace);
    return report;
  }

  void setup(MPI_Comm comm, const ContextOptions& options) {
    PARALLAX_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
    PARALLAX_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    int rank = 0, size = 0;
    PARALLAX_MPI_CHECK(MPI_Comm_rank(comm_, &rank));
    PARALLAX_MPI_CHECK(MPI_Comm_size(comm_, &size));
    if (options.check_launcher) {
      const char* off = std::getenv("PARALLAX_CHECK_LAUNCHER");
      int world = 0;
      PARALLAX_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
      const std::string wrong = off && std::atoi(off) == 0 ? std::string() : detail::launcher_mismatch(world);
      if (!wrong.empty()) {
        MPI_Comm_free(&comm_);
        throw error(wrong);
      }
    }

    int per_host = options.ranks_per_host;
    if (per_host == 0) {
      if (const char* env = std::getenv("PARALLAX_RANKS_PER_HOST")) per_host = std::atoi(env);
    }
    PARALLAX_EXPECTS(per_host >= 0, "ContextOptions::ranks_per_host must be >= 0, got ", per_host);

    // Host key: the lowest rank of each host; then numbered densely.
    int key = 0, shared_ranks = 0;
    MPI_Comm shared = MPI_COMM_NULL;
    PARALLAX_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared));
    PARALLAX_MPI_CHECK(MPI_Comm_size(shared, &shared_ranks));
    if (per_host > 0) key = (rank / per_host) * per_host;
    else PARALLAX_MPI_CHECK(MPI_Allreduce(&rank, &key, 1, MPI_INT, MPI_MIN, shared));
    MPI_Comm_free(&shared);

    // What every rank knows of its place: host key, machine, processor name.
    struct Place {
      int key;
      std::uint64_t machine;
      char name[MPI_MAX_PROCESSOR_NAME];
    };
    Place mine{key, detail::machine_id(), {}};
    int name_length = 0;
    PARALLAX_MPI_CHECK(MPI_Get_processor_name(mine.name, &name_length));
    std::vector<Place> places(static_cast<std::size_t>(size));
    PARALLAX_MPI_CHECK(MPI_Allgather(&mine, sizeof(Place), MPI_BYTE, places.data(), sizeof(Place), MPI_BYTE, comm_));
    std::vector<int> sorted;
    for (const Place& p : places) sorted.push_back(p.key);
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
    std::vector<int> host_of(places.size());
    std::vector<std::string> host_names(sorted.size());
    for (std::size_t r = 0; r < places.size(); ++r) {
      host_of[r] = static_cast<int>(std::lower_bound(sorted.begin(), sorted.end(), places[r].key) - sorted.begin());
      host_names[static_cast<std::size_t>(host_of[r])] = places[r].name;
    }
    if (per_host > 0)
      for (std::size_t h = 0; h < host_names.size(); ++h) host_names[h] += "/" + std::to_string(h);
    // Ranks on this machine: those of its MPI shared-memory domain, or more
    // where hosts are namespaces or containers of one kernel.
    int machine_ranks = shared_ranks;
    if (mine.machine != 0)
      machine_ranks = std::max(machine_ranks, static_cast<int>(std::count_if(places.begin(), places.end(), [&](const Place& p) {
                                                return p.machine == mine.machine;
                                              })));
    topology_ = Topology(rank, std::move(host_of), machine_ranks, std::move(host_names));
    PARALLAX_MPI_CHECK(MPI_Comm_split(comm_, topology_.host(), rank, &host_comm_));
    PARALLAX_MPI_CHECK(MPI_Comm_set_errhandler(host_comm_, MPI_ERRORS_RETURN));

    threads_ = options.threads;
    if (threads_ <= 0 && std::getenv("OMP_NUM_THREADS") == nullptr) {
      const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      threads_ = std::max(1, hw / std::max(1, topology_.machine_ranks()));
    }
    if (threads_ > 0) omp_set_num_threads(threads_);
    threads_ = omp_get_max_threads();

    end_channel_ = std::make_unique<detail::FaultChannel>(comm_);
    if (abort_comm() == MPI_COMM_NULL) {
      PARALLAX_MPI_CHECK(MPI_Comm_dup(comm_, &abort_comm()));
      PARALLAX_MPI_CHECK(MPI_Comm_set_errhandler(abort_comm(), MPI_ERRORS_RETURN));
      owns_abort_comm_ = true;
    }
    if (options.abort_on_uncaught_exception) std::set_terminate(&Context::abort_job);
  }

  /// std::terminate handler: print what escaped and bring the whole job down,
  /// so no other rank waits forever in a collective.
  [[noreturn]] static void abort_job() {
    int rank = -1, initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (auto current = std::current_exception()) {
      try {
        std::rethrow_exception(current);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "parallax: rank %d: uncaught exception: %s\n", rank, e.what());
      } catch (...) {
        std::fprintf(stderr, "parallax: rank %d: uncaught exception of unknown type\n", rank);
      }
    } else {
      std::fprintf(stderr, "parallax: rank %d: std::terminate called\n", rank);
    }
    std::fflush(stderr);
    if (initialized && !finalized) {
      meet_before_abort();
      abort_mpi();
    }
    std::abort();
  }

  /// A communicator of its own for meet_before_abort(), or MPI_COMM_NULL.
  static MPI_Comm& abort_comm() {
    static MPI_Comm comm = MPI_COMM_NULL;
    return comm;
  }

  /// Before the first MPI_Abort tears the job down, the ranks that are
  /// ending it meet for a moment: an error every rank throws (a bad id, a
  /// wrong shape) escapes main on every rank, and the first rank's abort
  /// killed the others before they printed theirs (seen at 3 ranks). They
  /// meet in a barrier of their own, for at most min(grace, 3 s): a rank
  /// that fails alone waits that long for peers that are not coming. Then
  /// a moment more, for the launcher to forward what they printed.
  static void meet_before_abort() {
    if (abort_comm() != MPI_COMM_NULL) {
      MPI_Request barrier = MPI_REQUEST_NULL;
      if (MPI_Ibarrier(abort_comm(), &barrier) == MPI_SUCCESS) {
        const auto until = std::chrono::steady_clock::now() +
                           std::min<std::chrono::milliseconds>(detail::grace_for(detail::timeout_from_environment()),
                                                               std::chrono::seconds(3));
        for (int done = 0; !done && std::chrono::steady_clock::now() < until;) {
          if (MPI_Test(&barrier, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
          if (!done) std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }

  /// MPI_Abort, and this process's own exit if the launcher cannot be
  /// reached to carry it out.
  static void abort_mpi() {
    detail::exit_if_still_running(detail::grace_for(detail::timeout_from_environment()), 1, "MPI_Abort");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

  /// The completion handshake of ~Context: a barrier under the deadline. A
  /// rank that never arrives is named by the ranks that did, as a collective
  /// that timed out names it, and the job is marked failed.
  void meet_at_the_end() {
    const auto timeout = detail::timeout_from_environment();
    MPI_Request barrier = MPI_REQUEST_NULL;
    if (MPI_Ibarrier(comm_, &barrier) != MPI_SUCCESS) {
      detail::job_failed() = true;
      return;
    }
    // Teardown is not latency-critical: waiting ranks sleep, leaving the core to the peers.
    if (!wait_until_deadline(barrier, timeout, true)) report_lost("~Context", "end", timeout);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm host_comm_ = MPI_COMM_NULL;
  Topology topology_;
  /// Where ranks report, at the end, that a peer never arrived.
  std::unique_ptr<detail::FaultChannel> end_channel_;
  int threads_ = 1;
  bool owns_mpi_ = false;
  bool owns_abort_comm_ = false;
};

// The context's constructors and destructor, which bring the job's start
// and end (MPI's, the fault channel's, the exit monitor's) into the file
// that calls them: inline, unless parallax::trainers compiles them once
// (<parallax/trainers.hpp>), when a file that links it sees only the
// declarations above.
#if !(defined(PARALLAX_TRAINERS_LIBRARY) && PARALLAX_TRAINERS_LIBRARY)
#define PARALLAX_CONTEXT_DEFINITION_ inline
#elif defined(PARALLAX_TRAINERS_CONTEXT_SOURCE)
#define PARALLAX_CONTEXT_DEFINITION_
#endif
#ifdef PARALLAX_CONTEXT_DEFINITION_
PARALLAX_CONTEXT_DEFINITION_ Context::Context(int& argc, char**& argv, ContextOptions options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // Before MPI_Init, while this process has one thread: a rank that
    // exits with status 0 before the job finished must fail the job.
    detail::ExitMonitor::start();
    int provided = 0;
    PARALLAX_MPI_CHECK(MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided));
    owns_mpi_ = true;
  }
  setup(MPI_COMM_WORLD, options);
  detail::ExitMonitor::set_rank(rank());
}

PARALLAX_CONTEXT_DEFINITION_ Context::Context(MPI_Comm comm, ContextOptions options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  PARALLAX_EXPECTS(initialized, "parallax::Context(comm) needs MPI to be initialised; use Context(argc, argv)");
  setup(comm, options);
}

PARALLAX_CONTEXT_DEFINITION_ Context::~Context() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (owns_mpi_ && !detail::job_failed()) meet_at_the_end();
  if (detail::job_failed()) {
    // A collective failed: some rank is gone or elsewhere, and MPI_Finalize
    // could wait for it forever. End the whole job now, non-zero.
    std::fflush(stdout);
    std::fflush(stderr);
    // The launcher forwards each rank's output asynchronously and drops
    // what it has not forwarded when the abort tears the job down: a peer's
    // report, already written, was lost that way at 4 ranks on 2 cores.
    // A moment's pause lets it arrive.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    abort_mpi();
  }
  end_channel_.reset();
  if (owns_abort_comm_) MPI_Comm_free(&abort_comm());
  if (host_comm_ != MPI_COMM_NULL) MPI_Comm_free(&host_comm_);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  if (owns_mpi_) {
    detail::ExitMonitor::job_finished();  // every rank met at the end
    detail::exit_if_still_running(detail::grace_for(detail::timeout_from_environment()), 0,
                                  "MPI_Finalize (every rank had reached the end)");
    MPI_Finalize();
  }
}
#undef PARALLAX_CONTEXT_DEFINITION_
#endif

}  // namespace parallax
