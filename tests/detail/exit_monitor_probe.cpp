// A process for tests/detail/exit_monitor.cpp: a "rank" under the exit monitor
// (detail/exit_monitor.hpp) that stops itself, and a "launcher" that starts
// one and stays until it is killed.
//
//   exit_monitor_probe stop <fd>      splits into monitor and rank; the rank
//                                     writes "<monitor pid> <rank pid>\n" to
//                                     fd and stops itself (SIGSTOP)
//   exit_monitor_probe launcher <fd>  starts `stop <fd>` as its child and
//                                     waits; the test kills it, as a dead
//                                     launcher proxy
#include <parallax/detail/exit_monitor.hpp>

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s stop|launcher <fd>\n", argv[0]);
    return 2;
  }
  const int fd = std::atoi(argv[2]);
  if (std::strcmp(argv[1], "launcher") == 0) {
    const pid_t child = fork();
    if (child < 0) return 1;
    if (child == 0) {
      execl("/proc/self/exe", argv[0], "stop", argv[2], static_cast<char*>(nullptr));
      _exit(127);
    }
    for (;;) pause();
  }
  setenv("PMI_SIZE", "2", 1);  // as one of two ranks of a launched job
  unsetenv("PARALLAX_EXIT_MONITOR");
  parallax::detail::ExitMonitor::start();
  // The rank.
  char line[64];
  const int n = std::snprintf(line, sizeof(line), "%d %d\n", static_cast<int>(getppid()), static_cast<int>(getpid()));
  if (write(fd, line, static_cast<std::size_t>(n)) != n) return 1;
  close(fd);
  std::raise(SIGSTOP);
  return 0;
}
