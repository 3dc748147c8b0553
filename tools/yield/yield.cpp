// libparallax_yield: gives the core away when MPI's progress engine polls
// and finds nothing to do, for runs with more ranks than cores.
//
// MPICH's blocking calls (ch4:ucx: MPI_Allreduce, MPI_Comm_split_type,
// MPI_Win_allocate_shared, ...) poll UCX's progress engine in a loop that
// never yields. Where ranks outnumber cores, a rank spinning there holds a
// core that the peer it waits for needs, until the scheduler preempts it:
// every step of a collective can cost a scheduler slice. parallax's own
// waits yield on such a machine (engine::Options::yield); MPICH's cannot be
// told to. Preloaded (LD_PRELOAD) into the ranks, this library stands in for
// ucp_worker_progress: it calls UCX's and, when that progressed nothing,
// gives the core away: sched_yield() for the first polls of a wait, then a
// short sleep, so that a rank waiting longer leaves the core to whatever
// else the machine runs (a build beside the tests, the peer itself) instead
// of taking it back at every yield. The calls and their results are UCX's:
// only the scheduling changes. Without UCX in the process it is never
// called. docs/testing.md, "Oversubscribed ranks", has the measurements;
// the test suite preloads it into entries of more ranks than the machine
// has cores.
//
// Environment: PARALLAX_YIELD_POLLS (idle polls that yield before the
// sleeping starts, default 16), PARALLAX_YIELD_SLEEP_US (the sleep, default
// 50 microseconds; 0: yield only).

#include <dlfcn.h>
#include <sched.h>
#include <time.h>

#include <cstdlib>

namespace {

using Progress = unsigned (*)(void*);

Progress ucx_progress() {
  // The next definition after this library's in the lookup order: UCX's.
  static const Progress next = reinterpret_cast<Progress>(dlsym(RTLD_NEXT, "ucp_worker_progress"));
  return next;
}

long setting(const char* name, long fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  return (*end == '\0' && v >= 0) ? v : fallback;
}

struct Settings {
  unsigned long polls = static_cast<unsigned long>(setting("PARALLAX_YIELD_POLLS", 16));
  long sleep_us = setting("PARALLAX_YIELD_SLEEP_US", 50);
  timespec pause{sleep_us / 1000000, (sleep_us % 1000000) * 1000};
};

const Settings& settings() {
  static const Settings s;
  return s;
}

thread_local unsigned long idle_polls = 0;  // this thread's polls since one progressed

}  // namespace

/// UCX's ucp_worker_progress (ucp/api/ucp.h: `unsigned
/// ucp_worker_progress(ucp_worker_h worker)`, the count of communication
/// events it progressed), then, when it progressed none, a yield or a sleep.
extern "C" __attribute__((visibility("default"))) unsigned ucp_worker_progress(void* worker) {
  const unsigned progressed = ucx_progress()(worker);
  if (progressed != 0) {
    idle_polls = 0;
    return progressed;
  }
  const Settings& s = settings();
  if (s.sleep_us == 0 || ++idle_polls <= s.polls)
    sched_yield();
  else
    nanosleep(&s.pause, nullptr);
  return progressed;
}
