#pragma once
/// @file
/// Messages between neighbouring stages of one replica's pipeline, on a
/// communicator of their own (a duplicate of the world's). Protocol: the
/// activations of micro-batch m go from stage s to stage s + 1 with tag 2m,
/// the errors (gradients of those activations) from s + 1 back to s with tag
/// 2m + 1. Sends are non-blocking and copy their data, so a stage never
/// waits to send; a stage waits only for a message it needs next, and
/// messages of one tag between two ranks arrive in the order sent, so step
/// k's message is matched before step k + 1's. A wait honours the engine
/// deadline (engine::Options::timeout): a neighbour that does not send in
/// time is named, the job is marked failed, and the Context ends it.

#include <parallax/detail/fault.hpp>
#include <parallax/detail/mpi.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/error.hpp>
#include <parallax/pipeline/grid.hpp>
#include <parallax/pipeline/schedule.hpp>
#include <parallax/types.hpp>

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <list>
#include <string>
#include <thread>
#include <vector>

namespace parallax::pipeline {

/// The two links of one rank: to the previous and to the next stage of its
/// replica. Host memory.
class Channels {
 public:
  Channels(const Grid& grid, engine::Options options)
      : grid_(&grid), options_(options.from_environment()), fault_(grid.world().comm()) {
    PARALLAX_MPI_CHECK(MPI_Comm_dup(grid.world().comm(), &comm_));
    PARALLAX_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    yield_ = options_.yield == engine::Options::Yield::always ||
             (options_.yield == engine::Options::Yield::automatic && grid.world().topology().oversubscribed());
  }
  Channels(const Channels&) = delete;
  Channels& operator=(const Channels&) = delete;
  ~Channels() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || detail::job_failed()) return;
    for (auto& s : sends_) {
      MPI_Cancel(&s.request);
      MPI_Request_free(&s.request);
    }
    MPI_Comm_free(&comm_);
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
    PARALLAX_MPI_CHECK(MPI_Isend(out.bytes.data(), detail::to_mpi_count(count), detail::mpi_datatype(t), peer,
                                 tag(pass, micro), comm_, &out.request));
    sent_bytes_ += out.bytes.size();
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
    int found = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    wait_for(peer, what, micro, [&] {
      const int rc = MPI_Improbe(peer, tag(pass, micro), comm_, &found, &message, &status);
      if (rc != MPI_SUCCESS) lost(peer, what, micro, detail::mpi_error_string(rc));
      return found != 0;
    });
    int got = 0;
    PARALLAX_MPI_CHECK(MPI_Get_count(&status, detail::mpi_datatype(t), &got));
    if (static_cast<std::size_t>(got) != count) {
      std::vector<std::byte> sink(static_cast<std::size_t>(got) * size_of(t));
      MPI_Mrecv(sink.data(), got, detail::mpi_datatype(t), &message, MPI_STATUS_IGNORE);
      throw error(detail::concat("pipeline: ", grid_->describe_rank(grid_->world().rank()), " expected ", count,
                                 " elements of ", what, " of micro-batch ", micro, " from ", grid_->describe_rank(peer),
                                 " but got ", got, " (do the ranks of one replica run the same batch size?)"));
    }
    PARALLAX_MPI_CHECK(MPI_Mrecv(data, got, detail::mpi_datatype(t), &message, MPI_STATUS_IGNORE));
    received_bytes_ += count * size_of(t);
  }

  /// Waits until every send has been delivered (within the deadline).
  void flush() {
    for (auto& s : sends_) {
      wait_for(s.peer, nullptr, 0, [&] {
        int done = 0;
        const int rc = MPI_Test(&s.request, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) lost(s.peer, s.what.c_str(), -1, detail::mpi_error_string(rc));
        return done != 0;
      }, s.what.c_str());
    }
    sends_.clear();
  }

  /// Bytes sent and received so far.
  std::uint64_t sent_bytes() const noexcept { return sent_bytes_; }
  std::uint64_t received_bytes() const noexcept { return received_bytes_; }
  const engine::Options& options() const noexcept { return options_; }

 private:
  struct Outgoing {
    std::vector<std::byte> bytes;
    MPI_Request request = MPI_REQUEST_NULL;
    int peer = -1;
    std::string what;
  };

  static int tag(Pass pass, int micro) { return 2 * micro + (pass == Pass::backward ? 1 : 0); }

  /// Frees the sends that have completed.
  void reap() {
    for (auto it = sends_.begin(); it != sends_.end();) {
      int done = 0;
      if (MPI_Test(&it->request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) it = sends_.erase(it);
      else ++it;
    }
  }

  /// Polls `ready` until it returns true or the deadline passes; then the
  /// neighbour `peer` is named as the one that did not send (or receive).
  template <class Ready>
  void wait_for(int peer, const char* what, int micro, Ready&& ready, const char* sending = nullptr) {
    const bool timed = options_.timeout.count() > 0;
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    for (std::uint32_t spins = 0;; ++spins) {
      if (ready()) return;
      if (timed && (spins & 63u) == 0 && std::chrono::steady_clock::now() > deadline) break;
      if (yield_) std::this_thread::yield();
    }
    detail::job_failed() = true;
    const int me_rank = grid_->world().rank();
    const std::string me = grid_->describe_rank(me_rank);
    // A neighbour may be waiting itself, on a rank further along: the ranks
    // that gave up tell each other so (detail::FaultChannel, as the
    // trainer's deadlines do), and the ones that do not answer within a
    // deadline are the lost ones. Every rank then prints its report before
    // the job ends (settle), whichever gave up first.
    detail::Position mine;
    std::strncpy(mine.op, "pipeline wait", sizeof(mine.op) - 1);
    const auto heard = fault_.exchange(mine, options_.timeout);
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
        sending ? detail::concat("parallax: ", me, " gave up after ", options_.timeout.count(), " ms sending the ",
                                 sending, " to ", grid_->describe_rank(peer), why)
                : detail::concat("parallax: ", me, " gave up after ", options_.timeout.count(), " ms waiting for the ",
                                 what, " of micro-batch ", micro, " from ", grid_->describe_rank(peer), why);
    std::fprintf(stderr, "%s\n", report.c_str());
    std::fflush(stderr);
    fault_.settle(heard, options_.timeout);
    throw timeout_error(report);
  }

  [[noreturn]] void lost(int peer, const char* what, int micro, const std::string& why) {
    detail::job_failed() = true;
    throw error(detail::concat("parallax: ", grid_->describe_rank(grid_->world().rank()), " lost ",
                               grid_->describe_rank(peer), " while moving the ", what,
                               micro >= 0 ? detail::concat(" of micro-batch ", micro) : std::string(), " (", why, ")"));
  }

  const Grid* grid_;
  engine::Options options_;
  detail::FaultChannel fault_;  // where the ranks that gave up say they are
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool yield_ = false;
  std::list<Outgoing> sends_;  // in flight; a list, so their buffers never move
  std::uint64_t sent_bytes_ = 0, received_bytes_ = 0;
};

}  // namespace parallax::pipeline
