// parallax-plan: the predicted step of each architecture on a cluster that
// need not be this one, from a cluster file and a model file (INI; see
// plan_files.hpp and docs/cluster.md), without MPI: plan a cluster run from
// a laptop.
//
//   parallax-plan --cluster examples/tools/parallax_plan/paper_cluster.ini
//                 --model examples/tools/parallax_plan/lm1b.ini
#include "plan_files.hpp"

#include <boost/program_options.hpp>

#include <algorithm>
#include <iomanip>
#include <iostream>

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  std::string cluster_path, model_path, costs_path, link, intra, partitions;
  int hosts = 0, per_host = 0;
  po::options_description desc("parallax-plan: a training step's predicted cost per architecture");
  desc.add_options()
    ("help,h", "print this help and exit")
    ("cluster", po::value(&cluster_path)->required(), "cluster file (INI: [cluster] hosts, ranks_per_host, inter, intra)")
    ("model", po::value(&model_path)->required(), "model file (INI: [costs], one [variable.<name>] per variable)")
    ("costs", po::value(&costs_path),
     "local costs measured on the machine that will run (INI [costs], e.g. from bench/plan_costs.py), over the "
     "model file's")
    ("hosts", po::value(&hosts), "override the cluster file's hosts")
    ("ranks-per-host", po::value(&per_host), "override the cluster file's ranks_per_host")
    ("link", po::value(&link), "override the inter-host link, e.g. 10Gbit/s,20us")
    ("intra", po::value(&intra), "override the intra-host link")
    ("partitions", po::value(&partitions),
     "partition counts to try for the sharded variables, comma-separated (e.g. 48,96,192); default: each "
     "variable's own, or one per rank");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n(see --help)\n";
    return 2;
  }
  try {
    auto cluster = plan_files::read_file(cluster_path, plan_files::read_cluster);
    auto model = plan_files::read_file(model_path, plan_files::read_model);
    if (!costs_path.empty())
      model.costs = plan_files::read_file(costs_path, [&](std::istream& in, const std::string& file) {
        return plan_files::read_costs_file(in, file, model.costs);
      });
    if (hosts) cluster.hosts = hosts;
    if (per_host) cluster.ranks_per_host = per_host;
    auto override_link = [](const std::string& text, const char* what) {
      const auto s = parallax::link::parse_link(text);
      if (!s.enabled()) throw plan_files::bad_input(std::string("--") + what + ": a link needs a bandwidth above zero");
      return parallax::plan::Link{s.bytes_per_second, s.latency_s};
    };
    if (!link.empty()) cluster.inter = override_link(link, "link");
    if (!intra.empty()) cluster.intra = override_link(intra, "intra");

    const parallax::plan::Model m(cluster, model.variables, model.costs);
    std::vector<int> counts;
    for (std::size_t at = 0; at < partitions.size();) {
      const auto comma = std::min(partitions.find(',', at), partitions.size());
      const std::string one = partitions.substr(at, comma - at);
      std::size_t used = 0;
      int p = 0;
      try {
        p = std::stoi(one, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != one.size() || p < 1)
        throw plan_files::bad_input("--partitions: '" + one + "' is not a partition count (a whole number >= 1)");
      counts.push_back(p);
      at = comma + 1;
    }
    const auto c = counts.empty() ? m.candidates() : m.candidates(counts);
    const auto& hybrid = c.front();
    const auto& allreduce = *std::find_if(c.begin(), c.end(), [](const auto& e) { return e.arch == parallax::arch::AllReduce::name; });
    std::cout << cluster.hosts << " hosts x " << cluster.ranks_per_host << " ranks; inter-host "
              << cluster.inter.bytes_per_second * 8 / 1e9 << " Gbit/s, " << cluster.inter.latency_s * 1e6
              << " us; intra-host " << cluster.intra.bytes_per_second / 1e9 << " GB/s; sparse all-gather "
              << (cluster.ring_allgather ? "ring" : "direct") << "\n";
    std::cout << parallax::plan::Model::table(c);
    if (model.items_per_step) {
      std::cout << std::fixed << std::setprecision(0) << "items/s:";
      for (const auto& e : c)
        std::cout << " " << e.arch << (counts.empty() || !e.partitions ? "" : "/P" + std::to_string(e.partitions)) << " "
                  << static_cast<double>(model.items_per_step) * cluster.hosts * cluster.ranks_per_host / e.step_s();
      std::cout << "\n";
    }
    const auto& best = parallax::plan::Model::best(c);
    std::cout << std::setprecision(2) << "allreduce step / hybrid step: " << allreduce.step_s() / hybrid.step_s()
              << "; fastest: " << best.arch;
    if (best.partitions) std::cout << " with " << best.partitions << " partitions";
    std::cout << "\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
