#pragma once
/// @file
/// AsyncPS's route across hosts: a window of MPI one-sided memory
/// (MPI_Win_allocate) per shard, read and written with MPI_Get / MPI_Put
/// under the owner's passive-target lock (MPI_Win_lock), and what a call
/// moves: the rows of one owner, scattered in its segment, as one derived
/// datatype, so a lookup or a push takes one lock and one transfer per
/// owner, not one per row.
///
/// MPICH over UCX (ch4) serves one-sided calls by active messages: a lock,
/// get or put completes when the owner's process is inside MPI (any MPI
/// call, in parallax or not), or at once with MPIR_CVAR_ASYNC_PROGRESS=1
/// (a progress thread per rank, which needs a core of its own).
/// docs/async.md, "Two routes", has the measurements.

#include <parallax/detail/fault.hpp>
#include <parallax/detail/mpi.hpp>
#include <parallax/detail/shared_window.hpp>
#include <parallax/error.hpp>

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace parallax::policy::async {

/// Whether every rank of `comm` shares this machine's memory. Collective.
using detail::one_machine;

/// Byte ranges of a window segment, in the order a call's buffer holds
/// them: blocks that follow each other in the segment are merged into one
/// run, and the runs travel as one derived datatype, so a call moves each
/// owner's rows in one transfer (a dense variable's rows of an owner are a
/// few runs).
class Blocks {
 public:
  Blocks() = default;
  Blocks(const Blocks&) = delete;
  Blocks& operator=(const Blocks&) = delete;
  ~Blocks() {
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
  }
  /// `bytes` bytes at byte displacement `at`, after the blocks added before.
  void add(MPI_Aint at, std::size_t bytes) {
    total_ += bytes;
    if (!at_.empty() && at_.back() + len_.back() == at) {
      len_.back() += static_cast<int>(bytes);
      return;
    }
    at_.push_back(at);
    len_.push_back(static_cast<int>(bytes));
  }
  std::size_t bytes() const noexcept { return total_; }
  /// The runs as one datatype (built once).
  MPI_Datatype type() {
    if (type_ == MPI_DATATYPE_NULL) {
      PARALLAX_MPI_CHECK(
          MPI_Type_create_hindexed(static_cast<int>(at_.size()), len_.data(), at_.data(), MPI_BYTE, &type_));
      PARALLAX_MPI_CHECK(MPI_Type_commit(&type_));
    }
    return type_;
  }

 private:
  std::vector<MPI_Aint> at_;
  std::vector<int> len_;
  std::size_t total_ = 0;
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

/// `bytes` bytes of this rank's in a one-sided window over `comm`
/// (displacement unit 1 byte). Collective to create and to free.
class RmaWindow {
 public:
  RmaWindow() = default;
  RmaWindow(const RmaWindow&) = delete;
  RmaWindow& operator=(const RmaWindow&) = delete;
  RmaWindow(RmaWindow&& o) noexcept
      : win_(std::exchange(o.win_, MPI_WIN_NULL)), local_(std::exchange(o.local_, nullptr)),
        all_(std::exchange(o.all_, false)) {}
  RmaWindow& operator=(RmaWindow&& o) noexcept {
    if (this != &o) {
      release();
      win_ = std::exchange(o.win_, MPI_WIN_NULL);
      local_ = std::exchange(o.local_, nullptr);
      all_ = std::exchange(o.all_, false);
    }
    return *this;
  }
  ~RmaWindow() { release(); }

  /// `lock_all`: a shared passive-target epoch on every rank for the
  /// window's lifetime (for atomic counters); otherwise each access takes
  /// its target's lock (Access).
  static RmaWindow create(MPI_Comm comm, std::size_t bytes, bool lock_all) {
    RmaWindow w;
    void* local = nullptr;
    // Rounded up to whole cache lines: with a segment of 84 bytes, the
    // first 4 bytes of the next rank's segment changed under the shard
    // tests (MPICH 4.0.2, ranks of one machine; cause not found), never
    // with the padding.
    bytes = (bytes + 63) / 64 * 64 + 64;
    PARALLAX_MPI_CHECK(MPI_Win_allocate(static_cast<MPI_Aint>(bytes), 1, MPI_INFO_NULL, comm, &local, &w.win_));
    w.local_ = static_cast<unsigned char*>(local);
    PARALLAX_MPI_CHECK(MPI_Win_set_errhandler(w.win_, MPI_ERRORS_RETURN));
    if (lock_all) {
      PARALLAX_MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, w.win_));
      w.all_ = true;
    }
    return w;
  }

  explicit operator bool() const noexcept { return win_ != MPI_WIN_NULL; }
  MPI_Win win() const noexcept { return win_; }
  template <class T>
  T* local() const noexcept {
    return reinterpret_cast<T*>(local_);
  }
  /// Orders this process's loads and stores on its own segment against the
  /// one-sided calls of the others (MPI's unified model: a fence).
  void sync() const {
    if (win_ == MPI_WIN_NULL) return;
    // MPI_Win_sync needs an epoch on the window.
    if (!all_) PARALLAX_MPI_CHECK(MPI_Win_lock(MPI_LOCK_SHARED, rank(), 0, win_));
    PARALLAX_MPI_CHECK(MPI_Win_sync(win_));
    if (!all_) PARALLAX_MPI_CHECK(MPI_Win_unlock(rank(), win_));
  }

 private:
  int rank() const {
    MPI_Group group = MPI_GROUP_NULL;
    int r = 0;
    PARALLAX_MPI_CHECK(MPI_Win_get_group(win_, &group));
    MPI_Group_rank(group, &r);
    MPI_Group_free(&group);
    return r;
  }
  void release() noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // Freeing is collective: after a failed job nobody frees it with us.
    if (!finalized && !detail::job_failed() && win_ != MPI_WIN_NULL) {
      if (all_) MPI_Win_unlock_all(win_);
      MPI_Win_free(&win_);
    }
    win_ = MPI_WIN_NULL;
    local_ = nullptr;
  }

  MPI_Win win_ = MPI_WIN_NULL;
  unsigned char* local_ = nullptr;
  bool all_ = false;
};

/// The deadline of one-sided calls. MPI_Win_lock, MPI_Win_flush and
/// MPI_Win_unlock block until the target's process serves them, and have no
/// timeout: a target that stopped (killed, stuck outside MPI, its host cut
/// off) would hold the caller forever. A thread per window set sleeps until
/// an access is armed and, when one is still open after the deadline, names
/// the target, marks the job failed and ends this process with status 1
/// (no MPI call can be made from it while the caller is inside MPI); the
/// launcher then ends the job.
class Watchdog {
 public:
  Watchdog(int rank, std::chrono::milliseconds timeout) : rank_(rank), timeout_(timeout) {
    if (timeout_.count() > 0) thread_ = std::thread([this] { run(); });
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  /// An access to `target`'s segment of `what` begins / ends.
  void arm(int target, const std::string* what) {
    std::lock_guard<std::mutex> lock(mutex_);
    target_ = target;
    what_ = what;
    since_ = std::chrono::steady_clock::now();
    armed_ = true;
    wake_.notify_all();
  }
  void disarm() {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = false;
    ++serial_;
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      if (!armed_) {
        wake_.wait(lock, [this] { return stop_ || armed_; });
        continue;
      }
      const std::uint64_t serial = serial_;
      const auto due = since_ + timeout_;
      if (wake_.wait_until(lock, due, [&] { return stop_ || serial_ != serial; })) continue;
      detail::job_failed() = true;
      std::fprintf(stderr,
                   "parallax: rank %d gave up after %lld ms in a one-sided access to rank %d's shard of '%s' "
                   "(AsyncPS across hosts): rank %d did not serve it (failed, killed, cut off, or outside MPI "
                   "the whole time); this process exits with status 1\n",
                   rank_, static_cast<long long>(timeout_.count()), target_, what_ ? what_->c_str() : "?", target_);
      std::fflush(stderr);
      std::_Exit(1);
    }
  }

  int rank_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool armed_ = false, stop_ = false;
  std::uint64_t serial_ = 0;
  int target_ = -1;
  const std::string* what_ = nullptr;
  std::chrono::steady_clock::time_point since_;
  std::thread thread_;
};

/// One passive-target access epoch on `target`: shared (reads) or exclusive
/// (a read-modify-write). end() completes every transfer of the epoch at
/// the target and releases the lock; the destructor releases it on an
/// error's way out.
class Access {
 public:
  /// `watch` guards every call of the epoch with its deadline; `what`
  /// names the variable in its report.
  Access(const RmaWindow& w, int target, bool exclusive, Watchdog& watch, const std::string& what)
      : win_(w.win()), target_(target), watch_(&watch) {
    watch_->arm(target, &what);
    PARALLAX_MPI_CHECK(MPI_Win_lock(exclusive ? MPI_LOCK_EXCLUSIVE : MPI_LOCK_SHARED, target, 0, win_));
    open_ = true;
  }
  Access(const Access&) = delete;
  Access& operator=(const Access&) = delete;
  ~Access() {
    if (open_ && !detail::job_failed()) MPI_Win_unlock(target_, win_);
    watch_->disarm();
  }
  void end() {
    open_ = false;
    PARALLAX_MPI_CHECK(MPI_Win_unlock(target_, win_));
    watch_->disarm();
  }
  /// Copies the target's `where` into `out` (contiguous), and waits until
  /// it arrived.
  void get(void* out, Blocks& where) const {
    PARALLAX_MPI_CHECK(
        MPI_Get(out, static_cast<int>(where.bytes()), MPI_BYTE, target_, 0, 1, where.type(), win_));
    PARALLAX_MPI_CHECK(MPI_Win_flush(target_, win_));
  }
  /// Writes `in` (contiguous) to the target's `where`; complete at end().
  void put(const void* in, Blocks& where) const {
    PARALLAX_MPI_CHECK(
        MPI_Put(in, static_cast<int>(where.bytes()), MPI_BYTE, target_, 0, 1, where.type(), win_));
  }

 private:
  MPI_Win win_;
  int target_;
  Watchdog* watch_;
  bool open_ = false;
};

}  // namespace parallax::policy::async
