#pragma once
/// @file
/// `--arch auto`: the architecture plan::Model predicts fastest for this
/// job's variables and topology, with one line per candidate on rank 0.
/// An example describes its variables (shapes; for a sparse one, the
/// distinct rows this rank touched per step in a sample of its first
/// steps) and passes the name it gets back to px::with_arch, so the choice
/// is overridable by naming an architecture instead.
///
/// The cluster is the job's: its hosts (real or emulated) and, between
/// them, the emulated link of PARALLAX_LINK when set (docs/cluster.md);
/// otherwise plan::Cluster's defaults. The step's own compute is the same
/// under every architecture and left out; the local costs are
/// plan::LocalCosts' defaults (docs/cluster.md, "Calibration").

#include <parallax/detail/link_emulation.hpp>
#include <parallax/parallax.hpp>
#include <parallax/plan/model.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace examples {

namespace px = parallax;

/// The job's cluster as plan::Model sees it. Collective.
inline px::plan::Cluster job_cluster(const px::Context& ctx) {
  px::plan::Cluster c;
  c.hosts = ctx.topology().num_hosts();
  c.ranks_per_host = ctx.max(ctx.topology().local_size());
  const auto link = px::detail::parse_link(px::engine::Options{}.from_environment().link);
  if (link.enabled()) c.inter = {link.bytes_per_second, link.latency_s};
  return c;
}

/// The fastest architecture's name for `variables` (sparse ones with
/// `touched` set to this rank's distinct rows per step). Collective; every
/// rank gets the same name.
inline std::string choose_arch(const px::Context& ctx, std::vector<px::plan::Variable> variables) {
  for (auto& v : variables)
    if (v.sparse) v.touched = ctx.max(v.touched);  // every rank plans with the same inputs
  const px::plan::Cluster cluster = job_cluster(ctx);
  const px::plan::Model model(cluster, variables);
  const auto candidates = model.candidates();
  const auto& best = px::plan::Model::best(candidates);
  if (ctx.is_root()) {
    std::printf("--arch auto: %d hosts x %d ranks, inter-host %.3g Gbit/s %.3g us; predicted per step (no compute):\n",
                cluster.hosts, cluster.ranks_per_host, cluster.inter.bytes_per_second * 8 / 1e9,
                cluster.inter.latency_s * 1e6);
    std::printf("%s--arch auto: chose %s\n", px::plan::Model::table(candidates).c_str(), best.arch.c_str());
    std::fflush(stdout);
  }
  return best.arch;
}

}  // namespace examples
