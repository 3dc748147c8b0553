#pragma once
/// @file
/// Pipeline schedules as values: for each stage, the ordered list of passes
/// (forward or backward of one micro-batch) it runs in one training step.
/// GPipe runs every forward, then every backward; 1F1B runs S - s - 1
/// forwards ahead on stage s, then alternates one forward and one backward.
/// A schedule can be read, printed, compared and simulated: simulate() plays
/// it with given pass costs and returns each pass's start and end, the
/// makespan and the bubble fraction, and every schedule is checked by such a
/// play when made (a schedule that would deadlock is refused, naming where).

#include <parallax/error.hpp>

#include <algorithm>
#include <cstddef>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace parallax::pipeline {

/// Which way a pass goes: activations forward, errors backward.
enum class Pass { forward, backward };

/// One unit of a stage's work: a pass over one micro-batch.
struct Action {
  Pass pass = Pass::forward;
  int micro = 0;
  friend bool operator==(const Action& a, const Action& b) { return a.pass == b.pass && a.micro == b.micro; }
  friend bool operator!=(const Action& a, const Action& b) { return !(a == b); }
};

/// "F3" for the forward of micro-batch 3, "B3" for its backward.
inline std::string to_string(const Action& a) { return (a.pass == Pass::forward ? "F" : "B") + std::to_string(a.micro); }

/// The built-in schedules.
enum class ScheduleKind { gpipe, one_f_one_b };

inline const char* to_string(ScheduleKind k) { return k == ScheduleKind::gpipe ? "gpipe" : "1f1b"; }

/// "gpipe" or "1f1b" (also "one_f_one_b"); anything else throws, naming it.
inline ScheduleKind schedule_kind(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::gpipe;
  if (name == "1f1b" || name == "one_f_one_b") return ScheduleKind::one_f_one_b;
  throw error(detail::concat("unknown pipeline schedule '", name, "' (gpipe or 1f1b)"));
}

/// A schedule played with given costs (Schedule::simulate).
struct Simulation {
  /// start[s][i], end[s][i]: when stage s starts and ends its i-th action.
  std::vector<std::vector<double>> start, end;
  double makespan = 0;            ///< from the first start to the last end
  std::vector<double> busy;       ///< per stage: the sum of its action costs
  /// The share of stage time spent idle: 1 - sum(busy) / (stages x makespan).
  double bubble_fraction() const {
    if (makespan <= 0 || busy.empty()) return 0;
    double b = 0;
    for (double x : busy) b += x;
    return 1.0 - b / (makespan * static_cast<double>(busy.size()));
  }
};

/// The passes of every stage in one step. Immutable; checked when made.
class Schedule {
 public:
  /// All forwards in micro-batch order, then all backwards in reverse order
  /// (the last micro-batch's error arrives first): GPipe.
  static Schedule gpipe(int stages, int micro_batches) {
    check_sizes(stages, micro_batches);
    std::vector<std::vector<Action>> a(static_cast<std::size_t>(stages));
    for (auto& list : a) {
      for (int m = 0; m < micro_batches; ++m) list.push_back({Pass::forward, m});
      for (int m = micro_batches - 1; m >= 0; --m) list.push_back({Pass::backward, m});
    }
    return Schedule("gpipe", micro_batches, std::move(a));
  }

  /// One forward, one backward (PipeDream-Flush): stage s runs
  /// min(S - s - 1, M) forwards ahead, then alternates a forward and a
  /// backward, then runs the backwards left. Stage s holds at most
  /// min(S - s, M) micro-batches' activations at once.
  static Schedule one_f_one_b(int stages, int micro_batches) {
    check_sizes(stages, micro_batches);
    std::vector<std::vector<Action>> a(static_cast<std::size_t>(stages));
    for (int s = 0; s < stages; ++s) {
      auto& list = a[static_cast<std::size_t>(s)];
      const int warmup = std::min(stages - s - 1, micro_batches);
      int f = 0, b = 0;
      for (; f < warmup; ++f) list.push_back({Pass::forward, f});
      while (f < micro_batches) {
        list.push_back({Pass::forward, f++});
        list.push_back({Pass::backward, b++});
      }
      while (b < micro_batches) list.push_back({Pass::backward, b++});
    }
    return Schedule("1f1b", micro_batches, std::move(a));
  }

  static Schedule make(ScheduleKind kind, int stages, int micro_batches) {
    return kind == ScheduleKind::gpipe ? gpipe(stages, micro_batches) : one_f_one_b(stages, micro_batches);
  }

  /// A schedule of one's own: `actions[s]` is stage s's list. Throws unless
  /// every stage runs the forward and the backward of every micro-batch
  /// once, each forward before its backward, and the stages together cannot
  /// deadlock (a pass waits only for its neighbour's pass of the same
  /// micro-batch: a forward for the previous stage's forward, a backward for
  /// the next stage's backward).
  Schedule(std::string name, int micro_batches, std::vector<std::vector<Action>> actions)
      : name_(std::move(name)), micro_batches_(micro_batches), actions_(std::move(actions)) {
    check_sizes(stages(), micro_batches_);
    for (int s = 0; s < stages(); ++s) {
      std::vector<int> forward_at(static_cast<std::size_t>(micro_batches_), -1),
          backward_at(static_cast<std::size_t>(micro_batches_), -1);
      const auto& list = actions_[static_cast<std::size_t>(s)];
      for (std::size_t i = 0; i < list.size(); ++i) {
        const Action& a = list[i];
        PARALLAX_EXPECTS(a.micro >= 0 && a.micro < micro_batches_, "schedule '", name_, "': stage ", s, " action ", i,
                         " (", to_string(a), ") names a micro-batch outside 0..", micro_batches_ - 1);
        int& at = (a.pass == Pass::forward ? forward_at : backward_at)[static_cast<std::size_t>(a.micro)];
        PARALLAX_EXPECTS(at < 0, "schedule '", name_, "': stage ", s, " runs ", to_string(a), " twice");
        at = static_cast<int>(i);
      }
      for (int m = 0; m < micro_batches_; ++m) {
        const auto um = static_cast<std::size_t>(m);
        PARALLAX_EXPECTS(forward_at[um] >= 0 && backward_at[um] >= 0, "schedule '", name_, "': stage ", s,
                         " never runs ", forward_at[um] < 0 ? "F" : "B", m);
        PARALLAX_EXPECTS(forward_at[um] < backward_at[um], "schedule '", name_, "': stage ", s, " runs B", m,
                         " before F", m);
      }
    }
    simulate(std::vector<double>(actions_.size(), 1.0), std::vector<double>(actions_.size(), 1.0));
  }

  const std::string& name() const noexcept { return name_; }
  int stages() const noexcept { return static_cast<int>(actions_.size()); }
  int micro_batches() const noexcept { return micro_batches_; }
  /// Stage s's passes, in the order it runs them.
  const std::vector<Action>& actions(int stage) const { return actions_.at(static_cast<std::size_t>(stage)); }

  /// The most micro-batches whose forward stage s has run and whose backward
  /// it has not (the activations it must keep at once).
  int peak_in_flight(int stage) const {
    int now = 0, peak = 0;
    for (const Action& a : actions(stage)) {
      now += a.pass == Pass::forward ? 1 : -1;
      peak = std::max(peak, now);
    }
    return peak;
  }
  /// The largest peak_in_flight(s) over the stages.
  int peak_in_flight() const {
    int peak = 0;
    for (int s = 0; s < stages(); ++s) peak = std::max(peak, peak_in_flight(s));
    return peak;
  }

  /// Plays the schedule: each stage runs its actions in order, a forward of
  /// stage s > 0 no earlier than stage s - 1 ends that micro-batch's forward,
  /// a backward of stage s < S - 1 no earlier than stage s + 1 ends its
  /// backward; forward_cost[s] and backward_cost[s] are stage s's pass
  /// times, and messages take no time. Throws if the schedule deadlocks,
  /// naming the stages that wait and for what.
  Simulation simulate(const std::vector<double>& forward_cost, const std::vector<double>& backward_cost) const {
    const auto S = static_cast<std::size_t>(stages());
    const auto M = static_cast<std::size_t>(micro_batches_);
    PARALLAX_EXPECTS(forward_cost.size() == S && backward_cost.size() == S, "Schedule::simulate: needs ", S,
                     " forward and backward costs, got ", forward_cost.size(), " and ", backward_cost.size());
    constexpr double unknown = -1;
    std::vector<std::vector<double>> f_end(S, std::vector<double>(M, unknown)), b_end = f_end;
    Simulation sim;
    sim.start.resize(S);
    sim.end.resize(S);
    sim.busy.assign(S, 0);
    std::vector<std::size_t> next(S, 0);
    std::vector<double> free_at(S, 0);
    for (bool progress = true; progress;) {
      progress = false;
      for (std::size_t s = 0; s < S; ++s) {
        const auto& list = actions_[s];
        while (next[s] < list.size()) {
          const Action& a = list[next[s]];
          const auto m = static_cast<std::size_t>(a.micro);
          double ready = 0;
          if (a.pass == Pass::forward && s > 0) ready = f_end[s - 1][m];
          if (a.pass == Pass::backward && s + 1 < S) ready = b_end[s + 1][m];
          if (ready == unknown) break;
          const double begin = std::max(free_at[s], ready);
          const double cost = a.pass == Pass::forward ? forward_cost[s] : backward_cost[s];
          free_at[s] = begin + cost;
          (a.pass == Pass::forward ? f_end : b_end)[s][m] = free_at[s];
          sim.start[s].push_back(begin);
          sim.end[s].push_back(free_at[s]);
          sim.busy[s] += cost;
          sim.makespan = std::max(sim.makespan, free_at[s]);
          ++next[s];
          progress = true;
        }
      }
    }
    std::ostringstream stuck;
    for (std::size_t s = 0; s < S; ++s)
      if (next[s] < actions_[s].size()) {
        const Action& a = actions_[s][next[s]];
        stuck << (stuck.tellp() > 0 ? "; " : "") << "stage " << s << " waits in " << to_string(a) << " for stage "
              << (a.pass == Pass::forward ? s - 1 : s + 1) << "'s " << to_string(a);
      }
    PARALLAX_EXPECTS(stuck.str().empty(), "schedule '", name_, "' deadlocks: ", stuck.str());
    return sim;
  }

  /// One line per stage: "stage 0: F0 F1 B1 B0".
  std::string describe() const {
    std::ostringstream os;
    for (int s = 0; s < stages(); ++s) {
      os << "stage " << s << ":";
      for (const Action& a : actions(s)) os << " " << to_string(a);
      os << "\n";
    }
    return os.str();
  }

  friend bool operator==(const Schedule& a, const Schedule& b) {
    return a.micro_batches_ == b.micro_batches_ && a.actions_ == b.actions_;
  }

 private:
  static void check_sizes(int stages, int micro_batches) {
    PARALLAX_EXPECTS(stages >= 1, "a pipeline schedule needs at least one stage, got ", stages);
    PARALLAX_EXPECTS(micro_batches >= 1, "a pipeline schedule needs at least one micro-batch, got ", micro_batches);
  }

  std::string name_;
  int micro_batches_ = 1;
  std::vector<std::vector<Action>> actions_;
};

/// GPipe's bubble fraction with balanced stages: (S - 1) / (M + S - 1).
inline double gpipe_bubble_fraction(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

}  // namespace parallax::pipeline
