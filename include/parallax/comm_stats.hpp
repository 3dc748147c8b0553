#pragma once
/// @file
/// Byte accounting. Every engine call adds the bytes this rank sends and
/// receives, split by whether the peer is on the same host, to the entry of
/// the (variable, policy) pair in scope; a call that carries several
/// variables (a fused all-reduce, one route for many tables) is shared among
/// them. Tests assert these counts exactly; benchmarks report them. This is
/// how a policy's advantage shows on a machine without a network.

#include <cstdint>
#include <iomanip>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace parallax {

/// Bytes and calls of one (variable, policy) pair, or a sum of several.
struct Traffic {
  std::uint64_t sent_intra = 0;  ///< to peers on this rank's host
  std::uint64_t sent_inter = 0;  ///< to peers on other hosts
  std::uint64_t recv_intra = 0;
  std::uint64_t recv_inter = 0;
  std::uint64_t calls = 0;  ///< engine calls (collectives and point-to-point)

  std::uint64_t sent() const noexcept { return sent_intra + sent_inter; }
  std::uint64_t received() const noexcept { return recv_intra + recv_inter; }
  Traffic& operator+=(const Traffic& o) noexcept {
    sent_intra += o.sent_intra;
    sent_inter += o.sent_inter;
    recv_intra += o.recv_intra;
    recv_inter += o.recv_inter;
    calls += o.calls;
    return *this;
  }
  friend Traffic operator-(Traffic a, const Traffic& b) noexcept {
    a.sent_intra -= b.sent_intra;
    a.sent_inter -= b.sent_inter;
    a.recv_intra -= b.recv_intra;
    a.recv_inter -= b.recv_inter;
    a.calls -= b.calls;
    return a;
  }
  friend bool operator==(const Traffic& a, const Traffic& b) noexcept {
    return a.sent_intra == b.sent_intra && a.sent_inter == b.sent_inter && a.recv_intra == b.recv_intra &&
           a.recv_inter == b.recv_inter && a.calls == b.calls;
  }
};

/// Per-rank byte counts, keyed by (variable, policy).
///
/// The label in force is set by a Scope; calls outside any scope are booked
/// under variable "" and policy "". Calls that carry several variables at
/// once are booked through a Shared scope, which divides their bytes among
/// the variables: every byte the engine moved is booked exactly once, so
/// total() is what the engine sent and received. A shared call counts as a
/// call of each variable it carries (`Traffic::calls` of a variable: the
/// calls that moved some of it); total().calls counts engine calls. Not
/// thread-safe: one engine, one thread.
class CommStats {
 public:
  using Key = std::pair<std::string, std::string>;  // (variable, policy)
  using Entry = std::map<Key, Traffic>::value_type;

  /// Books engine calls under (variable, policy) until destroyed, then restores
  /// the previous label. Scopes nest.
  class Scope {
   public:
    Scope(CommStats& stats, std::string_view variable, std::string_view policy)
        : stats_(&stats), previous_(stats.current_) {
      stats.current_ = &*stats.entries_.try_emplace(Key{std::string(variable), std::string(policy)}).first;
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope() { stats_->current_ = previous_; }

   private:
    CommStats* stats_;
    Entry* previous_;
  };

  /// Books engine calls that carry several variables of one policy: while
  /// it lives, calls are counted aside; when it ends, their bytes are
  /// divided among the variables named by part(), each field (sent and
  /// received, intra and inter host) in proportion to the part's weight in
  /// it, rounding so that the shares sum to the count exactly; every part
  /// counts each call. Parts may be named before or after the calls (a
  /// route learns what it carried when it arrives). Without parts the
  /// bytes go to ("", policy). Scopes opened inside book to their own entry.
  class Shared {
   public:
    Shared(CommStats& stats, std::string_view policy)
        : stats_(&stats), previous_(stats.current_), policy_(policy), unnamed_(&stats.entry(Key{"", policy_})),
          pending_(Key{"", policy_}, Traffic{}) {
      stats.current_ = &pending_;
    }
    Shared(const Shared&) = delete;
    Shared& operator=(const Shared&) = delete;
    ~Shared() {
      stats_->current_ = previous_;
      const Traffic& t = pending_.second;
      if (parts_.empty()) {
        unnamed_->second += t;
        return;
      }
      using Field = std::uint64_t Traffic::*;
      for (Field f : {&Traffic::sent_intra, &Traffic::sent_inter, &Traffic::recv_intra, &Traffic::recv_inter}) {
        // Weights are proportions: shifted down to 32 bits, so that
        // count % total * cumulative fits 64 bits.
        std::uint64_t total_weight = 0;
        int shift = 0;
        for (const auto& p : parts_) total_weight += p.weight.*f >> shift;
        while (total_weight > 0xFFFFFFFFu) {
          ++shift;
          total_weight = 0;
          for (const auto& p : parts_) total_weight += p.weight.*f >> shift;
        }
        const bool even = total_weight == 0;  // nothing to weigh by: equal shares
        if (even) total_weight = parts_.size();
        const std::uint64_t count = t.*f, whole = count / total_weight, rest = count % total_weight;
        std::uint64_t cumulative = 0, given = 0;
        for (const auto& p : parts_) {
          cumulative += even ? 1 : p.weight.*f >> shift;
          const std::uint64_t upto = whole * cumulative + rest * cumulative / total_weight;
          p.entry->second.*f += upto - given;
          given = upto;
        }
      }
      for (const auto& p : parts_) p.entry->second.calls += t.calls;
    }
    /// A variable the calls carry, and its weight: the bytes (or rows) it
    /// puts in them, per field. A variable named twice adds up.
    void part(std::string_view variable, const Traffic& weight) {
      Entry* e = &stats_->entry(Key{std::string(variable), policy_});
      for (auto& p : parts_)
        if (p.entry == e) {
          p.weight += weight;
          return;
        }
      parts_.push_back(Part{e, weight});
    }
    /// part() with one weight for every field.
    void part(std::string_view variable, std::uint64_t weight) {
      part(variable, Traffic{weight, weight, weight, weight, 0});
    }

   private:
    struct Part {
      Entry* entry;
      Traffic weight;
    };
    CommStats* stats_;
    Entry* previous_;
    std::string policy_;
    Entry* unnamed_;  // where bytes go when no part is named
    Entry pending_;
    std::vector<Part> parts_;
  };

  CommStats() : current_(&*entries_.try_emplace(Key{}).first) {}
  CommStats(const CommStats&) = delete;
  CommStats& operator=(const CommStats&) = delete;

  [[nodiscard]] Scope scope(std::string_view variable, std::string_view policy) {
    return Scope(*this, variable, policy);
  }
  /// A Shared scope for calls of `policy` that carry several variables.
  [[nodiscard]] Shared shared(std::string_view policy) { return Shared(*this, policy); }

  /// Books `bytes` sent to a peer (on this host or not).
  void add_sent(std::uint64_t bytes, bool same_host) noexcept {
    (same_host ? current_->second.sent_intra : current_->second.sent_inter) += bytes;
  }
  void add_received(std::uint64_t bytes, bool same_host) noexcept {
    (same_host ? current_->second.recv_intra : current_->second.recv_inter) += bytes;
  }
  void add_call() noexcept {
    ++current_->second.calls;
    ++calls_;
  }
  /// The (variable, policy) label calls are booked under now.
  const Key& current() const noexcept { return current_->first; }

  /// Everything booked: every byte the engine moved, and its calls.
  Traffic total() const {
    Traffic t;
    for (const auto& [key, traffic] : entries_) t += traffic;
    t.calls = calls_;
    return t;
  }
  /// Everything booked under this variable, all policies.
  Traffic variable(std::string_view name) const {
    Traffic t;
    for (const auto& [key, traffic] : entries_)
      if (key.first == name) t += traffic;
    return t;
  }
  /// Everything booked under this policy, all variables (a call shared by
  /// several of them counts once for each).
  Traffic policy(std::string_view name) const {
    Traffic t;
    for (const auto& [key, traffic] : entries_)
      if (key.second == name) t += traffic;
    return t;
  }
  Traffic get(std::string_view variable, std::string_view policy) const {
    auto it = entries_.find(Key{std::string(variable), std::string(policy)});
    return it == entries_.end() ? Traffic{} : it->second;
  }
  const std::map<Key, Traffic>& entries() const noexcept { return entries_; }

  /// Zeroes every count (the labels stay).
  void reset() noexcept {
    for (auto& [key, traffic] : entries_) traffic = Traffic{};
    calls_ = 0;
  }

  /// A table of the non-empty entries, one line each.
  std::string report() const {
    std::ostringstream os;
    os << std::left << std::setw(20) << "variable" << std::setw(16) << "policy" << std::right << std::setw(14)
       << "sent" << std::setw(14) << "received" << std::setw(14) << "sent inter" << std::setw(8) << "calls"
       << "\n";
    for (const auto& [key, t] : entries_) {
      if (t.calls == 0) continue;
      os << std::left << std::setw(20) << (key.first.empty() ? "-" : key.first) << std::setw(16)
         << (key.second.empty() ? "-" : key.second) << std::right << std::setw(14) << t.sent() << std::setw(14)
         << t.received() << std::setw(14) << t.sent_inter << std::setw(8) << t.calls << "\n";
    }
    return os.str();
  }

 private:
  Entry& entry(Key key) { return *entries_.try_emplace(std::move(key)).first; }

  std::map<Key, Traffic> entries_;  // node-based: pointers to entries stay valid
  Entry* current_;
  std::uint64_t calls_ = 0;  // engine calls, each once
};

}  // namespace parallax
