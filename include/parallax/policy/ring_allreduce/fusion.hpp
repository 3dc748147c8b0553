#pragma once
/// @file
/// Tensor fusion: many gradients summed over the ranks in few collectives,
/// each bucket run by the ring over the tensors where they lie.

#include <parallax/comm_stats.hpp>
#include <parallax/detail/algorithms.hpp>
#include <parallax/half.hpp>
#include <parallax/options.hpp>
#include <parallax/detail/timeline.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/policy/ring_allreduce.hpp>
#include <parallax/policy/ring_allreduce/reducer.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <vector>

namespace parallax {
namespace policy::ring {

/// Sums many gradients over the ranks with few collectives: consecutive
/// tensors of one type are grouped into buckets of at most
/// RingOptions::bucket_bytes; a tensor at least that large is reduced in
/// place. A bucket the ring takes is reduced where its tensors lie (the ring
/// runs over them as one buffer); a bucket the engine's all-reduce takes
/// (small, or an oversubscribed host: RingAllReducer::choose) is packed into
/// a staging buffer, reduced, and unpacked. The plan is made once; run() is
/// the per-step call. A bucket's bytes are booked to the variables of its
/// tensors (TensorRef::label), in proportion to their sizes. With
/// compression (TrainerOptions::compress) a float bucket is converted to
/// 16 bits, summed by the engine's all-reduce in 16 bits (each combination
/// in float, rounded), and widened back.
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

  /// Which end the buckets are cut from. From the back, bucket 0 holds the
  /// last tensors: the order a backward pass finishes gradients in (PyTorch
  /// DDP's reverse registration order), so the first bucket can start first.
  enum class Order { front, back };

  FusedAllReducer(RingAllReducer<Engine>& reducer, std::vector<TensorRef> tensors, Order order = Order::front,
                  Compression compress = Compression::none)
      : reducer_(&reducer), tensors_(std::move(tensors)), bucket_of_(tensors_.size()), compress_(compress) {
    const std::size_t limit = reducer.options().bucket_bytes, n = tensors_.size();
    const bool back = order == Order::back;
    std::size_t largest = 0;
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = back ? n - 1 - k : k;
      const TensorRef& t = tensors_[i];
      const std::size_t bytes = t.count * size_of(t.type);
      if (bytes >= limit || bytes == 0) {
        bucket_of_[i] = buckets_.size();
        buckets_.push_back(Bucket{i, i + 1, t.count, t.type, true});
        continue;
      }
      if (buckets_.empty() || buckets_.back().in_place || buckets_.back().type != t.type ||
          (buckets_.back().elements + t.count) * size_of(t.type) > limit) {
        buckets_.push_back(Bucket{i, i, 0, t.type, false});
        if (back) buckets_.back().last = i + 1;
      }
      Bucket& b = buckets_.back();
      if (back) b.first = i;
      else b.last = i + 1;
      b.elements += t.count;
      bucket_of_[i] = buckets_.size() - 1;
      largest = std::max(largest, b.elements * size_of(b.type));
    }
    staging_.resize_discard(largest);
  }

  const std::vector<Bucket>& buckets() const noexcept { return buckets_; }
  /// Bytes of the staging buffer (the largest bucket), used by buckets that
  /// go to the engine's all-reduce.
  std::size_t staging_bytes() const noexcept { return staging_.size(); }

  /// The bucket that holds tensor i.
  std::size_t bucket_of(std::size_t i) const noexcept { return bucket_of_[i]; }

  /// Sums every tensor over the ranks, in place, bucket by bucket.
  void run() {
    for (std::size_t i = 0; i < buckets_.size(); ++i) run(i);
  }
  /// Sums bucket i's tensors over the ranks, in place.
  void run(std::size_t i) {
    if (reducer_->engine().size() == 1) return;  // a sum over one rank
    const auto span = detail::Span::named("parallax", "all-reduce bucket ", i, " (",
                                          buckets_[i].elements * size_of(buckets_[i].type), " B)");
    run(buckets_[i]);
    reducer_->engine().exec().synchronize();
  }

 private:
  void run(const Bucket& b) {
    auto& ex = reducer_->engine().exec();
    std::optional<CommStats::Shared> shared;
    if (tensors_[b.first].label) {
      shared.emplace(reducer_->engine().stats(), RingAllReduce::name);
      for (std::size_t i = b.first; i < b.last; ++i)
        shared->part(tensors_[i].label, tensors_[i].count * size_of(tensors_[i].type));
    }
    if (compress_ != Compression::none && b.type == DataType::f32) {
      if (compress_ == Compression::bf16) run_compressed<bf16>(b);
      else run_compressed<fp16>(b);
      return;
    }
    if (b.in_place) {
      reducer_->allreduce(tensors_[b.first].data, b.elements, b.type);
      return;
    }
    const std::size_t es = size_of(b.type);
    if (reducer_->choose(b.elements * es) != engine::Algorithm::native) {  // the ring, flat or hierarchical
      reducer_->ring_allreduce(tensors_.data() + b.first, b.last - b.first);
      return;
    }
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

  /// A float bucket summed as H: packed and narrowed, one all-reduce of H
  /// (the engine sums 16-bit values in float), widened back in place.
  template <class H>
  void run_compressed(const Bucket& b) {
    auto& ex = reducer_->engine().exec();
    narrow_.resize_discard(b.elements * sizeof(H));
    H* wire = reinterpret_cast<H*>(narrow_.data());
    H* at = wire;
    for (std::size_t i = b.first; i < b.last; ++i) {
      const std::size_t n = tensors_[i].count;
      if (n) for_each(ex, n, detail::Convert<H, float>{static_cast<const float*>(tensors_[i].data), at});
      at += n;
    }
    ex.synchronize();
    reducer_->engine().allreduce(wire, wire, b.elements, data_type_of_v<H>, ReduceOp::sum);
    at = wire;
    for (std::size_t i = b.first; i < b.last; ++i) {
      const std::size_t n = tensors_[i].count;
      if (n) for_each(ex, n, detail::Convert<float, H>{at, static_cast<float*>(tensors_[i].data)});
      at += n;
    }
  }

  RingAllReducer<Engine>* reducer_;
  std::vector<TensorRef> tensors_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;  // per tensor
  Buffer<std::byte, space> staging_;
  Compression compress_;
  Buffer<std::byte, space> narrow_;  // a compressed bucket's 16-bit values
};

}  // namespace policy::ring

using policy::ring::FusedAllReducer;  // as tests and benchmarks name it

}  // namespace parallax
