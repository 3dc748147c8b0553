#pragma once
/// @file
/// DynamicPS's routes: the keys of every dynamic table of a call travel to
/// their owners in one exchange, their rows back in one, and the step's
/// gradient rows of every table in one (docs/design.md, "Dynamic tables").
///
/// A table is a lane of an exchange. The message to each rank holds one
/// count word per lane, then each lane's part in turn: its keys, then their
/// rows. A lane whose keys are those of the table's last lookup, in its
/// order (a push of the rows that lookup returned), sends its rows alone:
/// the owner holds those keys from the lookup, so its count word is flagged
/// and the owner reads the keys from the lookup's route.

#include <parallax/dynamic/table.hpp>
#include <parallax/engine/alltoallv_any.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/error.hpp>
#include <parallax/types.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

namespace parallax::policy::dynamic_ps {

/// One table's keys routed to their owners: this rank's keys grouped by
/// owner (stable), and what every rank sent this one, in source rank order.
struct Route {
  std::vector<std::size_t> send_counts, send_displs, recv_counts, recv_displs;  // in keys
  std::vector<std::size_t> order;  // order[j]: the caller's index of the j-th key sent
  std::vector<std::uint64_t> send_keys, recv_keys;

  /// Groups keys[0, n) by dynamic::owner over `ranks`.
  void plan(const std::uint64_t* keys, std::size_t n, int ranks) {
    const auto un = static_cast<std::size_t>(ranks);
    owners_.resize(n);
    send_counts.assign(un, 0);
    for (std::size_t i = 0; i < n; ++i) {
      owners_[i] = dynamic::owner(keys[i], ranks);
      ++send_counts[static_cast<std::size_t>(owners_[i])];
    }
    displacements(send_counts, send_displs);
    order.resize(n);
    send_keys.resize(n);
    at_ = send_displs;
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t j = at_[static_cast<std::size_t>(owners_[i])]++;
      order[j] = i;
      send_keys[j] = keys[i];
    }
  }
  /// Whether keys[0, n) are the keys this route planned, in the caller's order.
  bool carries(const std::uint64_t* keys, std::size_t n) const {
    if (n != order.size()) return false;
    for (std::size_t j = 0; j < n; ++j)
      if (keys[order[j]] != send_keys[j]) return false;
    return true;
  }
  std::size_t received() const noexcept { return recv_keys.size(); }

  /// d[p] = the sum of counts[0, p), in d's room kept across calls.
  static void displacements(const std::vector<std::size_t>& counts, std::vector<std::size_t>& d) {
    d.assign(counts.size(), 0);
    for (std::size_t p = 1; p < counts.size(); ++p) d[p] = d[p - 1] + counts[p - 1];
  }

 private:
  std::vector<int> owners_;
  std::vector<std::size_t> at_;  // plan(): the next place of each owner's keys
};

/// One table's part of an exchange.
struct Lane {
  const Route* send = nullptr;  ///< what this rank sends, grouped by owner (planned)
  Route* recv = nullptr;        ///< filled with what this rank receives (recv_*)
  bool keys = true;             ///< false: the keys are `send`'s, which is `last` (rows alone travel)
  const Route* last = nullptr;  ///< the table's last lookup (whose keys a flagged sender left out), or null
  const std::byte* rows = nullptr;  ///< row_bytes per key in the caller's order; null: keys alone
  std::size_t row_bytes = 0;
  /// Where the received rows land (row_bytes each, aligned to recv->recv_keys),
  /// given their count. Needed when rows is set.
  std::function<void*(std::size_t)> land;
};

/// An exchange's messages and bookkeeping, kept across calls.
struct Buffers {
  std::vector<std::byte> send, recv;
  std::vector<std::size_t> sbytes, sdispls, rbytes, rdispls;
  std::vector<std::int64_t> sizes;      // the sizes ahead of the messages (engine::alltoallv_any)
  std::vector<std::uint8_t> known;      // per lane and source rank: the keys were left out
  std::vector<std::byte*> rows_at;      // per lane: where its received rows land
};

namespace wire {
inline constexpr std::uint64_t keys_known = std::uint64_t{1} << 63;  // count word: the keys were left out
inline void copy(void* to, const void* from, std::size_t bytes) {
  // memcpy with a null pointer is undefined even for 0 bytes, and an empty
  // vector's data() may be null.
  if (bytes != 0) std::memcpy(to, from, bytes);
}
}  // namespace wire

/// Sends every lane's keys (and rows) to their owners; each lane's `recv`
/// gets what every rank sent, in source rank order. Collective, every rank
/// passing the same lanes (tables) in the same order: one
/// engine::alltoallv_any (an alltoallv_unsized where the engine has it,
/// else an alltoall of the sizes and an alltoallv).
template <class Engine>
void exchange(Engine& engine, Lane* lanes, std::size_t count, Buffers& b) {
  const int ranks = engine.size();
  const auto un = static_cast<std::size_t>(ranks);
  constexpr std::size_t word = sizeof(std::uint64_t);
  b.sbytes.assign(un, 0);
  b.sdispls.assign(un, 0);
  std::size_t total = 0;
  for (std::size_t p = 0; p < un; ++p) {
    std::size_t bytes = count * word;
    for (std::size_t l = 0; l < count; ++l) {
      const Lane& a = lanes[l];
      bytes += a.send->send_counts[p] * ((a.keys ? word : 0) + (a.rows ? a.row_bytes : 0));
    }
    b.sdispls[p] = total;
    b.sbytes[p] = bytes;
    total += bytes;
  }
  b.send.resize(total);
  for (std::size_t p = 0; p < un; ++p) {
    std::byte* out = b.send.data() + b.sdispls[p];
    for (std::size_t l = 0; l < count; ++l, out += word) {
      const std::uint64_t c = lanes[l].send->send_counts[p] | (lanes[l].keys ? 0 : wire::keys_known);
      std::memcpy(out, &c, word);
    }
    for (std::size_t l = 0; l < count; ++l) {
      const Lane& a = lanes[l];
      const Route& r = *a.send;
      const std::size_t first = r.send_displs[p], n = r.send_counts[p];
      if (a.keys) {
        wire::copy(out, r.send_keys.data() + first, n * word);
        out += n * word;
      }
      if (a.rows)
        for (std::size_t j = first; j < first + n; ++j, out += a.row_bytes)
          wire::copy(out, a.rows + r.order[j] * a.row_bytes, a.row_bytes);
    }
  }
  b.rbytes.assign(un, 0);
  b.rdispls.assign(un, 0);
  engine::alltoallv_any(engine, b.send.data(), b.sbytes.data(), b.sdispls.data(), b.rbytes.data(), b.rdispls.data(),
                        [&](std::size_t bytes) {
                          b.recv.resize(bytes);
                          return b.recv.data();
                        },
                        b.sizes);
  // The counts, then room for each lane's keys and rows, then the copies.
  std::vector<std::uint8_t>& known = b.known;
  known.assign(count * un, 0);
  for (std::size_t l = 0; l < count; ++l) lanes[l].recv->recv_counts.assign(un, 0);
  for (std::size_t p = 0; p < un; ++p) {
    if (b.rbytes[p] < count * word)
      throw error(parallax::detail::concat("parallax DynamicPS: rank ", p, " sent ", b.rbytes[p], " bytes, fewer than the ",
                                           count, " count words of the tables (ranks disagree on the tables)"));
    for (std::size_t l = 0; l < count; ++l) {
      std::uint64_t c = 0;
      std::memcpy(&c, b.recv.data() + b.rdispls[p] + l * word, word);
      known[l * un + p] = (c & wire::keys_known) != 0;
      lanes[l].recv->recv_counts[p] = static_cast<std::size_t>(c & ~wire::keys_known);
    }
  }
  std::vector<std::byte*>& rows_at = b.rows_at;
  rows_at.assign(count, nullptr);
  for (std::size_t l = 0; l < count; ++l) {
    Route& r = *lanes[l].recv;
    Route::displacements(r.recv_counts, r.recv_displs);
    r.recv_keys.resize(r.recv_displs.back() + r.recv_counts.back());
    if (lanes[l].rows) rows_at[l] = static_cast<std::byte*>(lanes[l].land(r.recv_keys.size()));
  }
  for (std::size_t p = 0; p < un; ++p) {
    const std::byte* in = b.recv.data() + b.rdispls[p] + count * word;
    for (std::size_t l = 0; l < count; ++l) {
      const Lane& a = lanes[l];
      Route& r = *a.recv;
      const std::size_t first = r.recv_displs[p], n = r.recv_counts[p];
      if (known[l * un + p]) {
        // The sender's keys are those it sent in the table's last lookup.
        if (!a.last || a.last->recv_counts.size() != un || a.last->recv_counts[p] != n)
          throw error("parallax DynamicPS: a push left out keys this rank holds no lookup of (ranks disagree "
                      "on the step's lookups)");
        wire::copy(r.recv_keys.data() + first, a.last->recv_keys.data() + a.last->recv_displs[p], n * word);
      } else {
        wire::copy(r.recv_keys.data() + first, in, n * word);
        in += n * word;
      }
      if (a.rows) {
        wire::copy(rows_at[l] + first * a.row_bytes, in, n * a.row_bytes);
        in += n * a.row_bytes;
      }
    }
  }
}

/// Sends each lane's rows back from the owners to the callers, the way its
/// keys came: owned[l] holds row_bytes[l] per key of lanes[l].recv's keys;
/// back[l] gets them in the caller's order (aligned to the keys it routed).
/// Collective: one alltoallv.
template <class Engine>
void reply(Engine& engine, const Lane* lanes, std::size_t count, const std::size_t* row_bytes,
           const std::byte* const* owned, std::byte* const* back, Buffers& b) {
  const auto un = static_cast<std::size_t>(engine.size());
  b.sbytes.assign(un, 0);
  b.sdispls.assign(un, 0);
  b.rbytes.assign(un, 0);
  b.rdispls.assign(un, 0);
  std::size_t sent = 0, got = 0;
  for (std::size_t p = 0; p < un; ++p) {
    b.sdispls[p] = sent;
    b.rdispls[p] = got;
    for (std::size_t l = 0; l < count; ++l) {
      b.sbytes[p] += lanes[l].recv->recv_counts[p] * row_bytes[l];
      b.rbytes[p] += lanes[l].send->send_counts[p] * row_bytes[l];
    }
    sent += b.sbytes[p];
    got += b.rbytes[p];
  }
  b.send.resize(sent);
  b.recv.resize(got);
  for (std::size_t p = 0; p < un; ++p) {
    std::byte* out = b.send.data() + b.sdispls[p];
    for (std::size_t l = 0; l < count; ++l) {
      const Route& r = *lanes[l].recv;
      const std::size_t bytes = r.recv_counts[p] * row_bytes[l];
      wire::copy(out, owned[l] + r.recv_displs[p] * row_bytes[l], bytes);
      out += bytes;
    }
  }
  engine.alltoallv(b.send.data(), b.sbytes.data(), b.sdispls.data(), b.recv.data(), b.rbytes.data(), b.rdispls.data(),
                   DataType::u8);
  for (std::size_t p = 0; p < un; ++p) {
    const std::byte* in = b.recv.data() + b.rdispls[p];
    for (std::size_t l = 0; l < count; ++l) {
      const Route& r = *lanes[l].send;
      for (std::size_t j = r.send_displs[p]; j < r.send_displs[p] + r.send_counts[p]; ++j, in += row_bytes[l])
        wire::copy(back[l] + r.order[j] * row_bytes[l], in, row_bytes[l]);
    }
  }
}

}  // namespace parallax::policy::dynamic_ps
