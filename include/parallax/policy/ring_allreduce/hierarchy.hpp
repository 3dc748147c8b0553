#pragma once
/// @file
/// The rings of RingAllReduce, drawn from the topology: the flat ring of
/// every rank, and the two rings of the hierarchical all-reduce (the ranks
/// of this rank's host; the ranks of this local rank, one per host), with
/// the elements each phase moves (docs/design.md, "Hierarchical
/// all-reduce").

#include <parallax/context.hpp>
#include <parallax/detail/ring.hpp>

#include <cstddef>
#include <vector>

namespace parallax::policy::ring {

/// The ranks of one ring in ring order (position p sends to p + 1), and this
/// rank's position. The ring runs over the engine's communicator: positions
/// name its ranks, so no communicator is made for a ring.
struct RingGroup {
  std::vector<int> ranks;
  int me = 0;
  int size() const noexcept { return static_cast<int>(ranks.size()); }
  /// The rank at `position` (any integer, taken modulo the size).
  int peer(int position) const noexcept { return ranks[static_cast<std::size_t>(detail::ring::mod(position, size()))]; }
  /// The rank this one sends to, and the one it receives from.
  int right() const noexcept { return peer(me + 1); }
  int left() const noexcept { return peer(me - 1); }
};

/// Every rank, in rank order: the flat ring.
inline RingGroup world_ring(const Topology& t) {
  RingGroup g;
  for (int r = 0; r < t.size(); ++r) g.ranks.push_back(r);
  g.me = t.rank();
  return g;
}

/// Every host runs the same number of ranks (what the hierarchical
/// all-reduce needs: one ring between hosts per local rank).
inline bool uniform_hosts(const Topology& t) {
  for (int h = 0; h < t.num_hosts(); ++h)
    if (static_cast<int>(t.ranks_of_host(h).size()) != t.local_size()) return false;
  return true;
}

/// The two rings of the hierarchical all-reduce; needs uniform_hosts(t).
struct HostRings {
  RingGroup host;    ///< the ranks of this rank's host, by local rank (L of them)
  RingGroup across;  ///< the ranks of this local rank, one per host, by host (H of them)

  explicit HostRings(const Topology& t) {
    host.ranks = t.ranks_of_host(t.host());
    host.me = t.local_rank();
    for (int h = 0; h < t.num_hosts(); ++h)
      across.ranks.push_back(t.ranks_of_host(h)[static_cast<std::size_t>(t.local_rank())]);
    across.me = t.host();
  }

  /// The part of a buffer of `count` elements this rank reduces between
  /// hosts: the chunk the reduce-scatter inside the host leaves it.
  std::size_t share_offset(std::size_t count) const {
    return detail::ring::chunk_offset(count, host.size(), detail::ring::owned_chunk(host.me, host.size()));
  }
  std::size_t share_count(std::size_t count) const {
    return detail::ring::chunk_count(count, host.size(), detail::ring::owned_chunk(host.me, host.size()));
  }

  /// Elements this rank sends to ranks of its own host in an all-reduce of
  /// `count` (the reduce-scatter and all-gather inside the host), and
  /// receives from them.
  std::size_t intra_sent(std::size_t count) const { return detail::ring::allreduce_sent(count, host.size(), host.me); }
  std::size_t intra_received(std::size_t count) const {
    return detail::ring::allreduce_received(count, host.size(), host.me);
  }
  /// Elements this rank sends to, and receives from, other hosts: a ring
  /// all-reduce of its share between the hosts, 2(H-1)/H of count / L.
  std::size_t inter_sent(std::size_t count) const {
    return detail::ring::allreduce_sent(share_count(count), across.size(), across.me);
  }
  std::size_t inter_received(std::size_t count) const {
    return detail::ring::allreduce_received(share_count(count), across.size(), across.me);
  }
};

}  // namespace parallax::policy::ring
