#pragma once
/// @file
/// RingAllReduce machinery: the segmented ring all-reduce over an engine's
/// point-to-point messages, and tensor fusion of many small gradients.

#include <parallax/detail/ring.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/error.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace parallax {

/// Settings of RingAllReduce. The defaults are what docs/benchmarks.md
/// measured best on the machines there.
struct RingOptions {
  /// ring, native (the engine's all-reduce), or automatic: native below
  /// `native_below_bytes` and with one rank, ring above.
  engine::Algorithm algorithm = engine::Algorithm::automatic;
  /// Buffers smaller than this go to the engine's all-reduce under automatic.
  std::size_t native_below_bytes = std::size_t{256} << 10;
  /// The ring moves each chunk in segments of at most this many bytes, two
  /// in flight, so a segment is reduced while the next one travels.
  std::size_t segment_bytes = std::size_t{512} << 10;
  /// Tensor fusion: consecutive gradients are packed into buckets of at most
  /// this many bytes (a larger gradient is reduced in place, alone).
  std::size_t bucket_bytes = std::size_t{32} << 20;
};

namespace detail {
template <class T>
struct AddInto {
  T* dst;
  const T* src;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i) const { dst[i] += src[i]; }
};
}  // namespace detail

/// Sums buffers over all ranks of an engine, in place.
///
/// The ring sends 2(N-1)/N of the buffer per rank whatever N is; each
/// reduce-scatter step moves one chunk in segments, double-buffered. The sum
/// of each element is taken in a fixed order for a given N (bit-for-bit
/// repeatable), and every rank ends with identical bits.
template <class Engine>
class RingAllReducer {
 public:
  using space = engine::space_of_t<Engine>;

  explicit RingAllReducer(Engine& engine, RingOptions options = {}) : engine_(&engine), options_(options) {
    PARALLAX_EXPECTS(options_.segment_bytes >= 64, "RingOptions::segment_bytes must be at least 64, got ",
                     options_.segment_bytes);
  }

  const RingOptions& options() const noexcept { return options_; }
  Engine& engine() noexcept { return *engine_; }

  /// The algorithm automatic picks for a buffer of this many bytes.
  engine::Algorithm choose(std::size_t bytes) const noexcept {
    if (options_.algorithm != engine::Algorithm::automatic) return options_.algorithm;
    if (engine_->size() == 1 || bytes < options_.native_below_bytes) return engine::Algorithm::native;
    return engine::Algorithm::ring;
  }

  /// data[0..count) = sum over ranks of data[0..count).
  template <class T>
  void allreduce(T* data, std::size_t count) {
    if (engine_->size() == 1 || count == 0) return;  // nothing to exchange
    if (choose(count * sizeof(T)) == engine::Algorithm::native) {
      engine_->allreduce(data, data, count, data_type_of_v<T>, ReduceOp::sum);
    } else {
      ring(data, count);
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

 private:
  template <class T>
  void ring(T* data, std::size_t count) {
    const int n = engine_->size(), me = engine_->rank();
    const int right = detail::ring::mod(me + 1, n), left = detail::ring::mod(me - 1, n);
    const DataType dt = data_type_of_v<T>;
    auto& ex = engine_->exec();

    // Every rank cuts every chunk into the same number of segments, so a
    // sender's segment g is its receiver's segment g.
    const std::size_t max_chunk = detail::ring::chunk_count(count, n, 0);
    const std::size_t seg_elems = std::max<std::size_t>(1, options_.segment_bytes / sizeof(T));
    const std::size_t segments = std::max<std::size_t>(1, (max_chunk + seg_elems - 1) / seg_elems);
    const std::size_t seg_cap = (max_chunk + segments - 1) / segments;  // largest segment
    scratch_.resize_discard(2 * seg_cap * sizeof(T));
    T* tmp[2] = {reinterpret_cast<T*>(scratch_.data()), reinterpret_cast<T*>(scratch_.data()) + seg_cap};
    auto seg_begin = [&](std::size_t chunk_elems, std::size_t g) { return g * chunk_elems / segments; };

    // Reduce-scatter.
    for (int s = 0; s < n - 1; ++s) {
      const int cs = detail::ring::rs_send(me, n, s), cr = detail::ring::rs_send(left, n, s);
      T* send_chunk = data + detail::ring::chunk_offset(count, n, cs);
      T* recv_chunk = data + detail::ring::chunk_offset(count, n, cr);
      const std::size_t sc = detail::ring::chunk_count(count, n, cs), rc = detail::ring::chunk_count(count, n, cr);
      auto start = [&](std::size_t g) {
        const std::size_t s0 = seg_begin(sc, g), s1 = seg_begin(sc, g + 1);
        const std::size_t r0 = seg_begin(rc, g), r1 = seg_begin(rc, g + 1);
        return engine_->start_sendrecv(send_chunk + s0, s1 - s0, right, tmp[g & 1], r1 - r0, left, dt);
      };
      auto pending = start(0);
      for (std::size_t g = 0; g < segments; ++g) {
        engine_->wait(pending);
        const std::size_t r0 = seg_begin(rc, g), r1 = seg_begin(rc, g + 1);
        T* landed = tmp[g & 1];
        if (g + 1 < segments) pending = start(g + 1);
        for_each(ex, r1 - r0, detail::AddInto<T>{recv_chunk + r0, landed});
        if (g + 1 < segments) ex.synchronize();  // the buffer is reused two segments on
      }
      ex.synchronize();
    }
    // All-gather: the reduced chunks travel round the ring once more.
    for (int s = 0; s < n - 1; ++s) {
      const int cs = detail::ring::ag_send(me, n, s), cr = detail::ring::ag_send(left, n, s);
      engine_->sendrecv(data + detail::ring::chunk_offset(count, n, cs), detail::ring::chunk_count(count, n, cs),
                        right, data + detail::ring::chunk_offset(count, n, cr),
                        detail::ring::chunk_count(count, n, cr), left, dt);
    }
  }

  Engine* engine_;
  RingOptions options_;
  Buffer<std::byte, space> scratch_;
};

/// One gradient handed to tensor fusion.
struct TensorRef {
  void* data = nullptr;
  std::size_t count = 0;
  DataType type = DataType::f32;
};

/// Sums many gradients over the ranks with few collectives: consecutive
/// tensors of one type are packed into buckets of at most
/// RingOptions::bucket_bytes; a tensor at least that large is reduced in
/// place. The plan is made once; run() is the per-step call.
template <class Engine>
class FusedAllReducer {
 public:
  using space = engine::space_of_t<Engine>;

  struct Bucket {
    std::size_t first = 0, last = 0;  // tensors [first, last)
    std::size_t elements = 0;
    DataType type = DataType::f32;
    bool in_place = false;  // one tensor, reduced where it lies
  };

  FusedAllReducer(RingAllReducer<Engine>& reducer, std::vector<TensorRef> tensors)
      : reducer_(&reducer), tensors_(std::move(tensors)) {
    const std::size_t limit = reducer.options().bucket_bytes;
    std::size_t largest = 0;
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const TensorRef& t = tensors_[i];
      const std::size_t bytes = t.count * size_of(t.type);
      if (bytes >= limit || bytes == 0) {
        buckets_.push_back(Bucket{i, i + 1, t.count, t.type, true});
        continue;
      }
      if (buckets_.empty() || buckets_.back().in_place || buckets_.back().type != t.type ||
          (buckets_.back().elements + t.count) * size_of(t.type) > limit) {
        buckets_.push_back(Bucket{i, i, 0, t.type, false});
      }
      Bucket& b = buckets_.back();
      b.last = i + 1;
      b.elements += t.count;
      largest = std::max(largest, b.elements * size_of(b.type));
    }
    staging_.resize_discard(largest);
  }

  const std::vector<Bucket>& buckets() const noexcept { return buckets_; }
  std::size_t staging_bytes() const noexcept { return staging_.size(); }

  /// Sums every tensor over the ranks, in place.
  void run() {
    auto& ex = reducer_->engine().exec();
    for (const Bucket& b : buckets_) {
      if (b.in_place) {
        reducer_->allreduce(tensors_[b.first].data, b.elements, b.type);
        continue;
      }
      const std::size_t es = size_of(b.type);
      std::byte* at = staging_.data();
      for (std::size_t i = b.first; i < b.last; ++i) {
        ex.copy(at, tensors_[i].data, tensors_[i].count * es);
        at += tensors_[i].count * es;
      }
      reducer_->allreduce(staging_.data(), b.elements, b.type);
      at = staging_.data();
      for (std::size_t i = b.first; i < b.last; ++i) {
        ex.copy(tensors_[i].data, at, tensors_[i].count * es);
        at += tensors_[i].count * es;
      }
    }
    ex.synchronize();
  }

 private:
  RingAllReducer<Engine>* reducer_;
  std::vector<TensorRef> tensors_;
  std::vector<Bucket> buckets_;
  Buffer<std::byte, space> staging_;
};

}  // namespace parallax
