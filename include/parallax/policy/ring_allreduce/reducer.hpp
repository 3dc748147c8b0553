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
#include <parallax/policy/ring_allreduce/hierarchy.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

namespace parallax::policy::ring {

/// One gradient handed to tensor fusion, and the variable it belongs to
/// (its bytes are booked to it; null: to the scope in force).
struct TensorRef {
  void* data = nullptr;
  std::size_t count = 0;
  DataType type = DataType::f32;
  const char* label = nullptr;
};

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

/// Sums buffers over all ranks of an engine, in place.
///
/// The ring sends 2(N-1)/N of the buffer per rank whatever N is; each
/// reduce-scatter step moves one chunk in segments, double-buffered, so a
/// segment is reduced while it is still in cache. The sum of each element is
/// taken in a fixed order for a given N (bit-for-bit repeatable), and every
/// rank ends with identical bits; fused tensors get the same bits as one
/// contiguous buffer holding them.
///
/// With H hosts of L ranks each, the ring can run hierarchically
/// (engine::Algorithm::hierarchical, Horovod's hierarchical all-reduce): a
/// reduce-scatter inside each host leaves each local rank 1/L of the sum of
/// its host; the ranks of one local rank, one per host, ring all-reduce that
/// share between the hosts (L rings side by side, each moving
/// 2(H-1)/H of 1/L of the buffer over the hosts' links); an all-gather inside
/// each host gives every rank the whole. Every message is a point-to-point
/// call of the engine over its communicator, so bytes are booked intra or
/// inter host by peer, and every wait has the engine's deadline.
template <class Engine>
class RingAllReducer {
 public:
  using space = engine::space_of_t<Engine>;

  explicit RingAllReducer(Engine& engine, RingOptions options = {})
      : engine_(&engine), options_(options), world_(world_ring(engine.topology())) {
    PARALLAX_EXPECTS(options_.segment_bytes >= 64, "RingOptions::segment_bytes must be at least 64, got ",
                     options_.segment_bytes);
    const Topology& t = engine.topology();
    oversubscribed_ = t.oversubscribed();
    // The rings are drawn once, here; every rank draws the same ones.
    const bool several = t.num_hosts() > 1 && t.local_size() > 1;
    if (uniform_hosts(t) && (options_.algorithm == engine::Algorithm::hierarchical ||
                                     (options_.algorithm != engine::Algorithm::ring && several)))
      rings_.emplace(t);
  }

  const RingOptions& options() const noexcept { return options_; }
  Engine& engine() noexcept { return *engine_; }
  /// This rank's host runs more ranks than it has hardware threads.
  bool oversubscribed() const noexcept { return oversubscribed_; }
  /// Whether the ring runs hierarchically (see the class comment and
  /// RingOptions::algorithm): the topology allows it and the options ask
  /// for it or leave it to automatic.
  bool hierarchical() const noexcept { return rings_.has_value(); }
  /// The rings of the hierarchical all-reduce (hierarchical() must hold).
  const HostRings& host_rings() const noexcept { return *rings_; }

  /// The algorithm automatic picks for a buffer of this many bytes.
  engine::Algorithm choose(std::size_t bytes) const noexcept {
    const engine::Algorithm ring = hierarchical() ? engine::Algorithm::hierarchical : engine::Algorithm::ring;
    switch (options_.algorithm) {
      case engine::Algorithm::native: return engine::Algorithm::native;
      case engine::Algorithm::ring: return engine::Algorithm::ring;
      case engine::Algorithm::hierarchical: return ring;
      case engine::Algorithm::automatic: break;
    }
    if (engine_->size() == 1 || bytes < options_.native_below_bytes) return engine::Algorithm::native;
    if (options_.adapt_to_oversubscription && oversubscribed_) return engine::Algorithm::native;
    // Device memory: NCCL's all-reduce is its own ring on the GPUs' links,
    // and MpiStaged's stages the buffer once around one MPI_Allreduce, where
    // this ring would stage every segment through pinned memory
    // (docs/benchmarks.md, "All-reduce of a device buffer").
    if constexpr (!std::is_same_v<space, HostSpace>) return engine::Algorithm::native;
    return ring;
  }

  /// data[0..count) = sum over ranks of data[0..count).
  template <class T>
  void allreduce(T* data, std::size_t count) {
    if (engine_->size() == 1 || count == 0) return;  // nothing to exchange
    if (choose(count * sizeof(T)) == engine::Algorithm::native) {
      engine_->allreduce(data, data, count, data_type_of_v<T>, ReduceOp::sum);
    } else {
      ContiguousView<T> view(data);
      run(view, count);
    }
  }

  /// Untyped entry, for fused buckets.
  void allreduce(void* data, std::size_t count, DataType t) {
    switch (t) {
      case DataType::f32: return allreduce(static_cast<float*>(data), count);
      case DataType::f64: return allreduce(static_cast<double*>(data), count);
      case DataType::i32: return allreduce(static_cast<std::int32_t*>(data), count);
      case DataType::i64: return allreduce(static_cast<std::int64_t*>(data), count);
      case DataType::u8:
      case DataType::bf16:
      case DataType::f16: break;  // no ring over 16-bit values: the error below names the type
    }
    throw error(detail::concat("RingAllReduce: cannot sum elements of type ", to_string(t)));
  }

  /// Sums `n` tensors of one type over the ranks, in place, with the ring run
  /// over them as if they were one buffer laid end to end, without copying
  /// them into one (tensor fusion). Always the ring (hierarchical where
  /// hierarchical() holds), whatever `choose` says: the caller has decided
  /// (FusedAllReducer takes the engine's all-reduce on a packed copy where
  /// `choose` prefers native).
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
      case DataType::u8:
      case DataType::bf16:
      case DataType::f16: break;  // no ring over 16-bit values: the error below names the type
    }
    throw error(detail::concat("RingAllReduce: cannot sum elements of type ", to_string(t)));
  }

 private:
  template <class T>
  void ring_pieces(const TensorRef* tensors, std::size_t n) {
    if (engine_->size() == 1) return;
    PieceView<T> view(tensors, n);
    if (view.size() == 0) return;
    run(view, view.size());
  }

  /// The ring over a view of `count` elements, flat or hierarchical.
  template <class View>
  void run(const View& view, std::size_t count) {
    if (!rings_) {
      reduce_scatter(view, 0, count, world_);
      all_gather(view, 0, count, world_);
      return;
    }
    // Inside the host, between hosts (this rank's share), inside the host.
    const HostRings& r = *rings_;
    const std::size_t at = r.share_offset(count), share = r.share_count(count);
    reduce_scatter(view, 0, count, r.host);
    reduce_scatter(view, at, share, r.across);
    all_gather(view, at, share, r.across);
    all_gather(view, 0, count, r.host);
  }

  /// The segments and buffers of one ring pass over `count` elements among
  /// `n` ranks, with the view's segments to send from. Every rank cuts every
  /// chunk into the same number of segments, so a sender's segment g is its
  /// receiver's segment g.
  template <class View>
  class Pass {
   public:
    using T = typename View::value_type;
    Pass(RingAllReducer& r, const View& view, std::size_t count, int n) : view_(view), ex_(r.engine_->exec()) {
      // On an oversubscribed host ranks take turns on the cores, so a segment
      // does not travel while another is added, and every segment is one
      // more wait for a descheduled neighbour: each chunk goes whole.
      const std::size_t max_chunk = detail::ring::chunk_count(count, n, 0);
      const std::size_t seg_elems =
          r.options_.adapt_to_oversubscription && r.oversubscribed_
              ? std::max<std::size_t>(1, max_chunk)
              : std::max<std::size_t>(1, r.options_.segment_bytes / sizeof(T));
      segments = std::max<std::size_t>(1, (max_chunk + seg_elems - 1) / seg_elems);
      const std::size_t cap = (max_chunk + segments - 1) / segments;  // largest segment
      // Two landing buffers; over tensors also two packing buffers for
      // segments that straddle tensors.
      r.scratch_.resize_discard((View::contiguous ? 2 : 4) * cap * sizeof(T));
      T* base = reinterpret_cast<T*>(r.scratch_.data());
      land[0] = base;
      land[1] = base + cap;
      if constexpr (!View::contiguous) {
        pack_[0] = base + 2 * cap;
        pack_[1] = base + 3 * cap;
      }
    }
    /// Where segment g of a chunk of `chunk_elems` starts within it, and its length.
    std::size_t begin(std::size_t chunk_elems, std::size_t g) const { return g * chunk_elems / segments; }
    std::size_t length(std::size_t chunk_elems, std::size_t g) const {
      return begin(chunk_elems, g + 1) - begin(chunk_elems, g);
    }
    /// Segment g of the chunk of `chunk_elems` at `offset` of the view, to send from (source()).
    const T* segment(std::size_t g, std::size_t offset, std::size_t chunk_elems) const {
      return source(g, offset + begin(chunk_elems, g), length(chunk_elems, g));
    }
    /// Segment [b, b + len) of the view as a pointer to send from: the view
    /// itself, or packed into pack[g & 1]. Called for segment g + 1 before
    /// waiting for segment g, so the packing overlaps the transfer in flight
    /// (pack[(g + 1) & 1] is free: segment g - 1's send has completed).
    const T* source(std::size_t g, std::size_t b, std::size_t len) const {
      if constexpr (View::contiguous) {
        return view_.span(b, len);
      } else {
        if (T* p = view_.span(b, len)) return p;
        view_.gather(ex_, pack_[g & 1], b, len);
        ex_.synchronize();  // the engine reads it next
        return pack_[g & 1];
      }
    }

    std::size_t segments = 1;
    T* land[2] = {nullptr, nullptr};

   private:
    const View& view_;
    Exec<space>& ex_;
    T* pack_[2] = {nullptr, nullptr};
  };

  /// The reduce-scatter of ring `group` over the view's elements
  /// [at, at + count): afterwards the rank at position p holds the ring's sum
  /// of chunk owned_chunk(p) (detail/ring.hpp). Segment g of the chunk from
  /// the left lands in land[g & 1] and is added into the view while segment
  /// g + 1 travels.
  template <class View>
  void reduce_scatter(const View& view, std::size_t at, std::size_t count, const RingGroup& group) {
    using T = typename View::value_type;
    const int n = group.size(), me = group.me, right = group.right(), left = group.left();
    if (n == 1 || count == 0) return;
    auto& ex = engine_->exec();
    Pass<View> pass(*this, view, count, n);
    const std::size_t segments = pass.segments;
    for (int s = 0; s < n - 1; ++s) {
      const int cs = detail::ring::rs_send(me, n, s), cr = detail::ring::rs_send(me - 1, n, s);
      const std::size_t so = at + detail::ring::chunk_offset(count, n, cs);
      const std::size_t ro = at + detail::ring::chunk_offset(count, n, cr);
      const std::size_t sc = detail::ring::chunk_count(count, n, cs), rc = detail::ring::chunk_count(count, n, cr);
      auto start = [&](std::size_t g, const T* from) {
        return engine_->start_sendrecv(from, pass.length(sc, g), right, pass.land[g & 1], pass.length(rc, g), left,
                                       data_type_of_v<T>);
      };
      auto pending = start(0, pass.segment(0, so, sc));
      for (std::size_t g = 0; g < segments; ++g) {
        const T* next = g + 1 < segments ? pass.segment(g + 1, so, sc) : nullptr;
        engine_->wait(pending);
        if (g + 1 < segments) pending = start(g + 1, next);
        view.add(ex, ro + pass.begin(rc, g), pass.land[g & 1], pass.length(rc, g));
        if (g + 1 < segments) ex.synchronize();  // the buffer is reused two segments on
      }
      ex.synchronize();
    }
  }

  /// The all-gather of ring `group` over the view's elements [at, at + count),
  /// each rank holding its owned chunk: the reduced chunks travel round the
  /// ring once. A contiguous buffer sends and receives each chunk in one
  /// message, in place; over tensors, segment by segment, straight into a
  /// tensor where the segment lies in one, else through land[g & 1].
  template <class View>
  void all_gather(const View& view, std::size_t at, std::size_t count, const RingGroup& group) {
    using T = typename View::value_type;
    const int n = group.size(), me = group.me, right = group.right(), left = group.left();
    if (n == 1 || count == 0) return;
    auto& ex = engine_->exec();
    std::optional<Pass<View>> pass;
    if constexpr (!View::contiguous) pass.emplace(*this, view, count, n);
    for (int s = 0; s < n - 1; ++s) {
      const int cs = detail::ring::ag_send(me, n, s), cr = detail::ring::ag_send(me - 1, n, s);
      const std::size_t so = at + detail::ring::chunk_offset(count, n, cs);
      const std::size_t ro = at + detail::ring::chunk_offset(count, n, cr);
      const std::size_t sc = detail::ring::chunk_count(count, n, cs), rc = detail::ring::chunk_count(count, n, cr);
      if constexpr (View::contiguous) {
        engine_->sendrecv(view.span(so, sc), sc, right, view.span(ro, rc), rc, left, data_type_of_v<T>);
      } else {
        const std::size_t segments = pass->segments;
        T* direct[2] = {nullptr, nullptr};
        auto start = [&](std::size_t g, const T* from) {
          direct[g & 1] = view.span(ro + pass->begin(rc, g), pass->length(rc, g));
          T* into = direct[g & 1] ? direct[g & 1] : pass->land[g & 1];
          return engine_->start_sendrecv(from, pass->length(sc, g), right, into, pass->length(rc, g), left,
                                         data_type_of_v<T>);
        };
        auto pending = start(0, pass->segment(0, so, sc));
        for (std::size_t g = 0; g < segments; ++g) {
          const T* next = g + 1 < segments ? pass->segment(g + 1, so, sc) : nullptr;
          engine_->wait(pending);
          const bool landed = direct[g & 1] == nullptr;
          if (g + 1 < segments) pending = start(g + 1, next);
          if (landed) view.scatter(ex, ro + pass->begin(rc, g), pass->land[g & 1], pass->length(rc, g));
          if (g + 1 < segments) ex.synchronize();
        }
        ex.synchronize();  // the next step sends what this one received
      }
    }
  }

  Engine* engine_;
  RingOptions options_;
  bool oversubscribed_ = false;
  RingGroup world_;                // the flat ring: every rank
  std::optional<HostRings> rings_;  // the hierarchical rings, where they run
  Buffer<std::byte, space> scratch_;
};

}  // namespace parallax::policy::ring

namespace parallax {
// The names tests, benchmarks and docs/gpu.md use.
using policy::ring::RingAllReducer;
using policy::ring::TensorRef;
}  // namespace parallax
