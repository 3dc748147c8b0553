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
/// them, the link PARALLAX_PLAN_LINK describes ("1Gbit/s,60us": planning
/// only, for real hosts; "measure": the link as this job finds it, below),
/// else the emulated link of PARALLAX_LINK when set (docs/cluster.md), else
/// plan::Cluster's defaults. The step's own compute is the same
/// under every architecture and left out; the local costs are
/// plan::LocalCosts' defaults (docs/cluster.md, "Calibration").

#include <parallax/link/emulation.hpp>
#include <parallax/parallax.hpp>
#include <parallax/plan/model.hpp>

#include "progress.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace examples {

namespace px = parallax;

/// The link between hosts as this job finds it (PARALLAX_PLAN_LINK=measure):
/// one rank per host sends `bytes` to every other host at once
/// (MPI_Alltoall, every host sending, as a step's exchanges do), once
/// untimed and `reps` times timed; the median of the slowest host's times
/// gives the rate a host gets, its latency included. What a nominal rate
/// leaves out shows in it: TCP's and MPI's per-byte CPU work, several hosts'
/// stacks on shared cores. The latency stays plan::Cluster's default: a
/// small exchange's time over TCP measures the transport's timers (delayed
/// acknowledgements: 40-45 ms at 4 hosts here), not a step's per-call cost.
/// Collective; every rank gets rank 0's result.
inline px::plan::Link measure_inter_link(const px::Context& ctx, std::size_t bytes = std::size_t(4) << 20,
                                         int reps = 5) {
  const auto& topo = ctx.topology();
  double rate = 0;
  MPI_Comm leaders = MPI_COMM_NULL;
  PARALLAX_MPI_CHECK(MPI_Comm_split(ctx.comm(), topo.local_rank() == 0 ? 0 : MPI_UNDEFINED, ctx.rank(), &leaders));
  if (leaders != MPI_COMM_NULL) {
    int hosts = 1;
    PARALLAX_MPI_CHECK(MPI_Comm_size(leaders, &hosts));
    std::vector<char> send(bytes * static_cast<std::size_t>(hosts), 1), recv(send.size());
    std::vector<double> times;
    for (int r = 0; r <= reps; ++r) {
      PARALLAX_MPI_CHECK(MPI_Barrier(leaders));
      const double start = MPI_Wtime();
      PARALLAX_MPI_CHECK(MPI_Alltoall(send.data(), static_cast<int>(bytes), MPI_BYTE, recv.data(),
                                      static_cast<int>(bytes), MPI_BYTE, leaders));
      double t = MPI_Wtime() - start;
      PARALLAX_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, leaders));
      if (r > 0) times.push_back(t);  // the first round sets the connections up
    }
    std::nth_element(times.begin(), times.begin() + reps / 2, times.end());
    const double t = times[static_cast<std::size_t>(reps / 2)];
    rate = t > 0 ? static_cast<double>(hosts - 1) * static_cast<double>(bytes) / t : 0;
    PARALLAX_MPI_CHECK(MPI_Comm_free(&leaders));
  }
  PARALLAX_MPI_CHECK(MPI_Bcast(&rate, 1, MPI_DOUBLE, 0, ctx.comm()));
  PARALLAX_EXPECTS(rate > 0, "PARALLAX_PLAN_LINK=measure: the exchange between hosts took no time");
  return {rate, px::plan::Cluster{}.inter.latency_s};
}

/// The job's cluster as plan::Model sees it. Collective.
inline px::plan::Cluster job_cluster(const px::Context& ctx) {
  px::plan::Cluster c;
  c.hosts = ctx.topology().num_hosts();
  c.ranks_per_host = ctx.max(ctx.topology().local_size());
  const char* planned = std::getenv("PARALLAX_PLAN_LINK");
  if (planned && std::strcmp(planned, "measure") == 0) {
    if (c.hosts > 1) c.inter = measure_inter_link(ctx);
    return c;
  }
  const auto link = px::link::parse_link(planned && *planned ? std::string(planned)
                                                               : px::engine::Options{}.from_environment().link);
  if (link.enabled()) c.inter = {link.bytes_per_second, link.latency_s};
  return c;
}

/// The chosen architecture's predicted communication and parallax's local
/// work per step, once choose_arch() ran (plan_check() compares it with the run).
struct ChosenPlan {
  std::string arch;
  double comm_s = -1, local_s = 0;
};
inline ChosenPlan& chosen_plan() {
  static ChosenPlan plan;
  return plan;
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
    const char* planned = std::getenv("PARALLAX_PLAN_LINK");
    const bool measured = planned && std::strcmp(planned, "measure") == 0 && cluster.hosts > 1;
    std::printf("--arch auto: %d hosts x %d ranks, inter-host %.3g Gbit/s %.3g us%s; predicted per step (no compute):\n",
                cluster.hosts, cluster.ranks_per_host, cluster.inter.bytes_per_second * 8 / 1e9,
                cluster.inter.latency_s * 1e6, measured ? " (measured)" : "");
    std::printf("%s--arch auto: chose %s\n", px::plan::Model::table(candidates).c_str(), best.arch.c_str());
    std::fflush(stdout);
  }
  chosen_plan() = {best.arch, best.comm_s, best.local_s};
  return best.arch;
}

/// After an --arch auto run, on rank 0: the predicted step (the plan's
/// communication and local work, plus the time this run spent outside
/// parallax: the model's own compute and its batches, which the plan takes
/// as given) against the measured one. Nothing without a plan.
inline void plan_check(const px::Context& ctx, const Summary& s) {
  const ChosenPlan& plan = chosen_plan();
  const std::uint64_t measured = s.steps > s.warmup ? s.steps - s.warmup : 0;
  if (plan.comm_s < 0 || measured == 0 || !ctx.is_root()) return;
  const double step = s.seconds / static_cast<double>(measured);
  const double outside = step * (1 - s.share[static_cast<int>(Part::parallax)]);
  const double predicted = plan.comm_s + plan.local_s + outside;
  std::printf("plan: %s predicted step %.2f ms (communication %.2f + parallax's local work %.2f, predicted; the model "
              "and its batches %.2f, measured), measured %.2f ms: predicted / measured %.2f\n",
              plan.arch.c_str(), 1e3 * predicted, 1e3 * plan.comm_s, 1e3 * plan.local_s, 1e3 * outside, 1e3 * step,
              predicted / step);
}

}  // namespace examples
