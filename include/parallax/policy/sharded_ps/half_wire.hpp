#pragma once
/// @file
/// Float rows on a 16-bit wire (TrainerOptions::compress): what ShardedPS's
/// compressed exchanges share. A table group's pushes and a BagPool's bag
/// gradients travel as a HalfLane (rows narrowed where they leave, widened
/// where they land); lookup replies and pooled bag replies as a HalfReply
/// over the route that brought the asks. Rounding is to nearest even; the
/// widening back is exact.

#include <parallax/detail/algorithms.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/half.hpp>
#include <parallax/options.hpp>
#include <parallax/policy/sharded_ps/group_routes.hpp>
#include <parallax/policy/sharded_ps/row_exchange.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace parallax::policy::sharded {

/// Calls f(W{}) with W the wire type `c` names (bf16 or fp16; not none).
template <class F>
decltype(auto) with_wire(Compression c, F&& f) {
  if (c == Compression::bf16) return f(bf16{});
  return f(fp16{});
}

/// A route lane of rows of T sent in the 16 bits `compress` names: plan()
/// narrows them, the route carries them, received_values() widens them.
template <class T, class Engine>
class HalfLane {
 public:
  using space = engine::space_of_t<Engine>;

  explicit HalfLane(Engine& engine) : engine_(&engine), bf16_(engine), fp16_(engine) {}
  HalfLane(const HalfLane&) = delete;
  HalfLane& operator=(const HalfLane&) = delete;

  /// Ids as 32-bit offsets (RowExchange::narrow_ids), or at 8 bytes.
  void narrow_ids(bool narrow, std::size_t span) {
    if (narrow) {
      bf16_.narrow_ids(span);
      fp16_.narrow_ids(span);
    } else {
      bf16_.wide_ids();
      fp16_.wide_ids();
    }
  }

  /// No ids on the wire (RowExchange::omit_ids).
  void omit_ids() noexcept {
    bf16_.omit_ids();
    fp16_.omit_ids();
  }

  /// RowExchange::plan() of k rows narrowed to `compress`'s type. The ids
  /// must stay valid until the route; the rows are read here.
  RouteLane& plan(Compression compress, const index_t* ids, detail::RowsAt<T> rows, const std::int32_t* dest, std::size_t k,
                  std::size_t cols) {
    compress_ = compress;
    cols_ = cols;
    return with_wire(compress, [&](auto w) -> RouteLane& {
      using W = decltype(w);
      auto& ex = engine_->exec();
      narrow_.resize_discard(k * cols * sizeof(W));
      W* out = reinterpret_cast<W*>(narrow_.data());
      if (k && cols) for_each_rows(ex, k, cols, ConvertRows<W, T>{rows, out, cols});
      ex.synchronize();
      auto& wire = exchange<W>();
      wire.plan(ids, detail::RowsAt<W>(out), dest, k, cols);
      return wire;
    });
  }

  /// The rows the route brought, by source rank: their ids, and their
  /// values widened to T (valid until the next call).
  std::size_t received() { return with_wire(compress_, [&](auto w) { return exchange<decltype(w)>().received(); }); }
  const index_t* received_ids() {
    return with_wire(compress_, [&](auto w) { return exchange<decltype(w)>().received_ids(); });
  }
  detail::RowsAt<T> received_values() {
    with_wire(compress_, [&](auto w) {
      using W = decltype(w);
      auto& ex = engine_->exec();
      auto& wire = exchange<W>();
      const std::size_t k = wire.received();
      widened_.resize_discard(k * cols_);
      if (k && cols_) for_each_rows(ex, k, cols_, ConvertRows<T, W>{wire.received_values(), widened_.data(), cols_});
      ex.synchronize();
    });
    return detail::RowsAt<T>(widened_.data());
  }

 private:
  template <class W>
  RowExchange<W, Engine>& exchange() {
    if constexpr (std::is_same_v<W, bf16>) return bf16_;
    else return fp16_;
  }

  Engine* engine_;
  Compression compress_ = Compression::bf16;
  std::size_t cols_ = 0;
  RowExchange<bf16, Engine> bf16_;
  RowExchange<fp16, Engine> fp16_;
  Buffer<std::byte, space> narrow_;
  Buffer<T, space> widened_;
};

/// A reply in 16 bits to the rows a RowExchange's route brought (a lookup's
/// asks, a bag's segments): start() has fill(W* out) write the reply rows as
/// W and starts it, finish() widens what came back.
template <class T, class Engine>
class HalfReply {
 public:
  using space = engine::space_of_t<Engine>;

  /// Starts the reply of `rows` rows of `cols` (the rows the route brought
  /// `exchange`), written by fill(W*) in the wire type `compress` names.
  /// In flight where the engine can (RowExchange::start_reply_in).
  template <class X, class Fill>
  void start(Compression compress, RowExchange<X, Engine>& exchange, std::size_t rows, std::size_t cols, Fill&& fill) {
    compress_ = compress;
    with_wire(compress, [&](auto w) {
      using W = decltype(w);
      served_.resize_discard(rows * cols * sizeof(W));
      W* out = reinterpret_cast<W*>(served_.data());
      fill(out);
      landed_ = exchange.start_reply_in(static_cast<const W*>(out), cols, landing_);
    });
  }
  /// The n rows of `cols` that came back (after the engine's
  /// wait_started(), where it has one), widened to T at `into` (room for
  /// n x cols), or in a buffer of its own when `into` is null.
  const T* finish(std::size_t n, std::size_t cols, const Exec<space>& ex, T* into = nullptr) {
    T* out = into ? into : (widened_.resize_discard(n * cols), widened_.data());
    with_wire(compress_, [&](auto w) {
      using W = decltype(w);
      if (n * cols != 0) for_each(ex, n * cols, detail::Convert<T, W>{static_cast<const W*>(landed_), out});
    });
    ex.synchronize();
    return out;
  }

 private:
  Compression compress_ = Compression::bf16;
  Buffer<std::byte, space> served_, landing_;
  const void* landed_ = nullptr;
  Buffer<T, space> widened_;
};

}  // namespace parallax::policy::sharded
