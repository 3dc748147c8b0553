#pragma once
// What happens when a collective does not complete: the ranks that gave up
// tell each other where they are stuck, on a communicator of their own, and
// each names the ranks it did not hear from. Then the job is marked failed,
// so Context ends it with MPI_Abort rather than waiting in MPI_Finalize.

#include <parallax/detail/mpi.hpp>
#include <parallax/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace parallax::detail {

/// Set once any engine call fails or times out: the job cannot go on.
inline std::atomic<bool>& job_failed() {
  static std::atomic<bool> failed{false};
  return failed;
}

/// The deadline of every collective: PARALLAX_TIMEOUT_MS, else 60 s (zero:
/// none). engine::Options holds the same default.
inline std::chrono::milliseconds timeout_from_environment(std::chrono::milliseconds fallback = std::chrono::seconds(60)) {
  const char* t = std::getenv("PARALLAX_TIMEOUT_MS");
  return t && *t ? std::chrono::milliseconds(std::atoll(t)) : fallback;
}

/// How long a rank that gave up listens for the others' reports, for a
/// deadline of `timeout`: a fifth of it, between 1 and 10 seconds.
inline std::chrono::milliseconds grace_for(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 5, std::chrono::milliseconds(1000), std::chrono::milliseconds(10000));
}

/// Ends this process with `status` if it is still running `after` from now:
/// the guard around calls that may never return once the network is gone.
/// MPI_Abort reaches the other ranks through the launcher; a rank whose link
/// to the launcher was cut blocks in it forever, reading a socket no one
/// will write (MPICH's hydra proxy, seen over a cut veth link), and would
/// hold its memory and GPU as an orphan. MPI_Finalize, too, can wait on a
/// peer that never answers (UCX's TCP transport after the job's last
/// message, openucx/ucx#8738). `what` names the call in the message.
inline void exit_if_still_running(std::chrono::milliseconds after, int status, const char* what) {
  std::thread([after, status, what] {
    std::this_thread::sleep_for(after);
    std::fprintf(stderr, "parallax: %s did not return within %lld ms; this process exits with status %d\n", what,
                 static_cast<long long>(after.count()), status);
    std::fflush(stderr);
    std::_Exit(status);
  }).detach();
}

/// The trainer call the user's thread is in ("step", "lookup", "save", ...)
/// for diagnoses, or nullptr outside one. Names are string literals.
inline std::atomic<const char*>& user_call() {
  static std::atomic<const char*> name{nullptr};
  return name;
}

/// Names the user's call in diagnoses while it lives; restores the outer
/// name after (a save() inside step() is the save).
class UserCall {
 public:
  explicit UserCall(const char* name) : outer_(user_call().exchange(name)) {}
  ~UserCall() { user_call().store(outer_); }
  UserCall(const UserCall&) = delete;
  UserCall& operator=(const UserCall&) = delete;

 private:
  const char* outer_;
};

/// Where a rank is: the user's call, the trainer step and the engine call
/// it is waiting in.
struct Position {
  std::int64_t step = -1;  // -1: outside any trainer step
  std::int64_t call = 0;   // engine calls made so far, this one included
  char op[24] = {};
  char variable[48] = {};
  char policy[24] = {};  // of a call that carries several variables (variable empty)
  char user[16] = {};    // the trainer call the user made (user_call()), empty outside one

  /// `label`: the call's statistics label (variable, policy), as CommStats
  /// books it.
  static Position make(std::int64_t step, std::int64_t call, const char* op,
                       const std::pair<std::string, std::string>& label) {
    Position p;
    p.step = step;
    p.call = call;
    std::strncpy(p.op, op, sizeof(p.op) - 1);
    std::strncpy(p.variable, label.first.c_str(), sizeof(p.variable) - 1);
    std::strncpy(p.policy, label.second.c_str(), sizeof(p.policy) - 1);
    if (const char* user = user_call().load()) std::strncpy(p.user, user, sizeof(p.user) - 1);
    return p;
  }
  bool same_call(const Position& o) const {
    return step == o.step && call == o.call && std::strncmp(op, o.op, sizeof(op)) == 0;
  }
  std::string describe() const {
    std::ostringstream os;
    if (user[0] != '\0') os << user << "(), in ";
    os << op << " #" << call;
    if (variable[0] != '\0') os << " (variable '" << variable << "')";
    else if (policy[0] == '\0' || std::strcmp(policy, "control") == 0) os << " (the step's control exchange)";
    else if (std::strcmp(policy, "checkpoint") == 0) os << " (a checkpoint)";
    else if (std::strcmp(policy, "metrics") == 0) os << " (a metric reduced over the ranks)";
    else if (std::strcmp(policy, "end") == 0) os << " (the end of the program, where every rank's Context waits for the others)";
    else os << " (" << policy << ", several variables)";
    if (step >= 0) os << " at step " << step;
    return os.str();
  }
};

/// The side channel the ranks use to report where they are stuck.
class FaultChannel {
 public:
  static constexpr int tag = 7117;

  explicit FaultChannel(MPI_Comm parent) {
    PARALLAX_MPI_CHECK(MPI_Comm_dup(parent, &comm_));
    PARALLAX_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  FaultChannel(const FaultChannel&) = delete;
  FaultChannel& operator=(const FaultChannel&) = delete;
  ~FaultChannel() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL && !job_failed()) MPI_Comm_free(&comm_);
  }

  /// Sends `mine` to every other rank, then listens for up to `grace` for
  /// theirs. Entry r is what rank r said (nothing if it did not answer).
  std::vector<std::optional<Position>> exchange(const Position& mine, std::chrono::milliseconds grace) {
    return exchange_with(mine, grace, tag, std::vector<bool>(static_cast<std::size_t>(size_), true));
  }

  /// After printing its report, a rank tells the ranks it heard from, and
  /// waits (up to `grace`) until they have printed theirs too: the first
  /// rank to abort the job would otherwise cut the others' reports off.
  /// It waits up to twice `grace`: a peer that gave up later than this rank
  /// (descheduled on a loaded host) still spends up to `grace` listening for
  /// the silent ranks before it prints, and a wait of one `grace` from this
  /// rank's report cut such a peer's report off (seen at 4 ranks on 2 cores).
  void settle(const std::vector<std::optional<Position>>& heard, std::chrono::milliseconds grace) {
    std::vector<bool> peers(heard.size());
    for (std::size_t r = 0; r < heard.size(); ++r) peers[r] = heard[r].has_value();
    exchange_with(Position{}, 2 * grace, tag + 1, peers);
  }

 private:
  std::vector<std::optional<Position>> exchange_with(const Position& mine, std::chrono::milliseconds grace, int tag_,
                                                     const std::vector<bool>& peers) {
    const auto n = static_cast<std::size_t>(size_);
    std::vector<std::optional<Position>> heard(n);
    heard[static_cast<std::size_t>(rank_)] = mine;
    std::size_t waiting = 0;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || !peers[static_cast<std::size_t>(p)]) continue;
      MPI_Request r;
      // Fire and forget: a dead peer must not hold us up.
      if (MPI_Isend(&mine, sizeof(Position), MPI_BYTE, p, tag_, comm_, &r) == MPI_SUCCESS) MPI_Request_free(&r);
    }
    std::vector<Position> inbox(n);
    std::vector<MPI_Request> reqs(n, MPI_REQUEST_NULL);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || !peers[static_cast<std::size_t>(p)]) continue;
      MPI_Irecv(&inbox[static_cast<std::size_t>(p)], sizeof(Position), MPI_BYTE, p, tag_, comm_, &reqs[p]);
      ++waiting;
    }
    const auto until = std::chrono::steady_clock::now() + grace;
    while (waiting > 0 && std::chrono::steady_clock::now() < until) {
      for (int p = 0; p < size_; ++p) {
        if (reqs[p] == MPI_REQUEST_NULL) continue;
        int done = 0;
        if (MPI_Test(&reqs[p], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
          reqs[p] = MPI_REQUEST_NULL;  // a broken link: treat as silent
          --waiting;
          continue;
        }
        if (done) {
          heard[static_cast<std::size_t>(p)] = inbox[static_cast<std::size_t>(p)];
          --waiting;
        }
      }
    }
    for (auto& r : reqs)
      if (r != MPI_REQUEST_NULL) {
        MPI_Cancel(&r);
        MPI_Request_free(&r);
      }
    return heard;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

/// " Lost: host px1 (all 2 of its ranks); rank 5 of host px2; this rank is
/// on px0." for the silent ranks, by host, given every rank's host name
/// (`names`, indexed by rank; "" when it does not list every rank). A host
/// none of whose ranks answered is what a cut link or a dead machine looks
/// like; a rank alone is a crash.
inline std::string lost_hosts(int me, const std::vector<int>& silent, const std::vector<std::string>& names,
                              std::size_t ranks) {
  if (names.size() != ranks) return "";
  std::vector<std::string> hosts;
  for (int r : silent)
    if (std::find(hosts.begin(), hosts.end(), names[static_cast<std::size_t>(r)]) == hosts.end())
      hosts.push_back(names[static_cast<std::size_t>(r)]);
  std::ostringstream os;
  os << " Lost:";
  for (std::size_t h = 0; h < hosts.size(); ++h) {
    std::vector<int> on, lost;
    for (std::size_t r = 0; r < ranks; ++r)
      if (names[r] == hosts[h]) on.push_back(static_cast<int>(r));
    for (int r : silent)
      if (names[static_cast<std::size_t>(r)] == hosts[h]) lost.push_back(r);
    os << (h ? ";" : "") << " ";
    if (lost.size() == on.size())
      os << "host " << hosts[h] << " (" << (on.size() == 1 ? "its rank" : "all " + std::to_string(on.size()) + " of its ranks") << ")";
    else {
      os << (lost.size() == 1 ? "rank " : "ranks ");
      for (std::size_t i = 0; i < lost.size(); ++i) os << (i ? ", " : "") << lost[i];
      os << " of host " << hosts[h];
    }
  }
  os << (names[static_cast<std::size_t>(me)].empty() ? "" : "; this rank is on " + names[static_cast<std::size_t>(me)]) << ".";
  return os.str();
}

/// The sentence a rank throws after its diagnosis: who did not arrive, who
/// is elsewhere.
/// `host_names`: every rank's host name, to name the hosts lost (Topology::rank_host_names()).
inline std::string diagnose(int me, const Position& mine, const std::vector<std::optional<Position>>& heard,
                            const std::string& cause, const std::vector<std::string>& host_names = {}) {
  std::vector<int> silent, same;
  std::vector<std::pair<int, Position>> elsewhere;
  for (std::size_t r = 0; r < heard.size(); ++r) {
    if (static_cast<int>(r) == me) continue;
    if (!heard[r]) silent.push_back(static_cast<int>(r));
    else if (heard[r]->same_call(mine)) same.push_back(static_cast<int>(r));
    else elsewhere.emplace_back(static_cast<int>(r), *heard[r]);
  }
  auto list = [](const std::vector<int>& v) {
    std::ostringstream os;
    for (std::size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
    return os.str();
  };
  std::ostringstream os;
  os << "parallax: rank " << me << " " << cause << " in " << mine.describe() << ".";
  if (!silent.empty()) {
    os << (silent.size() == 1 ? " Rank " : " Ranks ") << list(silent)
       << " did not arrive (failed, killed, or stuck outside parallax).";
    os << lost_hosts(me, silent, host_names, heard.size());
  }
  for (const auto& [r, p] : elsewhere) os << " Rank " << r << " is in " << p.describe() << " instead.";
  if (!same.empty()) os << " Ranks waiting in the same call: " << list(same) << ".";
  if (silent.empty() && elsewhere.empty()) os << " Every rank is in this call: it is slow, not lost (raise the timeout).";
  return os.str();
}

}  // namespace parallax::detail
