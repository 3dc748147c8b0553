// The exit monitor: a rank that ends with status 0 before its job finished
// must not let the job end with status 0.
//
// A launcher judges a job by its processes' exit statuses. MPICH's hydra,
// when one rank exits with status 0 before the others (an `_exit(0)` deep in
// a library, a `return 0` in a code path that skipped the training loop),
// SIGKILLs the other ranks and, depending on which exit it reaps first,
// reports 0: a scheduler would count a failed training as a success, with no
// message. No code of the vanished rank runs (`_exit` skips destructors and
// atexit handlers), and the survivors are killed before their deadlines
// fire, so neither can say so.
//
// So the process the launcher starts stays a small monitor and the rank runs
// in its child (forked before MPI_Init, while the process has one thread).
// The monitor holds what the launcher watches (its pid, the PMI socket and
// the output pipes, inherited), forwards the launcher's signals to the rank,
// and ends as the rank ended: the same status, or the same signal. The rank
// tells it through a pipe once the job has finished as one (~Context's
// end-of-job handshake met every rank). A rank that exits with status 0
// before that is a failure: the monitor prints it, naming the rank, keeps
// the job's view of the rank alive for the others' deadline (so they notice
// and name the rank too), then exits with status 1. A rank whose monitor
// dies (SIGKILL from the launcher's cleanup) dies with it
// (PR_SET_PDEATHSIG).
//
// A stopped rank (SIGSTOP: a hung process, a fault drill's victim) acts on
// nothing but SIGKILL: a termination request stays pending until the rank is
// continued. So the monitor continues the rank after forwarding SIGINT,
// SIGTERM, SIGHUP or SIGQUIT, as a shell does for a stopped job it kills;
// and a monitor whose launcher is gone (its parent process changed: the
// proxy was killed, or ended when it lost the job's launcher) kills the
// rank, stopped or not, and ends: no one is left to report to, and an
// orphaned rank would hold its memory and its GPU, unseen. The monitor
// checks its parent every quarter second (a parent-death signal would fire
// when the launcher's forking *thread* ends, which a multi-threaded launcher
// may do while the job runs).
//
// Started only under a multi-rank launcher (PMI_SIZE, OMPI_COMM_WORLD_SIZE
// or SLURM_NTASKS above 1) and only by the Context that initialises MPI;
// PARALLAX_EXIT_MONITOR=0 turns it off (for a debugger or profiler that
// must start the rank itself).
#pragma once

#include <parallax/detail/fault.hpp>

#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace parallax::detail {

class ExitMonitor {
 public:
  /// Whether this process should split into a monitor and a rank: launched
  /// as one of several ranks, MPI not yet initialised (the caller's duty),
  /// and not turned off.
  static bool wanted() {
    if (const char* off = std::getenv("PARALLAX_EXIT_MONITOR"); off != nullptr && std::atoi(off) == 0) return false;
    for (const char* name : {"PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}) {
      const char* v = std::getenv(name);
      if (v != nullptr && std::atol(v) > 1) return true;
    }
    return false;
  }

  /// Splits the process: returns in the child, which goes on as the rank;
  /// the parent never returns (it monitors the child and exits as it did).
  /// Call before MPI_Init, with no other thread running. Does nothing where
  /// the split is not wanted or fork fails (the rank then runs unmonitored).
  static void start() {
    if (!wanted()) return;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return;
    std::fflush(nullptr);  // nothing buffered is written twice
    const pid_t launcher = getppid();
    const pid_t parent = getpid();
    const pid_t child = fork();
    if (child < 0) {
      close(fds[0]);
      close(fds[1]);
      return;
    }
    if (child == 0) {
      close(fds[0]);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);  // the monitor died before the line above
      write_fd() = fds[1];
      return;
    }
    close(fds[1]);
    monitor(child, fds[0], launcher);
  }

  /// Tells the monitor this rank's number (for its messages).
  static void set_rank(int rank) {
    char line[32];
    const int n = std::snprintf(line, sizeof(line), "R%d\n", rank);
    send(line, n);
  }

  /// Tells the monitor the job has finished as one: an exit with status 0
  /// from now on is a success.
  static void job_finished() { send("F\n", 2); }

 private:
  static int& write_fd() {
    static int fd = -1;
    return fd;
  }

  static void send(const char* text, int n) {
    if (write_fd() < 0) return;
    while (n > 0) {
      const ssize_t w = write(write_fd(), text, static_cast<std::size_t>(n));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return;
      text += w;
      n -= static_cast<int>(w);
    }
  }

  static pid_t& child_pid() {
    static pid_t pid = 0;
    return pid;
  }

  static void forward(int sig) {
    if (child_pid() <= 0) return;
    kill(child_pid(), sig);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT) kill(child_pid(), SIGCONT);
  }

  [[noreturn]] static void monitor(pid_t child, int read_fd, pid_t launcher) {
    child_pid() = child;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCONT, SIGALRM}) {
      struct sigaction sa {};
      sa.sa_handler = &ExitMonitor::forward;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_RESTART;
      sigaction(sig, &sa, nullptr);
    }
    // Waits for the rank, waking on SIGCHLD (blocked, so none is lost
    // between the check and the wait) or every quarter second to look at
    // the launcher.
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, nullptr);
    int status = 0;
    for (;;) {
      const pid_t done = waitpid(child, &status, WNOHANG);
      if (done == child) break;
      if (done < 0 && errno != EINTR) _exit(1);
      if (getppid() != launcher) {
        kill(child, SIGKILL);
        while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
        }
        _exit(1);
      }
      const timespec tick{0, 250'000'000};
      sigtimedwait(&chld, nullptr, &tick);
    }
    // Everything the rank sent is in the pipe now; the rank's end closed it.
    std::string said;
    char buf[256];
    for (ssize_t n; (n = read(read_fd, buf, sizeof(buf))) != 0;) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) break;
      said.append(buf, static_cast<std::size_t>(n));
    }
    if (WIFSIGNALED(status)) {
      const int sig = WTERMSIG(status);
      signal(sig, SIG_DFL);
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, sig);
      sigprocmask(SIG_UNBLOCK, &set, nullptr);
      raise(sig);
      _exit(128 + sig);
    }
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (code != 0 || said.find("F\n") != std::string::npos) _exit(code);
    std::string rank = "?";
    if (const auto at = said.find('R'); at != std::string::npos) rank = said.substr(at + 1, said.find('\n', at) - at - 1);
    const auto timeout = timeout_from_environment();
    // The others give up at their deadline, listen for reports for a grace
    // period, then end the job: stay past that, so that they can.
    const auto linger = timeout + 2 * grace_for(timeout) + std::chrono::milliseconds(1000);
    std::fprintf(stderr,
                 "parallax: rank %s (pid %d) exited with status 0 before the job finished (its parallax::Context was "
                 "still open): the job fails. Its process stays up to %lld ms so the other ranks' deadlines find and "
                 "name it, then exits with status 1.\n",
                 rank.c_str(), static_cast<int>(child), static_cast<long long>(linger.count()));
    std::fflush(stderr);
    std::this_thread::sleep_for(linger);
    _exit(1);
  }
};

}  // namespace parallax::detail
