// detail/exit_monitor.hpp: a rank that is stopped (SIGSTOP: a hung process,
// a fault drill's victim) must still end with its job. It acts on nothing but
// SIGKILL, and a termination request waits, pending, until it is continued.
// Two ways the job ends around it, each run on exit_monitor_probe:
//  * the monitor is asked to terminate (a scheduler's SIGTERM): it continues
//    the rank after forwarding the request, and both end by that signal;
//  * the monitor's launcher dies (a launcher proxy killed, or ended by its
//    own failure): the monitor and its rank end with it. Both sat in
//    wait4/stopped forever, orphaned, after a fault drill timed out in CI.
// The test process becomes a child subreaper, so that the orphans of a dead
// launcher are reparented to it and it can tell when they end.
#include "support.hpp"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <thread>

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

/// Starts the probe in `mode`; the pids its rank writes come through a pipe.
struct Probe {
  pid_t spawned = -1;
  pid_t monitor = -1;
  pid_t rank = -1;

  explicit Probe(const char* mode) {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    const std::string fd = std::to_string(fds[1]);
    const char* argv[] = {EXIT_MONITOR_PROBE, mode, fd.c_str(), nullptr};
    REQUIRE(posix_spawn(&spawned, EXIT_MONITOR_PROBE, nullptr, nullptr, const_cast<char**>(argv), environ) == 0);
    close(fds[1]);
    std::string line;
    char c = 0;
    while (read(fds[0], &c, 1) == 1 && c != '\n') line += c;
    close(fds[0]);
    int m = -1, r = -1;
    REQUIRE(std::sscanf(line.c_str(), "%d %d", &m, &r) == 2);
    monitor = m;
    rank = r;
  }
};

/// The state letter of /proc/<pid>/stat ('T' stopped, 'Z' zombie), or 0.
char state_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close_paren = stat.rfind(')');
  return close_paren == std::string::npos || close_paren + 2 >= stat.size() ? 0 : stat[close_paren + 2];
}

bool wait_stopped(pid_t pid, std::chrono::milliseconds within) {
  for (const auto until = Clock::now() + within; Clock::now() < until;) {
    if (const char s = state_of(pid); s == 't' || s == 'T') return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

/// Reaps this process's children until every pid in `pids` has ended, or
/// the time is up; the statuses of those that ended, by pid.
std::map<pid_t, int> reap(std::set<pid_t> pids, std::chrono::milliseconds within) {
  std::map<pid_t, int> ended;
  for (const auto until = Clock::now() + within; !pids.empty() && Clock::now() < until;) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      if (pids.erase(pid) > 0) ended[pid] = status;
      continue;
    }
    if (pid < 0 && errno == ECHILD) break;  // none of them is (or will be) this process's child
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return ended;
}

/// Kills what a failed case left behind (the rank dies with its monitor).
void clean_up(const Probe& p) {
  for (pid_t pid : {p.spawned, p.monitor, p.rank})
    if (pid > 0 && state_of(pid) != 0) kill(pid, SIGKILL);
  reap({p.spawned, p.monitor, p.rank}, std::chrono::seconds(5));
}

struct Subreaper {
  Subreaper() { REQUIRE(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0); }
  ~Subreaper() { prctl(PR_SET_CHILD_SUBREAPER, 0); }
};

}  // namespace

TEST_CASE("a stopped rank ends when its monitor is asked to terminate", "[exit_monitor]") {
  Subreaper subreaper;
  Probe p("stop");
  CHECK(p.monitor == p.spawned);
  REQUIRE(wait_stopped(p.rank, std::chrono::seconds(10)));
  REQUIRE(kill(p.monitor, SIGTERM) == 0);
  const auto ended = reap({p.monitor}, std::chrono::seconds(10));
  INFO("the monitor forwards SIGTERM to its stopped rank, which acts on it only once continued");
  CHECK(ended.count(p.monitor) == 1);
  if (ended.count(p.monitor) == 1) {
    const int status = ended.at(p.monitor);
    CHECK(WIFSIGNALED(status));
    CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM));
  }
  CHECK(state_of(p.rank) == 0);  // the monitor reaped it
  clean_up(p);
}

TEST_CASE("a monitor and its stopped rank end when their launcher dies", "[exit_monitor]") {
  Subreaper subreaper;
  Probe p("launcher");
  CHECK(p.monitor != p.spawned);
  REQUIRE(wait_stopped(p.rank, std::chrono::seconds(10)));
  REQUIRE(kill(p.spawned, SIGKILL) == 0);
  CHECK(reap({p.spawned}, std::chrono::seconds(5)).size() == 1);
  // Orphaned, the monitor is reparented to this process.
  const auto ended = reap({p.monitor}, std::chrono::seconds(10));
  INFO("a monitor whose launcher is gone kills its rank, stopped or not, and ends");
  CHECK(ended.count(p.monitor) == 1);
  CHECK(state_of(p.rank) == 0);  // killed and reaped by the monitor
  clean_up(p);
}
