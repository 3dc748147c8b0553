#pragma once
/// @file
/// Lookups ahead (Trainer::prefetch, Trainer::rows): the handle a user
/// holds, Prefetched<V>, and the trainer's record of the one prefetch in
/// flight, which rows() takes once and restore() cancels.

#include <parallax/bags.hpp>
#include <parallax/error.hpp>
#include <parallax/policy/policy.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace parallax {

namespace trainer {
class Prefetches;
}

/// A batched lookup of sparse variables of type V started ahead by
/// Trainer::prefetch(), whose rows Trainer::rows() takes, once. Move-only;
/// empty when default-made or moved from.
template <class V>
class Prefetched {
 public:
  Prefetched() = default;
  Prefetched(Prefetched&& o) noexcept
      : trainer_(std::exchange(o.trainer_, nullptr)), serial_(std::exchange(o.serial_, 0)),
        taken_(std::exchange(o.taken_, false)) {}
  Prefetched& operator=(Prefetched&& o) noexcept {
    trainer_ = std::exchange(o.trainer_, nullptr);
    serial_ = std::exchange(o.serial_, 0);
    taken_ = std::exchange(o.taken_, false);
    return *this;
  }
  Prefetched(const Prefetched&) = delete;
  Prefetched& operator=(const Prefetched&) = delete;

  /// Whether it holds a prefetch whose rows have not been taken.
  bool pending() const noexcept { return trainer_ != nullptr && !taken_; }

 private:
  friend class trainer::Prefetches;
  Prefetched(const void* trainer, std::uint64_t serial) : trainer_(trainer), serial_(serial) {}

  const void* trainer_ = nullptr;  // the trainer that made it
  std::uint64_t serial_ = 0;       // its number among that trainer's prefetches
  bool taken_ = false;
};

namespace trainer {

/// A trainer's prefetches, numbered from 1: the one in flight (0: none),
/// its synchronizer and variables; the last one cancelled, what and by what.
class Prefetches {
 public:
  explicit Prefetches(const void* trainer) : trainer_(trainer) {}

  /// Throws if a prefetch is in flight (one at a time).
  void check_free() const {
    PARALLAX_EXPECTS(in_flight_ == 0, "prefetch(): the prefetch of ", in_flight_what_,
                     " is in flight; take its rows with rows() first (one prefetch at a time)");
  }
  /// Records a prefetch of `batch`, started on synchronizer `synchronizer`.
  template <class V>
  Prefetched<V> started(const Lookup<V>* batch, std::size_t count, std::size_t synchronizer,
                        const Bags<V>* bags = nullptr, std::size_t bag_count = 0) {
    in_flight_ = ++prefetches_;
    synchronizer_ = synchronizer;
    in_flight_what_.clear();
    for (std::size_t i = 0; i < count; ++i) in_flight_what_ += detail::concat(i ? ", '" : "'", batch[i].var->name(), "'");
    for (std::size_t i = 0; i < bag_count; ++i)
      in_flight_what_ += detail::concat(i || count ? ", bags of '" : "bags of '", bags[i].var->name(), "'");
    if (count + bag_count == 0) in_flight_what_ = "no variables";
    return Prefetched<V>(trainer_, in_flight_);
  }
  /// Takes `p`'s rows' turn: throws, naming why, unless `p` is this
  /// trainer's prefetch in flight. Afterwards none is in flight.
  template <class V>
  void take(Prefetched<V>& p) {
    PARALLAX_EXPECTS(p.trainer_ != nullptr, "rows(): this Prefetched holds no prefetch (it was made empty, or moved from)");
    PARALLAX_EXPECTS(p.trainer_ == trainer_, "rows(): this prefetch was made by another Trainer");
    PARALLAX_EXPECTS(!p.taken_, "rows(): the rows of this prefetch were taken already; rows() takes them once "
                                "(prefetch again, or look up)");
    PARALLAX_EXPECTS(p.serial_ != cancelled_, "rows(): this prefetch (of ", cancelled_what_, ") was cancelled by ",
                     cancelled_by_, "; prefetch its batch again");
    PARALLAX_EXPECTS(p.serial_ == in_flight_, "rows(): this prefetch is no longer in flight");
    p.taken_ = true;
    in_flight_ = 0;
  }
  /// Cancels the prefetch in flight, `by` what; returns its synchronizer
  /// (whose lookup ahead the caller cancels), or nothing if none was.
  std::optional<std::size_t> cancel(std::string by) {
    if (in_flight_ == 0) return std::nullopt;
    cancelled_ = std::exchange(in_flight_, 0);
    cancelled_what_ = in_flight_what_;
    cancelled_by_ = std::move(by);
    return synchronizer_;
  }

 private:
  const void* trainer_;
  std::uint64_t prefetches_ = 0, in_flight_ = 0, cancelled_ = 0;
  std::size_t synchronizer_ = 0;
  std::string in_flight_what_, cancelled_what_, cancelled_by_;
};

}  // namespace trainer
}  // namespace parallax
