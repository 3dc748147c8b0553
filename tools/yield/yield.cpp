// libparallax_yield: gives the core away when MPI's progress engine polls
// and finds nothing to do, for runs with more ranks than cores.
//
// MPICH's blocking calls (ch4:ucx: MPI_Allreduce, MPI_Comm_split_type,
// MPI_Win_allocate_shared, ...) poll UCX's progress engine in a loop that
// never yields. Where ranks outnumber cores, a rank spinning there holds a
// core that the peer it waits for needs, until the scheduler preempts it;
// every step of a collective can cost a scheduler slice. parallax's own
// waits yield on such a machine (engine::Options::yield), MPICH's cannot be
// told to. Preloaded (LD_PRELOAD) into the ranks, this library stands in for
// ucp_worker_progress: it calls UCX's and, when that progressed nothing,
// sched_yield()s, so the waiting rank lets a runnable peer have the core.
// The calls and their results are UCX's: only the scheduling changes.
// Without UCX in the process it is never called. docs/testing.md,
// "Oversubscribed ranks", has the measurements; the test suite preloads it
// into entries of more ranks than the machine has cores.

#include <dlfcn.h>
#include <sched.h>

namespace {

using Progress = unsigned (*)(void*);

Progress ucx_progress() {
  // The next definition after this library's in the lookup order: UCX's.
  static const Progress next = reinterpret_cast<Progress>(dlsym(RTLD_NEXT, "ucp_worker_progress"));
  return next;
}

}  // namespace

/// UCX's ucp_worker_progress (ucp/api/ucp.h: `unsigned
/// ucp_worker_progress(ucp_worker_h worker)`, the count of communication
/// events it progressed), then a yield when it progressed none.
extern "C" __attribute__((visibility("default"))) unsigned ucp_worker_progress(void* worker) {
  const unsigned progressed = ucx_progress()(worker);
  if (progressed == 0) sched_yield();
  return progressed;
}
