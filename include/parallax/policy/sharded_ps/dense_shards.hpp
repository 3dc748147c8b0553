#pragma once
/// @file
/// A dense variable sharded over the ranks (arch::PS): reduce-scatter of the
/// gradient to the owners, all-gather of the updated shards.

#include <parallax/engine/engine.hpp>
#include <parallax/partition.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <cstddef>
#include <vector>

namespace parallax::policy::sharded {


template <class T>
struct SumBlocks {
  const T* blocks;  // `ranks` blocks of `size` elements, by rank
  T* out;
  std::size_t size;
  int ranks;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const {
    T acc = blocks[j];
    for (int r = 1; r < ranks; ++r) acc += blocks[static_cast<std::size_t>(r) * size + j];
    out[j] = acc;
  }
};


/// A dense variable sharded over the ranks (arch::PS): each rank sends every
/// owner its rows of the gradient, the owner sums them by rank and updates
/// its shard, and every rank gathers the updated shards. Bytes per rank equal
/// a ring all-reduce's, 2(N-1)/N of the variable, in two collectives.
template <class T, class Engine>
class DenseShards {
 public:
  using space = engine::space_of_t<Engine>;

  DenseShards(Engine& engine, PartitionMap map, std::size_t cols) : engine_(&engine), map_(map), cols_(cols) {
    const int n = engine.size();
    const auto un = static_cast<std::size_t>(n);
    // In the owner-major layout each owner's partitions are adjacent. With
    // P <= N that is the variable's own row order, and no copies are needed.
    identity_ = map.parts <= n;
    counts_.resize(un);
    displs_.resize(un);
    std::size_t at = 0;
    for (int r = 0; r < n; ++r) {
      counts_[r] = map.shard_rows(r) * cols;
      displs_[r] = at;
      at += counts_[r];
    }
    mine_ = counts_[static_cast<std::size_t>(engine.rank())];
    rcounts_.assign(un, mine_);
    rdispls_.resize(un);
    for (std::size_t r = 0; r < un; ++r) rdispls_[r] = r * mine_;
    shard_.resize_discard(mine_);
  }

  const PartitionMap& map() const noexcept { return map_; }
  Buffer<T, space>& shard() noexcept { return shard_; }
  std::size_t shard_elements() const noexcept { return mine_; }

  /// Copies this rank's rows of a full-size buffer into its shard layout.
  void take_shard(const T* full, T* shard_out) {
    auto& ex = engine_->exec();
    const int me = engine_->rank();
    for (std::size_t t = 0; t < map_.partitions_on(me); ++t) {
      const int p = me + static_cast<int>(t) * map_.ranks;
      ex.copy(shard_out + map_.shard_offset(p) * cols_, full + map_.begin(p) * cols_, map_.size(p) * cols_ * sizeof(T));
    }
    ex.synchronize();
  }

  /// sum = the sum over ranks, in rank order, of this rank's rows of `grad`
  /// (a full-size gradient). Collective.
  void reduce(const T* grad, T* sum) {
    auto& ex = engine_->exec();
    const T* send = grad;
    if (!identity_) send = to_owner_major(grad);
    received_.resize_discard(mine_ * static_cast<std::size_t>(engine_->size()));
    engine_->alltoallv(send, counts_.data(), displs_.data(), received_.data(), rcounts_.data(), rdispls_.data(),
                       data_type_of_v<T>);
    if (mine_) for_each(ex, mine_, SumBlocks<T>{received_.data(), sum, mine_, engine_->size()});
    ex.synchronize();
  }

  /// full = every rank's shard, assembled. Collective.
  void gather(const T* shard, T* full) {
    T* out = identity_ ? full : (staging_.resize_discard(map_.rows * cols_), staging_.data());
    engine_->allgatherv(shard, mine_, out, counts_.data(), displs_.data(), data_type_of_v<T>);
    if (!identity_) from_owner_major(out, full);
  }

 private:
  template <class Copy>
  void for_partitions(Copy&& copy) {
    for (int p = 0; p < map_.parts; ++p) {
      const int o = map_.owner_of_partition(p);
      copy(displs_[static_cast<std::size_t>(o)] + map_.shard_offset(p) * cols_, map_.begin(p) * cols_,
           map_.size(p) * cols_);
    }
  }
  const T* to_owner_major(const T* full) {
    staging_.resize_discard(map_.rows * cols_);
    auto& ex = engine_->exec();
    for_partitions([&](std::size_t owner_major, std::size_t row_major, std::size_t n) {
      ex.copy(staging_.data() + owner_major, full + row_major, n * sizeof(T));
    });
    ex.synchronize();
    return staging_.data();
  }
  void from_owner_major(const T* owner_major_buf, T* full) {
    auto& ex = engine_->exec();
    for_partitions([&](std::size_t owner_major, std::size_t row_major, std::size_t n) {
      ex.copy(full + row_major, owner_major_buf + owner_major, n * sizeof(T));
    });
    ex.synchronize();
  }

  Engine* engine_;
  PartitionMap map_;
  std::size_t cols_;
  bool identity_ = true;
  std::size_t mine_ = 0;
  std::vector<std::size_t> counts_, displs_, rcounts_, rdispls_;
  Buffer<T, space> shard_, received_, staging_;
};

}  // namespace parallax::policy::sharded
