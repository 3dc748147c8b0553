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
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace parallax::detail {

/// Set once any engine call fails or times out: the job cannot go on.
inline std::atomic<bool>& job_failed() {
  static std::atomic<bool> failed{false};
  return failed;
}

/// Where a rank is: the trainer step and the engine call it is waiting in.
struct Position {
  std::int64_t step = -1;  // -1: outside any trainer step
  std::int64_t call = 0;   // engine calls made so far, this one included
  char op[24] = {};
  char variable[48] = {};
  char policy[24] = {};  // of a call that carries several variables (variable empty)

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
    return p;
  }
  bool same_call(const Position& o) const {
    return step == o.step && call == o.call && std::strncmp(op, o.op, sizeof(op)) == 0;
  }
  std::string describe() const {
    std::ostringstream os;
    os << op << " #" << call;
    if (variable[0] != '\0') os << " (variable '" << variable << "')";
    else if (policy[0] == '\0' || std::strcmp(policy, "control") == 0) os << " (the step's control exchange)";
    else if (std::strcmp(policy, "checkpoint") == 0) os << " (a checkpoint)";
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

/// The sentence a rank throws after its diagnosis: who did not arrive, who
/// is elsewhere.
inline std::string diagnose(int me, const Position& mine, const std::vector<std::optional<Position>>& heard,
                            const std::string& cause) {
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
  if (!silent.empty())
    os << (silent.size() == 1 ? " Rank " : " Ranks ") << list(silent)
       << (silent.size() == 1 ? " did" : " did") << " not arrive (failed, killed, or stuck outside parallax).";
  for (const auto& [r, p] : elsewhere) os << " Rank " << r << " is in " << p.describe() << " instead.";
  if (!same.empty()) os << " Ranks waiting in the same call: " << list(same) << ".";
  if (silent.empty() && elsewhere.empty()) os << " Every rank is in this call: it is slow, not lost (raise the timeout).";
  return os.str();
}

}  // namespace parallax::detail
