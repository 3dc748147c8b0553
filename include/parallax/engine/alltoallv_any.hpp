#pragma once
/// @file
/// An all-to-all of messages whose receivers do not know their sizes, on
/// any engine: one alltoallv_unsized where the engine has it (the sizes are
/// read from the messages), else the sizes first, in an alltoall of a few
/// words per rank pair, then an alltoallv. The policies that route rows to
/// their owners (DynamicPS's routes, ShardedPS's route lanes) send this way.

#include <parallax/engine/engine.hpp>
#include <parallax/types.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace parallax::engine {

/// Sends rank p the sbytes[p] bytes at send + sdispls[p], for every p, where
/// the receivers do not know the sizes: rank p's bytes land at rdispls[p] of
/// the room `alloc(total)` returns (a std::byte*), in rank order, and rbytes
/// and rdispls are filled. An engine with alltoallv_unsized does it in one
/// call and `lead` is not sent. Elsewhere `lead` int64 words per rank pair
/// go first in one alltoall (lead_send[lead * p ..] to rank p, received in
/// lead_recv, `lead` words from each rank in rank order), then
/// `sizes(lead_recv, rbytes)` fills rbytes from them and says whether to go
/// on (false: no message moves, which every rank must decide alike from the
/// words), and an alltoallv moves the messages. Returns whether they moved.
/// Collective.
template <class Engine, class Alloc, class Sizes>
bool alltoallv_any(Engine& engine, const void* send, const std::size_t* sbytes, const std::size_t* sdispls,
                   std::size_t* rbytes, std::size_t* rdispls, Alloc&& alloc, std::size_t lead,
                   const std::int64_t* lead_send, std::int64_t* lead_recv, Sizes&& sizes) {
  if constexpr (supports_v<Engine, op_alltoallv_unsized>) {
    engine.alltoallv_unsized(send, sbytes, sdispls, rbytes, rdispls, alloc);
    return true;
  } else {
    engine.alltoall(lead_send, lead_recv, lead, DataType::i64);
    if (!sizes(static_cast<const std::int64_t*>(lead_recv), rbytes)) return false;
    const auto un = static_cast<std::size_t>(engine.size());
    std::size_t total = 0;
    for (std::size_t p = 0; p < un; ++p) {
      rdispls[p] = total;
      total += rbytes[p];
    }
    engine.alltoallv(send, sbytes, sdispls, alloc(total), rbytes, rdispls, DataType::u8);
    return true;
  }
}

/// alltoallv_any whose sizes alone go first where the engine has no
/// alltoallv_unsized: one int64 word per rank pair. `words` is room for
/// them, kept across calls by the caller.
template <class Engine, class Alloc>
void alltoallv_any(Engine& engine, const void* send, const std::size_t* sbytes, const std::size_t* sdispls,
                   std::size_t* rbytes, std::size_t* rdispls, Alloc&& alloc, std::vector<std::int64_t>& words) {
  const auto un = static_cast<std::size_t>(engine.size());
  // The words are room only where they are sent (an empty vector's data()
  // may be null, and null + un is undefined).
  std::int64_t* lead = nullptr;
  if constexpr (!supports_v<Engine, op_alltoallv_unsized>) {
    words.resize(2 * un);
    for (std::size_t p = 0; p < un; ++p) words[p] = static_cast<std::int64_t>(sbytes[p]);
    lead = words.data();
  }
  alltoallv_any(engine, send, sbytes, sdispls, rbytes, rdispls, alloc, 1, lead, lead ? lead + un : nullptr,
                [un](const std::int64_t* got, std::size_t* r) {
                  for (std::size_t p = 0; p < un; ++p) r[p] = static_cast<std::size_t>(got[p]);
                  return true;
                });
}

}  // namespace parallax::engine
