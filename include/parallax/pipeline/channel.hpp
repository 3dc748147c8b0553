#pragma once
/// @file
/// Messages between neighbouring stages of one replica's pipeline, over an
/// engine::Mpi of their own (tagged, non-blocking point-to-point messages on
/// a duplicate of the world's communicator). Protocol: the activations of
/// micro-batch m go from stage s to stage s + 1 with tag 2m, the errors
/// (gradients of those activations) from s + 1 back to s with tag 2m + 1.
/// Sends are non-blocking and copy their data, so a stage never waits to
/// send; a stage waits only for a message it needs next, and messages of one
/// tag between two ranks arrive in the order sent, so step k's message is
/// matched before step k + 1's. A wait honours the engine deadline
/// (engine::Options::timeout): a neighbour that does not send in time is
/// named, the job is marked failed, and the Context ends it.

#include <parallax/detail/fault.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/engine/mpi.hpp>
#include <parallax/error.hpp>
#include <parallax/pipeline/grid.hpp>
#include <parallax/pipeline/schedule.hpp>
#include <parallax/types.hpp>

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <list>
#include <string>
#include <vector>

namespace parallax::pipeline {

/// The two links of one rank: to the previous and to the next stage of its
/// replica. Host memory.
class Channels {
 public:
  Channels(const Grid& grid, engine::Options options)
      : grid_(&grid), engine_(grid.world(), options), fault_(grid.world().comm()) {}
  Channels(const Channels&) = delete;
  Channels& operator=(const Channels&) = delete;
  ~Channels() {
    // Sends still in flight (a step that threw) are withdrawn before their
    // buffers go; after a failure the job ends anyway.
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || detail::job_failed()) return;
    for (auto& s : sends_) engine_.backend().cancel(s.exchange);
  }

  /// Sends `count` elements of type t, the `pass` of micro-batch `micro`:
  /// activations to the next stage, errors to the previous one. Returns at
  /// once (the data is copied).
  void send(Pass pass, int micro, const void* data, std::size_t count, DataType t) {
    reap();
    const int peer = pass == Pass::forward ? grid_->next_rank() : grid_->previous_rank();
    PARALLAX_EXPECTS(peer >= 0, "pipeline: stage ", grid_->stage(), " has no ", pass == Pass::forward ? "next" : "previous",
                     " stage to send to");
    Outgoing& out = sends_.emplace_back();
    out.bytes.resize(count * size_of(t));
    if (count) std::memcpy(out.bytes.data(), data, out.bytes.size());
    out.peer = peer;
    out.what = detail::concat(pass == Pass::forward ? "activations" : "errors", " of micro-batch ", micro);
    out.exchange = engine_.start_sendrecv(out.bytes.data(), count, peer, nullptr, 0, -1, t, tag(pass, micro));
  }

  /// Receives exactly `count` elements of type t, the `pass` of micro-batch
  /// `micro`: activations from the previous stage, errors from the next one.
  /// Throws if the message holds another count (naming both), or if none
  /// comes within the deadline (naming the neighbour; the job is then over).
  void recv(Pass pass, int micro, void* data, std::size_t count, DataType t) {
    const int peer = pass == Pass::forward ? grid_->previous_rank() : grid_->next_rank();
    PARALLAX_EXPECTS(peer >= 0, "pipeline: stage ", grid_->stage(), " has no ",
                     pass == Pass::forward ? "previous" : "next", " stage to receive from");
    const char* what = pass == Pass::forward ? "activations" : "errors";
    std::vector<std::byte> sink;  // a message of the wrong length lands here
    std::size_t got = 0;
    deadline(peer, what, micro, nullptr, [&] {
      got = engine_.recv_sized(t, peer, tag(pass, micro), [&](std::size_t n) -> void* {
        if (n == count) return data;
        sink.resize(n * size_of(t));
        return sink.data();
      });
    });
    if (got != count)
      throw error(detail::concat("pipeline: ", grid_->describe_rank(grid_->world().rank()), " expected ", count,
                                 " elements of ", what, " of micro-batch ", micro, " from ", grid_->describe_rank(peer),
                                 " but got ", got, " (do the ranks of one replica run the same batch size?)"));
  }

  /// Waits until every send has been delivered (within the deadline).
  void flush() {
    for (auto& s : sends_) deadline(s.peer, nullptr, 0, s.what.c_str(), [&] { engine_.wait(s.exchange); });
    sends_.clear();
  }

  /// Bytes sent and received so far.
  std::uint64_t sent_bytes() const noexcept { return engine_.stats().total().sent(); }
  std::uint64_t received_bytes() const noexcept { return engine_.stats().total().received(); }
  const engine::Options& options() const noexcept { return engine_.options(); }

 private:
  struct Outgoing {
    std::vector<std::byte> bytes;
    engine::Mpi::Exchange exchange;
    int peer = -1;
    std::string what;
  };

  static int tag(Pass pass, int micro) { return 2 * micro + (pass == Pass::backward ? 1 : 0); }

  /// Frees the sends that have completed.
  void reap() {
    for (auto it = sends_.begin(); it != sends_.end();) {
      if (engine_.done(it->exchange)) it = sends_.erase(it);
      else ++it;
    }
  }

  /// Runs `wait` (an engine wait). When the engine's deadline passes
  /// (timeout_error from a point-to-point call, the job still running), the
  /// neighbour `peer` is named as the one that did not send (or receive).
  template <class Wait>
  void deadline(int peer, const char* what, int micro, const char* sending, Wait&& wait) {
    try {
      wait();
      return;
    } catch (const timeout_error&) {
      if (detail::job_failed()) throw;  // the engine's own diagnosis (a lost peer)
    }
    detail::job_failed() = true;
    const auto timeout = engine_.options().timeout;
    const int me_rank = grid_->world().rank();
    const std::string me = grid_->describe_rank(me_rank);
    // A neighbour may be waiting itself, on a rank further along: the ranks
    // that gave up tell each other so (detail::FaultChannel, as the
    // trainer's deadlines do), and the ones that do not answer within a
    // deadline are the lost ones. Every rank then prints its report before
    // the job ends (settle), whichever gave up first.
    detail::Position mine;
    std::strncpy(mine.op, "pipeline wait", sizeof(mine.op) - 1);
    const auto heard = fault_.exchange(mine, timeout);
    std::string lost;
    for (std::size_t r = 0; r < heard.size(); ++r)
      if (!heard[r]) lost += detail::concat(lost.empty() ? "" : ", ", grid_->describe_rank(static_cast<int>(r)));
    const bool peer_waits = heard[static_cast<std::size_t>(peer)].has_value() && !lost.empty();
    const std::string why =
        peer_waits ? detail::concat(", which is waiting too: ", lost, " did not answer (failed, killed, or stuck outside "
                                                                      "the pipeline)")
        : sending  ? std::string(": it did not receive them (failed, killed, or stuck outside the pipeline)")
                   : std::string(": it did not send them (failed, killed, or stuck outside the pipeline)");
    const std::string report =
        sending ? detail::concat("parallax: ", me, " gave up after ", timeout.count(), " ms sending the ", sending,
                                 " to ", grid_->describe_rank(peer), why)
                : detail::concat("parallax: ", me, " gave up after ", timeout.count(), " ms waiting for the ", what,
                                 " of micro-batch ", micro, " from ", grid_->describe_rank(peer), why);
    std::fprintf(stderr, "%s\n", report.c_str());
    std::fflush(stderr);
    fault_.settle(heard, timeout);
    throw timeout_error(report);
  }

  const Grid* grid_;
  engine::Mpi engine_;
  detail::FaultChannel fault_;  // where the ranks that gave up say they are
  std::list<Outgoing> sends_;   // in flight; a list, so their buffers never move
};

}  // namespace parallax::pipeline
