#pragma once
/// @file
/// link::Emulated<B>: an engine backend B whose calls between hosts take as
/// long as an emulated link would carry their bytes (link/emulation.hpp).
/// For tests and benchmarks on one machine of several emulated hosts
/// (PARALLAX_RANKS_PER_HOST): an engine over it,
///
///     using Engine = parallax::engine::Comm<parallax::link::Emulated<parallax::engine::backend::Mpi>>;
///
/// is the engine over B, with every call that moved bytes to or from another
/// host held back at completion until a link of engine::Options::link
/// (PARALLAX_LINK=10Gbit/s,20us) could have carried them; off (empty, "off",
/// or one host), it is B. It uses the facade's optional pacing hook
/// (engine/comm.hpp): `inter_host(sent, received)` for the inter-host bytes
/// the facade books, `completed()` after each wait.

#include <parallax/context.hpp>
#include <parallax/engine/backend/backend.hpp>
#include <parallax/engine/comm.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/link/emulation.hpp>

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace parallax::link {

template <class B>
class Emulated : public B {
 public:
  /// B's arguments; starts the emulation (collective over each host's ranks)
  /// when the options name a link and the job has more than one host.
  template <class... Extra>
  Emulated(const Context& ctx, MPI_Comm comm, const engine::Options& options, const engine::backend::Site& site,
           Extra&&... extra)
      : B(ctx, comm, options, site, std::forward<Extra>(extra)...) {
    const LinkSpec spec = parse_link(options.link);  // every rank parses the same text
    if (spec.enabled() && ctx.topology().num_hosts() > 1) link_.start(spec, ctx.host_comm());
  }

  /// The emulated link between hosts; disabled when off or with one host.
  const LinkSpec& link() const noexcept { return link_.spec(); }

  /// Pacing hook: the facade booked these inter-host bytes for the calls in
  /// flight; the link's clock starts with the first of them.
  void inter_host(std::size_t sent, std::size_t received) noexcept {
    if (!link_.enabled() || sent + received == 0) return;
    if (sent_ == 0 && received_ == 0) start_ = std::chrono::steady_clock::now();
    sent_ += sent;
    received_ += received;
  }
  /// Pacing hook: a wait completed; returns once the link could have
  /// carried the bytes booked since the last completion.
  void completed() {
    if (!link_.enabled() || (sent_ == 0 && received_ == 0)) return;
    link_.hold(start_, sent_, received_);
    sent_ = received_ = 0;
  }

 private:
  LinkEmulator link_;
  std::uint64_t sent_ = 0, received_ = 0;  // inter-host bytes since the last completion
  std::chrono::steady_clock::time_point start_;
};

}  // namespace parallax::link

namespace parallax::engine {
/// An emulated backend supports what B supports.
template <class B, class Op>
struct supports<link::Emulated<B>, Op> : supports<B, Op> {};
}  // namespace parallax::engine
