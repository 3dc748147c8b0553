#pragma once
/// @file
/// RingAllReduce machinery: the segmented ring all-reduce over an engine's
/// point-to-point messages (tensor fusion's buckets: fusion.hpp).
///
/// The ring runs over a *view*: one contiguous buffer, or many tensors laid
/// end to end (tensor fusion). Over tensors, a segment that lies in one tensor
/// (or in a run of tensors adjacent in memory) is sent from, or received into,
/// it directly; one that straddles tensors is packed into, or unpacked from, a
/// segment-sized buffer, packed while the previous segment travels; the
/// reduction adds into the tensors where they lie. So fusion makes no bulk
/// copy of a bucket before and after the ring.

#include <parallax/detail/ring.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/error.hpp>
#include <parallax/options.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace parallax {

/// One gradient handed to tensor fusion, and the variable it belongs to
/// (its bytes are booked to it; null: to the scope in force).
struct TensorRef {
  void* data = nullptr;
  std::size_t count = 0;
  DataType type = DataType::f32;
  const char* label = nullptr;
};

namespace detail {
template <class T>
struct AddInto {
  T* dst;
  const T* src;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i) const { dst[i] += src[i]; }
};

/// A ring view of one contiguous buffer: every range is a span of it, so the
/// ring sends and receives in place and never packs.
template <class T>
class ContiguousView {
 public:
  using value_type = T;
  static constexpr bool contiguous = true;
  explicit ContiguousView(T* data) noexcept : data_(data) {}
  /// Elements [begin, begin + n) as one pointer.
  T* span(std::size_t begin, std::size_t) const noexcept { return data_ + begin; }
  template <class Space>
  void add(const Exec<Space>& ex, std::size_t begin, const T* src, std::size_t n) const {
    for_each(ex, n, AddInto<T>{data_ + begin, src});
  }

 private:
  T* data_;
};

/// A ring view of tensors laid end to end (a fusion bucket), without copying
/// them: element i of the view lives in the piece (a tensor, or a run of
/// tensors adjacent in memory) whose range holds i.
template <class T>
class PieceView {
 public:
  using value_type = T;
  static constexpr bool contiguous = false;
  /// `tensors` all hold elements of type T; empty ones are skipped, and a
  /// tensor that starts where the previous one ends joins it (gradients
  /// allocated from one arena then cost no packing at all).
  PieceView(const TensorRef* tensors, std::size_t n) {
    starts_.push_back(0);
    for (std::size_t i = 0; i < n; ++i) {
      if (tensors[i].count == 0) continue;
      T* data = static_cast<T*>(tensors[i].data);
      const bool adjacent = !pieces_.empty() && pieces_.back() + (starts_.back() - starts_[starts_.size() - 2]) == data;
      if (!adjacent) {
        pieces_.push_back(data);
        starts_.push_back(starts_.back());
      }
      starts_.back() += tensors[i].count;
    }
  }
  /// How many pieces (runs of tensors adjacent in memory) the view has.
  std::size_t pieces() const noexcept { return pieces_.size(); }
  std::size_t size() const noexcept { return starts_.back(); }

  /// Elements [begin, begin + n) as one pointer if one piece holds them all,
  /// else nullptr.
  T* span(std::size_t begin, std::size_t n) const noexcept {
    if (begin >= size()) return nullptr;
    const std::size_t p = piece_of(begin);
    if (begin + n > starts_[p + 1]) return nullptr;
    return pieces_[p] + (begin - starts_[p]);
  }
  /// The view's [begin, begin + n) += src[0..n), piece by piece.
  template <class Space>
  void add(const Exec<Space>& ex, std::size_t begin, const T* src, std::size_t n) const {
    for_pieces(begin, n, [&](T* p, std::size_t off, std::size_t len) { for_each(ex, len, AddInto<T>{p, src + off}); });
  }
  /// Packs the view's [begin, begin + n) into dst.
  template <class Space>
  void gather(const Exec<Space>& ex, T* dst, std::size_t begin, std::size_t n) const {
    for_pieces(begin, n, [&](T* p, std::size_t off, std::size_t len) { ex.copy(dst + off, p, len * sizeof(T)); });
  }
  /// Unpacks src[0..n) into the view's [begin, begin + n).
  template <class Space>
  void scatter(const Exec<Space>& ex, std::size_t begin, const T* src, std::size_t n) const {
    for_pieces(begin, n, [&](T* p, std::size_t off, std::size_t len) { ex.copy(p, src + off, len * sizeof(T)); });
  }

 private:
  /// The piece holding element i (i < size()).
  std::size_t piece_of(std::size_t i) const noexcept {
    return static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), i) - starts_.begin()) - 1;
  }
  /// Calls f(piece pointer, offset within the range, length) for each piece's
  /// part of [begin, begin + n), in order.
  template <class F>
  void for_pieces(std::size_t begin, std::size_t n, F&& f) const {
    if (n == 0) return;
    const std::size_t end = begin + n;
    for (std::size_t p = piece_of(begin); p < pieces_.size() && starts_[p] < end; ++p) {
      const std::size_t lo = std::max(begin, starts_[p]), hi = std::min(end, starts_[p + 1]);
      f(pieces_[p] + (lo - starts_[p]), lo - begin, hi - lo);
    }
  }

  std::vector<T*> pieces_;
  std::vector<std::size_t> starts_;  // starts_[p]: first element of piece p; back(): size
};
}  // namespace detail

/// Sums buffers over all ranks of an engine, in place.
///
/// The ring sends 2(N-1)/N of the buffer per rank whatever N is; each
/// reduce-scatter step moves one chunk in segments, double-buffered, so a
/// segment is reduced while it is still in cache. The sum of each element is
/// taken in a fixed order for a given N (bit-for-bit repeatable), and every
/// rank ends with identical bits; fused tensors get the same bits as one
/// contiguous buffer holding them.
template <class Engine>
class RingAllReducer {
 public:
  using space = engine::space_of_t<Engine>;

  explicit RingAllReducer(Engine& engine, RingOptions options = {}) : engine_(&engine), options_(options) {
    PARALLAX_EXPECTS(options_.segment_bytes >= 64, "RingOptions::segment_bytes must be at least 64, got ",
                     options_.segment_bytes);
    oversubscribed_ = engine.topology().oversubscribed();
  }

  const RingOptions& options() const noexcept { return options_; }
  Engine& engine() noexcept { return *engine_; }
  /// This rank's host runs more ranks than it has hardware threads.
  bool oversubscribed() const noexcept { return oversubscribed_; }

  /// The algorithm automatic picks for a buffer of this many bytes.
  engine::Algorithm choose(std::size_t bytes) const noexcept {
    if (options_.algorithm != engine::Algorithm::automatic) return options_.algorithm;
    if (engine_->size() == 1 || bytes < options_.native_below_bytes) return engine::Algorithm::native;
    if (options_.adapt_to_oversubscription && oversubscribed_) return engine::Algorithm::native;
    // Device memory: NCCL's all-reduce is its own ring on the GPUs' links,
    // and MpiStaged's stages the buffer once around one MPI_Allreduce, where
    // this ring would stage every segment through pinned memory
    // (docs/benchmarks.md, "All-reduce of a device buffer").
    if constexpr (!std::is_same_v<space, HostSpace>) return engine::Algorithm::native;
    return engine::Algorithm::ring;
  }

  /// data[0..count) = sum over ranks of data[0..count).
  template <class T>
  void allreduce(T* data, std::size_t count) {
    if (engine_->size() == 1 || count == 0) return;  // nothing to exchange
    if (choose(count * sizeof(T)) == engine::Algorithm::native) {
      engine_->allreduce(data, data, count, data_type_of_v<T>, ReduceOp::sum);
    } else {
      detail::ContiguousView<T> view(data);
      ring(view, count);
    }
  }

  /// Untyped entry, for fused buckets.
  void allreduce(void* data, std::size_t count, DataType t) {
    switch (t) {
      case DataType::f32: return allreduce(static_cast<float*>(data), count);
      case DataType::f64: return allreduce(static_cast<double*>(data), count);
      case DataType::i32: return allreduce(static_cast<std::int32_t*>(data), count);
      case DataType::i64: return allreduce(static_cast<std::int64_t*>(data), count);
      case DataType::u8: break;
    }
    throw error(detail::concat("RingAllReduce: cannot sum elements of type ", to_string(t)));
  }

  /// Sums `n` tensors of one type over the ranks, in place, with the ring run
  /// over them as if they were one buffer laid end to end, without copying
  /// them into one (tensor fusion). Always the ring, whatever `choose` says:
  /// the caller has decided (FusedAllReducer takes the engine's all-reduce on
  /// a packed copy where `choose` prefers native).
  void ring_allreduce(const TensorRef* tensors, std::size_t n) {
    if (n == 0) return;
    const DataType t = tensors[0].type;
    for (std::size_t i = 1; i < n; ++i)
      PARALLAX_EXPECTS(tensors[i].type == t, "RingAllReduce: fused tensors must share one type, got ",
                       to_string(t), " and ", to_string(tensors[i].type));
    switch (t) {
      case DataType::f32: return ring_pieces<float>(tensors, n);
      case DataType::f64: return ring_pieces<double>(tensors, n);
      case DataType::i32: return ring_pieces<std::int32_t>(tensors, n);
      case DataType::i64: return ring_pieces<std::int64_t>(tensors, n);
      case DataType::u8: break;
    }
    throw error(detail::concat("RingAllReduce: cannot sum elements of type ", to_string(t)));
  }

 private:
  template <class T>
  void ring_pieces(const TensorRef* tensors, std::size_t n) {
    if (engine_->size() == 1) return;
    detail::PieceView<T> view(tensors, n);
    if (view.size() == 0) return;
    ring(view, view.size());
  }

  /// The ring over a view of `count` elements: reduce-scatter, then all-gather.
  template <class View>
  void ring(const View& view, std::size_t count) {
    using T = typename View::value_type;
    const int n = engine_->size(), me = engine_->rank();
    const int right = detail::ring::mod(me + 1, n), left = detail::ring::mod(me - 1, n);
    const DataType dt = data_type_of_v<T>;
    auto& ex = engine_->exec();

    // Every rank cuts every chunk into the same number of segments, so a
    // sender's segment g is its receiver's segment g.
    // On an oversubscribed host ranks take turns on the cores, so a segment
    // does not travel while another is added, and every segment is one more
    // wait for a descheduled neighbour: each chunk goes whole.
    const std::size_t max_chunk = detail::ring::chunk_count(count, n, 0);
    const std::size_t seg_elems =
        options_.adapt_to_oversubscription && oversubscribed_
            ? std::max<std::size_t>(1, max_chunk)
            : std::max<std::size_t>(1, options_.segment_bytes / sizeof(T));
    const std::size_t segments = std::max<std::size_t>(1, (max_chunk + seg_elems - 1) / seg_elems);
    const std::size_t seg_cap = (max_chunk + segments - 1) / segments;  // largest segment
    // Two landing buffers; over tensors also two packing buffers for segments
    // that straddle tensors.
    const std::size_t buffers = View::contiguous ? 2 : 4;
    scratch_.resize_discard(buffers * seg_cap * sizeof(T));
    T* base = reinterpret_cast<T*>(scratch_.data());
    T* land[2] = {base, base + seg_cap};
    T* pack[2] = {View::contiguous ? nullptr : base + 2 * seg_cap, View::contiguous ? nullptr : base + 3 * seg_cap};
    auto seg_begin = [&](std::size_t chunk_elems, std::size_t g) { return g * chunk_elems / segments; };
    // Segment [b, b + len) of the view as a pointer to send from: the view
    // itself, or packed into pack[g & 1]. Called for segment g + 1 before
    // waiting for segment g, so the packing overlaps the transfer in flight
    // (pack[(g + 1) & 1] is free: segment g - 1's send has completed).
    auto source = [&](std::size_t g, std::size_t b, std::size_t len) -> const T* {
      if constexpr (View::contiguous) {
        return view.span(b, len);
      } else {
        if (T* p = view.span(b, len)) return p;
        view.gather(ex, pack[g & 1], b, len);
        ex.synchronize();  // the engine reads it next
        return pack[g & 1];
      }
    };

    // Reduce-scatter: segment g of the chunk from the left lands in land[g & 1]
    // and is added into the view while segment g + 1 travels.
    for (int s = 0; s < n - 1; ++s) {
      const int cs = detail::ring::rs_send(me, n, s), cr = detail::ring::rs_send(left, n, s);
      const std::size_t so = detail::ring::chunk_offset(count, n, cs), ro = detail::ring::chunk_offset(count, n, cr);
      const std::size_t sc = detail::ring::chunk_count(count, n, cs), rc = detail::ring::chunk_count(count, n, cr);
      auto prepare = [&](std::size_t g) {
        const std::size_t s0 = seg_begin(sc, g), s1 = seg_begin(sc, g + 1);
        return source(g, so + s0, s1 - s0);
      };
      auto start = [&](std::size_t g, const T* from) {
        const std::size_t s0 = seg_begin(sc, g), s1 = seg_begin(sc, g + 1);
        const std::size_t r0 = seg_begin(rc, g), r1 = seg_begin(rc, g + 1);
        return engine_->start_sendrecv(from, s1 - s0, right, land[g & 1], r1 - r0, left, dt);
      };
      auto pending = start(0, prepare(0));
      for (std::size_t g = 0; g < segments; ++g) {
        const T* next = g + 1 < segments ? prepare(g + 1) : nullptr;
        engine_->wait(pending);
        const std::size_t r0 = seg_begin(rc, g), r1 = seg_begin(rc, g + 1);
        if (g + 1 < segments) pending = start(g + 1, next);
        view.add(ex, ro + r0, land[g & 1], r1 - r0);
        if (g + 1 < segments) ex.synchronize();  // the buffer is reused two segments on
      }
      ex.synchronize();
    }

    // All-gather: the reduced chunks travel round the ring once more. A
    // contiguous buffer sends and receives each chunk in one message, in
    // place; over tensors, segment by segment, straight into a tensor where
    // the segment lies in one, else through land[g & 1].
    for (int s = 0; s < n - 1; ++s) {
      const int cs = detail::ring::ag_send(me, n, s), cr = detail::ring::ag_send(left, n, s);
      const std::size_t so = detail::ring::chunk_offset(count, n, cs), ro = detail::ring::chunk_offset(count, n, cr);
      const std::size_t sc = detail::ring::chunk_count(count, n, cs), rc = detail::ring::chunk_count(count, n, cr);
      if constexpr (View::contiguous) {
        engine_->sendrecv(view.span(so, sc), sc, right, view.span(ro, rc), rc, left, dt);
      } else {
        T* direct[2] = {nullptr, nullptr};
        auto prepare = [&](std::size_t g) {
          const std::size_t s0 = seg_begin(sc, g), s1 = seg_begin(sc, g + 1);
          return source(g, so + s0, s1 - s0);
        };
        auto start = [&](std::size_t g, const T* from) {
          const std::size_t s0 = seg_begin(sc, g), s1 = seg_begin(sc, g + 1);
          const std::size_t r0 = seg_begin(rc, g), r1 = seg_begin(rc, g + 1);
          direct[g & 1] = view.span(ro + r0, r1 - r0);
          T* into = direct[g & 1] ? direct[g & 1] : land[g & 1];
          return engine_->start_sendrecv(from, s1 - s0, right, into, r1 - r0, left, dt);
        };
        auto pending = start(0, prepare(0));
        for (std::size_t g = 0; g < segments; ++g) {
          const T* next = g + 1 < segments ? prepare(g + 1) : nullptr;
          engine_->wait(pending);
          const std::size_t r0 = seg_begin(rc, g), r1 = seg_begin(rc, g + 1);
          const bool landed = direct[g & 1] == nullptr;
          if (g + 1 < segments) pending = start(g + 1, next);
          if (landed) view.scatter(ex, ro + r0, land[g & 1], r1 - r0);
          if (g + 1 < segments) ex.synchronize();
        }
        ex.synchronize();  // the next step sends what this one received
      }
    }
  }

  Engine* engine_;
  RingOptions options_;
  bool oversubscribed_ = false;
  Buffer<std::byte, space> scratch_;
};

}  // namespace parallax
