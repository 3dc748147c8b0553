#pragma once
/// @file
/// Messages between neighbouring stages of one replica's pipeline, over
/// engines of their own (tagged, non-blocking point-to-point messages on
/// duplicates of the world's communicator). Protocol: the activations of
/// micro-batch m go from stage s to stage s + 1 with tag 2m, the errors
/// (gradients of those activations) from s + 1 back to s with tag 2m + 1.
/// Sends are non-blocking and copy their data, so a stage never waits to
/// send; a stage waits only for a message it needs next, and messages of one
/// tag between two ranks arrive in the order sent, so step k's message is
/// matched before step k + 1's. A wait honours the engine deadline
/// (engine::Options::timeout): a neighbour that does not send in time is
/// named, the job is marked failed, and the Context ends it.
///
/// Over host memory (engine::Mpi) a message is measured as it arrives, so a
/// neighbour that sends another length is named. Over device memory
/// (engine::Nccl, engine::MpiStaged: activations stay on the GPU) the
/// activations and the errors each have an engine of their own: NCCL has no
/// tags and runs a rank's operations in the order of its stream, so one
/// stream carrying both directions would hold a stage's next receive behind
/// a send its neighbour takes only later (two stages each sending first wait
/// on each other). On one engine per direction every stream carries messages
/// of one direction in micro-batch order, as the schedule takes them. Such a
/// receive has a fixed length: the replica's ranks agree on the batch's rows
/// by a host message before each run (check_rows), so a stage that runs
/// another batch size is named instead of corrupting a message.
#include <parallax/detail/fault.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/engine/mpi.hpp>
#include <parallax/error.hpp>
#include <parallax/pipeline/grid.hpp>
#include <parallax/pipeline/schedule.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <list>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace parallax::pipeline {

/// The two links of one rank: to the previous and to the next stage of its
/// replica, in Engine's memory space (engine::Mpi: host memory).
template <class Engine = engine::Mpi>
class Channels {
 public:
  using space = typename Engine::space;
  /// Whether a message is measured as it arrives (host engines), rather than
  /// received at the length the receiver expects (device engines).
  static constexpr bool measured = std::is_same_v<space, HostSpace>;

  Channels(const Grid& grid, engine::Options options)
      : grid_(&grid), engine_(grid.world(), options), errors_(make_errors(grid, options)),
        fault_(grid.world().comm()) {}
  Channels(const Channels&) = delete;
  Channels& operator=(const Channels&) = delete;
  ~Channels() {
    // Sends still in flight (a step that threw) are withdrawn before their
    // buffers go; after a failure the job ends anyway.
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || detail::job_failed()) return;
    for (auto& s : sends_) {
      if constexpr (measured) engine_.backend().cancel(s.exchange);
      else (void)link(s.pass).backend().cancel(s.exchange);
    }
  }

  /// Before a run on a device engine: this rank runs `rows` rows; the
  /// previous stage says how many it runs, and a rank whose neighbour runs
  /// another count throws naming both (a receive of the wrong length cannot
  /// be caught on a device engine). Nothing to do on a host engine, which
  /// measures every message.
  void check_rows(std::size_t rows) {
    if constexpr (!measured) {
      const std::int64_t mine = static_cast<std::int64_t>(rows);
      if (grid_->next_rank() >= 0) {
        auto& out = control_sends_.emplace_back(mine);
        control_sent_ += sizeof mine;
        control_x_.push_back(engine_.start_sendrecv(&out, 1, grid_->next_rank(), nullptr, 0, -1, DataType::i64,
                                                    kRowsTag));
      }
      if (grid_->previous_rank() >= 0) {
        std::int64_t theirs = 0;
        const int peer = grid_->previous_rank();
        deadline(peer, "batch size", 0, nullptr, [&] {
          auto x = engine_.start_sendrecv(nullptr, 0, -1, &theirs, 1, peer, DataType::i64, kRowsTag);
          engine_.wait(x);
        });
        control_received_ += sizeof theirs;
        if (theirs != mine)
          throw error(detail::concat("pipeline: ", grid_->describe_rank(grid_->world().rank()), " runs a batch of ",
                                     mine, " rows but ", grid_->describe_rank(peer), " runs ", theirs,
                                     " (the ranks of one replica must run the same batch size)"));
      }
    }
  }

  /// Sends `count` elements of type t, the `pass` of micro-batch `micro`:
  /// activations to the next stage, errors to the previous one. Returns at
  /// once (the data is copied).
  void send(Pass pass, int micro, const void* data, std::size_t count, DataType t) {
    reap();
    const int peer = pass == Pass::forward ? grid_->next_rank() : grid_->previous_rank();
    PARALLAX_EXPECTS(peer >= 0, "pipeline: stage ", grid_->stage(), " has no ", pass == Pass::forward ? "next" : "previous",
                     " stage to send to");
    Engine& e = link(pass);
    Outgoing& out = sends_.emplace_back();
    const std::size_t bytes = count * size_of(t);
    if constexpr (measured) {
      out.bytes.resize(bytes);
      if (count) std::memcpy(out.bytes.data(), data, bytes);
    } else {
      // Copied on the engine's stream, so the send that follows reads it.
      out.bytes.resize_discard(bytes);
      if (count) e.exec().copy(out.bytes.data(), data, bytes);
    }
    out.peer = peer;
    out.pass = pass;
    out.what = detail::concat(pass == Pass::forward ? "activations" : "errors", " of micro-batch ", micro);
    out.exchange = e.start_sendrecv(out.bytes.data(), count, peer, nullptr, 0, -1, t, tag(pass, micro));
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
    std::size_t got = count;
    if constexpr (measured) {
      std::vector<std::byte> sink;  // a message of the wrong length lands here
      deadline(peer, what, micro, nullptr, [&] {
        got = engine_.recv_sized(t, peer, tag(pass, micro), [&](std::size_t n) -> void* {
          if (n == count) return data;
          sink.resize(n * size_of(t));
          return sink.data();
        });
      });
    } else {
      Engine& e = link(pass);
      deadline(peer, what, micro, nullptr, [&] {
        auto x = e.start_sendrecv(nullptr, 0, -1, data, count, peer, t, tag(pass, micro));
        e.wait(x);
      });
    }
    if (got != count)
      throw error(detail::concat("pipeline: ", grid_->describe_rank(grid_->world().rank()), " expected ", count,
                                 " elements of ", what, " of micro-batch ", micro, " from ", grid_->describe_rank(peer),
                                 " but got ", got, " (do the ranks of one replica run the same batch size?)"));
  }

  /// Waits until every send has been delivered (within the deadline).
  void flush() {
    for (auto& s : sends_) deadline(s.peer, nullptr, 0, s.what.c_str(), [&] { link(s.pass).wait(s.exchange); });
    sends_.clear();
    if constexpr (!measured) {
      for (auto& x : control_x_)
        deadline(grid_->next_rank(), nullptr, 0, "batch size", [&] { engine_.wait(x); });
      control_x_.clear();
      control_sends_.clear();
    }
  }

  /// Bytes of activations and errors sent and received so far.
  std::uint64_t sent_bytes() const noexcept { return moved(true); }
  std::uint64_t received_bytes() const noexcept { return moved(false); }
  const engine::Options& options() const noexcept { return engine_.options(); }

 private:
  using Bytes = std::conditional_t<measured, std::vector<std::byte>, Buffer<std::byte, space>>;
  struct Outgoing {
    Bytes bytes;
    typename Engine::Exchange exchange;
    int peer = -1;
    Pass pass = Pass::forward;
    std::string what;
  };
  // The batch size goes ahead of micro-batch 0's activations with their tag:
  // messages of one tag between two ranks arrive in the order sent, and each
  // side takes the batch size first.
  static constexpr int kRowsTag = 0;

  static int tag(Pass pass, int micro) { return 2 * micro + (pass == Pass::backward ? 1 : 0); }

  /// The errors' own engine on a device engine (none on a host engine,
  /// whose one engine carries both directions).
  static std::unique_ptr<Engine> make_errors(const Grid& grid, const engine::Options& options) {
    if constexpr (measured) return nullptr;
    else return std::make_unique<Engine>(grid.world(), options);
  }
  /// The engine that carries a pass's messages.
  Engine& link(Pass pass) noexcept { return measured || pass == Pass::forward ? engine_ : *errors_; }

  std::uint64_t moved(bool sent) const noexcept {
    auto of = [&](const Engine& e) {
      const auto t = e.stats().total();
      return sent ? t.sent() : t.received();
    };
    std::uint64_t n = of(engine_);
    if (errors_) n += of(*errors_);
    return n - (sent ? control_sent_ : control_received_);  // the batch sizes are not the stages' messages
  }

  /// Frees the sends that have completed.
  void reap() {
    for (auto it = sends_.begin(); it != sends_.end();) {
      if (link(it->pass).done(it->exchange)) it = sends_.erase(it);
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
  Engine engine_;                   // both directions (host), or the activations (device)
  std::unique_ptr<Engine> errors_;  // device engines: the errors
  detail::FaultChannel fault_;      // where the ranks that gave up say they are
  std::list<Outgoing> sends_;       // in flight; a list, so their buffers never move
  std::list<std::int64_t> control_sends_;              // device engines: batch sizes in flight
  std::vector<typename Engine::Exchange> control_x_;  // and their exchanges
  std::uint64_t control_sent_ = 0, control_received_ = 0;  // bytes of batch sizes
};

}  // namespace parallax::pipeline
