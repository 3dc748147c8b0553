#pragma once
// SharedWindow: one segment of host memory per rank, in an MPI-3
// shared-memory window, that every rank of the communicator can load from
// directly. A sharded table (TableGroup) keeps its shard in one when all
// its ranks run on one machine, so a lookup reads the rows from their
// owners' shards instead of asking the owners to send them.

#include <parallax/detail/fault.hpp>
#include <parallax/detail/mpi.hpp>
#include <parallax/error.hpp>

#include <mpi.h>
#include <sys/statvfs.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace parallax::detail {

/// Bytes free in /dev/shm, where MPICH maps shared windows (0 if it has none).
inline std::size_t dev_shm_room() {
  struct statvfs fs {};
  if (statvfs("/dev/shm", &fs) != 0) return 0;
  return static_cast<std::size_t>(fs.f_bavail) * static_cast<std::size_t>(fs.f_frsize);
}

/// The ranks of `comm` that share this machine's memory, in comm's order
/// (a communicator the caller frees); `everyone`: whether that is every rank
/// of comm, as this rank sees it. Collective over comm.
inline MPI_Comm machine_ranks(MPI_Comm comm, bool& everyone) {
  int rank = 0, size = 0, node_size = 0;
  PARALLAX_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  PARALLAX_MPI_CHECK(MPI_Comm_size(comm, &size));
  MPI_Comm node = MPI_COMM_NULL;
  PARALLAX_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  MPI_Comm_size(node, &node_size);
  everyone = node_size == size;
  return node;
}

/// Whether every rank of `comm` shares this machine's memory (the ranks
/// agree). Collective.
inline bool one_machine(MPI_Comm comm) {
  bool everyone = false;
  MPI_Comm node = machine_ranks(comm, everyone);
  MPI_Comm_free(&node);
  int all = everyone;
  PARALLAX_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, comm));
  return all != 0;
}

template <class T>
class SharedWindow {
 public:
  SharedWindow() = default;
  SharedWindow(const SharedWindow&) = delete;
  SharedWindow& operator=(const SharedWindow&) = delete;
  SharedWindow(SharedWindow&& o) noexcept
      : win_(std::exchange(o.win_, MPI_WIN_NULL)), bases_(std::move(o.bases_)), local_(std::exchange(o.local_, nullptr)) {}
  SharedWindow& operator=(SharedWindow&& o) noexcept {
    if (this != &o) {
      release();
      win_ = std::exchange(o.win_, MPI_WIN_NULL);
      bases_ = std::move(o.bases_);
      local_ = std::exchange(o.local_, nullptr);
    }
    return *this;
  }
  ~SharedWindow() { release(); }

  /// A window with `count` elements of this rank's, over every rank of
  /// `comm`, or an empty one (operator bool false) on every rank when the
  /// ranks do not all share this machine's memory, or when its
  /// shared-memory file system (/dev/shm, where MPICH maps the segments)
  /// lacks room for all of them and 16 MiB to spare: a mapping past a full
  /// tmpfs would fault on first touch instead of failing here. Collective
  /// over comm.
  static SharedWindow create(MPI_Comm comm, std::size_t count) {
    SharedWindow w;
    int size = 0;
    PARALLAX_MPI_CHECK(MPI_Comm_size(comm, &size));
    bool one = false;
    MPI_Comm node = machine_ranks(comm, one);
    unsigned long long bytes = count * sizeof(T);
    int status = MPI_Allreduce(MPI_IN_PLACE, &bytes, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, comm);
    int fits = status == MPI_SUCCESS && one && dev_shm_room() >= bytes + (std::size_t{16} << 20);
    if (status == MPI_SUCCESS) status = MPI_Allreduce(MPI_IN_PLACE, &fits, 1, MPI_INT, MPI_MIN, comm);
    if (status == MPI_SUCCESS && fits) {
      MPI_Info info = MPI_INFO_NULL;
      // Each segment on its own pages, near the rank that writes it.
      MPI_Info_create(&info);
      MPI_Info_set(info, "alloc_shared_noncontig", "true");
      void* local = nullptr;
      status = MPI_Win_allocate_shared(static_cast<MPI_Aint>(count * sizeof(T)), static_cast<int>(sizeof(T)), info,
                                       node, &local, &w.win_);
      MPI_Info_free(&info);
      w.local_ = static_cast<T*>(local);
    }
    // The window keeps its own communicator.
    MPI_Comm_free(&node);
    PARALLAX_MPI_CHECK(status);
    if (!w) return w;
    PARALLAX_MPI_CHECK(MPI_Win_set_errhandler(w.win_, MPI_ERRORS_RETURN));
    // A passive-target epoch on every segment for the window's lifetime:
    // MPI_Win_sync (below) needs one.
    PARALLAX_MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, w.win_));
    w.bases_.resize(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) {
      MPI_Aint segment = 0;
      int unit = 0;
      void* base = nullptr;
      PARALLAX_MPI_CHECK(MPI_Win_shared_query(w.win_, r, &segment, &unit, &base));
      w.bases_[static_cast<std::size_t>(r)] = static_cast<const T*>(base);
    }
    return w;
  }

  explicit operator bool() const noexcept { return win_ != MPI_WIN_NULL; }
  /// This rank's segment (writable).
  T* local() const noexcept { return local_; }
  /// The first element of every rank's segment, by rank.
  const T* const* bases() const noexcept { return bases_.data(); }

  /// Orders this process's loads and stores on the window against those of
  /// the others, with the synchronisation that follows (a message): call it
  /// after writing a segment and before reading another's. MPI-3's unified
  /// memory model asks for it; on x86 it is a fence.
  void sync() const {
    if (win_ != MPI_WIN_NULL) PARALLAX_MPI_CHECK(MPI_Win_sync(win_));
  }

 private:
  void release() noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // Freeing a window is collective: after a failed job there is nobody to
    // free it with (the job ends, and the memory with it).
    if (!finalized && !job_failed() && win_ != MPI_WIN_NULL) {
      MPI_Win_unlock_all(win_);
      MPI_Win_free(&win_);
    }
    win_ = MPI_WIN_NULL;
    local_ = nullptr;
    bases_.clear();
  }

  MPI_Win win_ = MPI_WIN_NULL;
  std::vector<const T*> bases_;
  T* local_ = nullptr;
};

}  // namespace parallax::detail
