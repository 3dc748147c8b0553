#pragma once
/// @file
/// plan::Model: predicts, before a run, what one training step costs under
/// each architecture on a cluster that need not be this one: the bytes
/// every rank sends and receives (intra and inter host), the communication
/// and local time, the memory per rank, and the fastest candidate.
///
/// Bytes follow docs/design.md, "Byte accounting", the rules engine::Mpi
/// books and the tests assert; given every rank's ids they are exact (the
/// cases `tests/plan/model.cpp` checks against CommStats), given only rows
/// touched per rank they assume rows owned uniformly. Times are alpha-beta:
/// each call pays its link's latency, and its bytes over the slowest link
/// it crosses, a host's inter-host link shared by the host's ranks (as
/// tools/link's link/emulation.hpp emulates). docs/cluster.md lists every
/// assumption.
///
/// The architectures are arch::all's: each is priced by the policies it
/// routes dense and sparse variables to (pricing_of), so a new architecture
/// over the built-in synchronous policies needs nothing here; one over a
/// policy the planner has no model of is left out of the candidates.
///
/// A tool beside the library (tools/plan, the target parallax::plan): no
/// header of include/parallax includes it.

#include <parallax/arch.hpp>
#include <parallax/comm_stats.hpp>
#include <parallax/detail/ring.hpp>
#include <parallax/error.hpp>
#include <parallax/partition.hpp>
#include <parallax/types.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace parallax::plan {

/// A link kind: bandwidth (bytes per second) and latency (seconds).
struct Link {
  double bytes_per_second = 0;
  double latency_s = 0;
  double seconds(double bytes) const { return latency_s + bytes / bytes_per_second; }
};

/// Where the job runs: `hosts` hosts of `ranks_per_host` ranks, ranks
/// numbered host after host (rank r on host r / ranks_per_host).
struct Cluster {
  int hosts = 1;
  int ranks_per_host = 1;
  Link intra{10e9, 2e-6};   ///< between ranks of one host
  Link inter{1.25e9, 20e-6};  ///< a host's link to the others, shared by its ranks
  /// How the engine all-gathers sparse rows: direct messages to every peer
  /// (engine::Mpi) or a ring (engine::Nccl, engine::MpiStaged).
  bool ring_allgather = false;
  /// TrainerOptions::sharded.local_aggregation: the hybrid's push summed per
  /// host before it crosses hosts (with several hosts, some of several ranks).
  bool local_aggregation = true;
  int size() const noexcept { return hosts * ranks_per_host; }
  int host_of(int rank) const noexcept { return rank / ranks_per_host; }
  bool same_host(int a, int b) const noexcept { return host_of(a) == host_of(b); }
};

/// One of the model's variables, as the planner needs it.
struct Variable {
  std::string name;
  bool sparse = false;
  std::size_t rows = 0, cols = 1;
  DataType type = DataType::f32;
  int partitions = 0;  ///< ShardedPS partitions (arch::PS: dense ones too); 0: one per rank, at most one per row
  /// Sparse: the ids each rank looks up (and updates) in one step, one list
  /// per rank: the exact case. Left empty, `touched` describes them.
  std::vector<std::vector<index_t>> ids;
  /// Sparse, without ids: distinct rows a rank touches per step, spread
  /// uniformly over the rows and the owners.
  double touched = 0;
  std::size_t row_bytes() const { return cols * size_of(type); }
  static Variable dense_of(std::string name, std::size_t rows, std::size_t cols, DataType t = DataType::f32) {
    Variable v;
    v.name = std::move(name);
    v.rows = rows;
    v.cols = cols;
    v.type = t;
    return v;
  }
  /// A sparse variable of which each rank touches `touched` distinct rows a step.
  static Variable sparse_of(std::string name, std::size_t rows, std::size_t cols, double touched = 0,
                            DataType t = DataType::f32) {
    Variable v = dense_of(std::move(name), rows, cols, t);
    v.sparse = true;
    v.touched = touched;
    return v;
  }
  std::size_t bytes() const { return rows * row_bytes(); }
};

/// Local costs per step, in seconds, calibrated on the machine that will run
/// (docs/cluster.md, "Calibration").
struct LocalCosts {
  double gather_per_byte = 1.0 / 11.5e9;    ///< reading rows out of a table
  double coalesce_per_byte = 1.0 / 16.8e9;  ///< summing received rows by id
  double update_per_byte = 1.0 / 8.2e9;     ///< a sparse optimizer update, per byte of the rows
  double dense_update_per_byte = 1.0 / 8.2e9;  ///< the dense optimizer update
  double sort_per_id = 4.3e-9;              ///< grouping ids by owner and de-duplicating
  double compute_s = 0;  ///< the model's own forward and backward per step (one rank's batch)
  int optimizer_slots = 1;  ///< optimizer state per value (SGD 0, Adagrad 1, Adam 2), for memory
};

/// How the planner prices the variables a policy synchronises: a fused
/// ring all-reduce, rows sharded over the ranks (pulled and pushed), rows
/// all-gathered; `none` for a policy it has no model of (AsyncPS, a user's).
enum class Pricing { none, ring, sharded, gathered };

template <class Policy>
constexpr Pricing pricing_of() {
  if constexpr (std::is_same_v<Policy, RingAllReduce>) return Pricing::ring;
  else if constexpr (std::is_same_v<Policy, ShardedPS>) return Pricing::sharded;
  else if constexpr (std::is_same_v<Policy, AllGatherv>) return Pricing::gathered;
  else return Pricing::none;
}

/// Whether the planner can price architecture Arch: dense variables all-reduced
/// or sharded, sparse ones sharded or all-gathered.
template <class Arch>
constexpr bool priced() {
  constexpr Pricing dense = pricing_of<typename Arch::template policy<Dense>>();
  constexpr Pricing sparse = pricing_of<typename Arch::template policy<Sparse>>();
  return (dense == Pricing::ring || dense == Pricing::sharded) &&
         (sparse == Pricing::sharded || sparse == Pricing::gathered);
}

/// One architecture's predicted step.
struct Estimate {
  std::string arch;
  int partitions = 0;  ///< of the sparse variables under ShardedPS (0: none sharded)
  std::vector<Traffic> bytes;  ///< per rank, a step (Traffic::calls: engine calls)
  double comm_s = 0, local_s = 0, compute_s = 0;
  double step_s() const { return comm_s + local_s + compute_s; }
  std::uint64_t memory_bytes = 0;  ///< values and optimizer state of the busiest rank
  /// The busiest rank's bytes: the largest sent + received.
  Traffic busiest() const {
    Traffic most;
    for (const auto& t : bytes)
      if (t.sent() + t.received() > most.sent() + most.received()) most = t;
    return most;
  }
};

/// Predicts steps per architecture and picks the fastest.
class Model {
 public:
  Model(Cluster cluster, std::vector<Variable> variables, LocalCosts costs = {})
      : cluster_(cluster), vars_(std::move(variables)), costs_(costs) {
    const int n = cluster_.size();
    PARALLAX_EXPECTS(cluster_.hosts >= 1 && cluster_.ranks_per_host >= 1, "plan::Model: the cluster needs hosts >= 1 "
                     "and ranks_per_host >= 1, got ", cluster_.hosts, " and ", cluster_.ranks_per_host);
    PARALLAX_EXPECTS(cluster_.inter.bytes_per_second > 0 && cluster_.intra.bytes_per_second > 0,
                     "plan::Model: link bandwidths must be above zero");
    for (const auto& v : vars_) {
      PARALLAX_EXPECTS(v.rows > 0 && v.cols > 0, "plan::Model: variable '", v.name, "' has no rows or columns");
      if (!v.sparse) continue;
      PARALLAX_EXPECTS(v.ids.empty() || v.ids.size() == static_cast<std::size_t>(n), "plan::Model: variable '",
                       v.name, "' has ids of ", v.ids.size(), " ranks; the cluster has ", n);
      for (const auto& r : v.ids)
        for (index_t id : r)
          PARALLAX_EXPECTS(id >= 0 && static_cast<std::size_t>(id) < v.rows, "plan::Model: variable '", v.name,
                           "' id ", id, " is outside [0, ", v.rows, ")");
    }
  }

  const Cluster& cluster() const noexcept { return cluster_; }

  /// The step under architecture Arch.
  template <class Arch>
  Estimate estimate() const {
    return estimate_as(Arch::name, pricing_of<typename Arch::template policy<Dense>>(),
                       pricing_of<typename Arch::template policy<Sparse>>());
  }

  /// The step under the architecture of arch::all named `arch`.
  Estimate estimate(const std::string& arch) const {
    return arch::pick(
        arch::all{}, arch, [](auto a) { return std::string_view(decltype(a)::name); },
        [&](auto a) { return estimate<decltype(a)>(); },
        [&] {
          return detail::concat("plan::Model: unknown architecture '", arch, "': expected ", arch::names(arch::all{}));
        });
  }

 private:
  Estimate estimate_as(const std::string& arch, Pricing dense, Pricing sparse) const {
    PARALLAX_EXPECTS(dense == Pricing::ring || dense == Pricing::sharded, "plan::Model: architecture '", arch,
                     "' routes dense variables to a policy the planner does not price (it prices RingAllReduce and "
                     "ShardedPS)");
    PARALLAX_EXPECTS(sparse == Pricing::sharded || sparse == Pricing::gathered, "plan::Model: architecture '", arch,
                     "' routes sparse variables to a policy the planner does not price (it prices ShardedPS and "
                     "AllGatherv)");
    const int n = cluster_.size();
    Estimate e;
    e.arch = arch;
    e.bytes.assign(static_cast<std::size_t>(n), Traffic{});
    e.compute_s = costs_.compute_s;
    std::vector<double> local(static_cast<std::size_t>(n), 0.0), memory(static_cast<std::size_t>(n), 0.0);
    const double slots = 1.0 + costs_.optimizer_slots;

    // Dense variables: one fused all-reduce (RingAllReduce) or sharded rows
    // (ShardedPS).
    std::size_t dense_bytes = 0;
    for (const auto& v : vars_)
      if (!v.sparse) dense_bytes += v.bytes();
    if (dense_bytes) {
      if (dense == Pricing::sharded) {
        for (const auto& v : vars_)
          if (!v.sparse) dense_shards(v, e, local, memory);
      } else {
        // Sums in float: the element count of the fused buffer.
        const std::size_t count = dense_bytes / 4;
        Calls ring(n);
        for (int r = 0; r < n; ++r) {
          const auto s = detail::ring::allreduce_sent(count, n, r) * 4, g = detail::ring::allreduce_received(count, n, r) * 4;
          if (n > 1) {
            ring.add(r, detail::ring::mod(r + 1, n), s);
            (void)g;
          }
          local[static_cast<std::size_t>(r)] += static_cast<double>(dense_bytes) * costs_.dense_update_per_byte;
          memory[static_cast<std::size_t>(r)] += static_cast<double>(dense_bytes) * slots;
        }
        e.comm_s += ring.seconds(cluster_, n > 1 ? 2 * (n - 1) : 0);
        ring.book(cluster_, e.bytes);
      }
    }

    // Sparse variables.
    std::size_t groups = 0;
    {
      std::set<std::pair<std::size_t, int>> shapes;
      for (const auto& v : vars_)
        if (v.sparse) shapes.insert({v.cols, static_cast<int>(v.type)});
      groups = shapes.size();
    }
    bool any_sparse = false;
    std::map<std::pair<std::size_t, int>, GroupCalls> group_calls;
    for (const auto& v : vars_) {
      if (!v.sparse) continue;
      any_sparse = true;
      if (sparse == Pricing::gathered) all_gathered(v, e, local, memory);
      else sharded(v, local, memory, groups, group_calls.try_emplace({v.cols, static_cast<int>(v.type)}, n).first->second);
    }
    for (const auto& [shape, calls] : group_calls) sharded_calls(calls, e);
    if (any_sparse && sparse == Pricing::sharded) e.partitions = partitions_of(first_sparse());

    for (int r = 0; r < n; ++r) {
      e.local_s = std::max(e.local_s, local[static_cast<std::size_t>(r)]);
      e.memory_bytes = std::max<std::uint64_t>(e.memory_bytes, static_cast<std::uint64_t>(memory[static_cast<std::size_t>(r)]));
    }
    return e;
  }


 public:
  /// The estimate of every architecture of arch::all the planner prices
  /// (priced()), in the list's order (hybrid, allreduce, ps).
  std::vector<Estimate> candidates() const {
    std::vector<Estimate> out;
    arch::for_each(arch::all{}, [&](auto a) { add_candidates<decltype(a)>(out, nullptr, false); });
    return out;
  }

  /// The architectures that shard sparse variables (hybrid, ps), each at
  /// every partition count of its sharded variables (every sparse one, and
  /// dense ones it shards, get P, at most one per row), then the others
  /// (allreduce), in arch::all's order: the candidates a partition search
  /// would try.
  std::vector<Estimate> candidates(const std::vector<int>& partitions) const {
    for (int p : partitions) PARALLAX_EXPECTS(p >= 1, "plan::Model: partition counts must be at least 1, got ", p);
    std::vector<Estimate> out;
    arch::for_each(arch::all{}, [&](auto a) { add_candidates<decltype(a)>(out, &partitions, true); });
    arch::for_each(arch::all{}, [&](auto a) { add_candidates<decltype(a)>(out, &partitions, false); });
    return out;
  }

  /// The candidate with the smallest predicted step (the first of equals).
  static const Estimate& best(const std::vector<Estimate>& c) {
    PARALLAX_EXPECTS(!c.empty(), "plan::Model::best of no candidates");
    std::size_t b = 0;
    for (std::size_t i = 1; i < c.size(); ++i)
      if (c[i].step_s() < c[b].step_s()) b = i;
    return c[b];
  }

  /// One line per candidate: step, communication, local, compute (ms),
  /// busiest rank's MiB sent intra/inter host, memory per rank (MiB).
  static std::string table(const std::vector<Estimate>& c) {
    std::ostringstream o;
    const Estimate& b = best(c);
    o << std::fixed;
    for (const auto& e : c) {
      const Traffic t = e.busiest();
      o << std::setw(9) << e.arch << "  step " << std::setprecision(3) << std::setw(10) << e.step_s() * 1e3
        << " ms  (comm " << std::setw(9) << e.comm_s * 1e3 << ", local " << std::setw(8) << e.local_s * 1e3
        << ", compute " << std::setw(8) << e.compute_s * 1e3 << ")  sent MiB intra " << std::setprecision(2)
        << std::setw(8) << static_cast<double>(t.sent_intra) / 1048576.0 << " inter " << std::setw(8)
        << static_cast<double>(t.sent_inter) / 1048576.0 << "  memory " << std::setprecision(1) << std::setw(9)
        << static_cast<double>(e.memory_bytes) / 1048576.0 << " MiB";
      if (e.partitions) o << "  P=" << e.partitions;
      if (&e == &b) o << "  <- fastest";
      o << "\n";
    }
    return o.str();
  }

 private:
  /// Appends A's estimate, if the planner prices A: with `partitions`, in
  /// the pass `sharding` of the architectures that shard sparse variables
  /// one per partition count, in the other pass the rest once; without,
  /// every priced architecture once.
  template <class A>
  void add_candidates(std::vector<Estimate>& out, const std::vector<int>* partitions, bool sharding) const {
    if constexpr (priced<A>()) {
      constexpr Pricing dense = pricing_of<typename A::template policy<Dense>>();
      constexpr bool shards = pricing_of<typename A::template policy<Sparse>>() == Pricing::sharded;
      if (!partitions) {
        out.push_back(estimate<A>());
      } else if (shards && sharding) {
        for (int p : *partitions) {
          Model m = *this;
          for (auto& v : m.vars_)
            if (v.sparse || dense == Pricing::sharded) v.partitions = static_cast<int>(std::min<std::size_t>(v.rows, p));
          out.push_back(m.estimate<A>());
          out.back().partitions = p;
        }
      } else if (!shards && !sharding) {
        out.push_back(estimate<A>());
      }
    }
  }

  /// The bytes of one engine call, by (rank, peer), and its time.
  struct Calls {
    explicit Calls(int n) : n_(n), sent_(static_cast<std::size_t>(n) * static_cast<std::size_t>(n), 0.0) {}
    void add(int from, int to, double bytes) { sent_[static_cast<std::size_t>(from) * n_ + static_cast<std::size_t>(to)] += bytes; }
    double at(int from, int to) const { return sent_[static_cast<std::size_t>(from) * n_ + static_cast<std::size_t>(to)]; }
    /// The call's time: every link it uses pays its latency (once per
    /// `rounds`) and its bytes at its bandwidth; a rank's intra-host bytes
    /// go over its own memory path, a host's inter-host bytes over the
    /// host's egress and ingress, shared by its ranks.
    double seconds(const Cluster& c, int rounds = 1) const {
      if (n_ <= 1) return 0;
      std::vector<double> out(static_cast<std::size_t>(c.hosts), 0.0), in(out.size(), 0.0);
      double intra = 0;
      bool any_intra = false, any_inter = false;
      for (int a = 0; a < static_cast<int>(n_); ++a) {
        double s = 0, r = 0;
        for (int b = 0; b < static_cast<int>(n_); ++b) {
          if (a == b) continue;
          if (c.same_host(a, b)) {
            s += at(a, b);
            r += at(b, a);
            any_intra = any_intra || c.ranks_per_host > 1;
          } else {
            out[static_cast<std::size_t>(c.host_of(a))] += at(a, b);
            in[static_cast<std::size_t>(c.host_of(b))] += at(a, b);
            any_inter = true;
          }
        }
        intra = std::max(intra, std::max(s, r));
      }
      double inter = 0;
      for (std::size_t h = 0; h < out.size(); ++h) inter = std::max(inter, std::max(out[h], in[h]));
      double t = 0;
      if (any_intra) t = std::max(t, rounds * c.intra.latency_s + intra / c.intra.bytes_per_second);
      if (any_inter) t = std::max(t, rounds * c.inter.latency_s + inter / c.inter.bytes_per_second);
      return t;
    }
    /// Adds the call's bytes to every rank's Traffic, and one call.
    void book(const Cluster& c, std::vector<Traffic>& bytes) const {
      for (int a = 0; a < static_cast<int>(n_); ++a) {
        auto& t = bytes[static_cast<std::size_t>(a)];
        for (int b = 0; b < static_cast<int>(n_); ++b) {
          if (a == b) continue;
          const auto s = static_cast<std::uint64_t>(at(a, b)), r = static_cast<std::uint64_t>(at(b, a));
          (c.same_host(a, b) ? t.sent_intra : t.sent_inter) += s;
          (c.same_host(a, b) ? t.recv_intra : t.recv_inter) += r;
        }
        ++t.calls;
      }
    }
    std::size_t n_;
    std::vector<double> sent_;
  };

  static std::uint64_t pad8(std::uint64_t b) { return (b + 7) / 8 * 8; }

  const Variable& first_sparse() const {
    for (const auto& v : vars_)
      if (v.sparse) return v;
    return vars_.front();
  }
  int partitions_of(const Variable& v) const {
    return v.partitions > 0 ? v.partitions : static_cast<int>(std::min<std::size_t>(v.rows, cluster_.size()));
  }

  /// Distinct rows each rank touches, by owner: u[i][p] (exact from ids,
  /// else uniform), and the distinct rows each owner holds updates for.
  struct Touch {
    std::vector<std::vector<double>> by_owner;  // [rank][owner]
    std::vector<double> distinct;               // per rank
    std::vector<double> owner_union;            // per owner: distinct rows over all ranks
    double all_union = 0;                       // distinct rows over all ranks
  };
  Touch touch(const Variable& v) const {
    const int n = cluster_.size();
    const auto un = static_cast<std::size_t>(n);
    Touch t;
    t.by_owner.assign(un, std::vector<double>(un, 0.0));
    t.distinct.assign(un, 0.0);
    t.owner_union.assign(un, 0.0);
    const PartitionMap map(v.rows, partitions_of(v), n);
    if (!v.ids.empty()) {
      std::set<index_t> all;
      std::vector<std::set<index_t>> owned(un);
      for (std::size_t r = 0; r < un; ++r) {
        const std::set<index_t> u(v.ids[r].begin(), v.ids[r].end());
        t.distinct[r] = static_cast<double>(u.size());
        for (index_t id : u) {
          const auto o = static_cast<std::size_t>(map.owner(id));
          t.by_owner[r][o] += 1;
          owned[o].insert(id);
          all.insert(id);
        }
      }
      for (std::size_t o = 0; o < un; ++o) t.owner_union[o] = static_cast<double>(owned[o].size());
      t.all_union = static_cast<double>(all.size());
      return t;
    }
    const double rows = static_cast<double>(v.rows), k = std::min(v.touched, rows);
    // Distinct rows over n ranks each touching k uniformly: rows (1 - (1 - k/rows)^n).
    t.all_union = rows * (1.0 - std::pow(1.0 - k / rows, n));
    for (std::size_t r = 0; r < un; ++r) {
      t.distinct[r] = k;
      for (std::size_t o = 0; o < un; ++o)
        t.by_owner[r][o] = k * static_cast<double>(map.shard_rows(static_cast<int>(o))) / rows;
    }
    for (std::size_t o = 0; o < un; ++o)
      t.owner_union[o] = t.all_union * static_cast<double>(map.shard_rows(static_cast<int>(o))) / rows;
    return t;
  }

  /// The calls of one table group under ShardedPS: its tables' rows
  /// travel together, one call of each kind a step
  /// (ShardedOptions::group_tables), so the group pays each latency once.
  struct GroupCalls {
    explicit GroupCalls(int n) : pull_route(n), reply(n), push(n), hop(n) {}
    Calls pull_route, reply, push, hop;
    bool shared = false, aggregate = false;
  };

  /// ShardedPS: a pull (route of ids, reply of rows) and a push (route of
  /// rows), added to the calls of v's table group; each route also carries
  /// an 8(G + 2)-byte header per peer for G table groups, shared among the
  /// group's tables. One host of several ranks reads rows from the owners'
  /// shared shards: no ids go out, the rows are booked as the owner's reply.
  void sharded(const Variable& v, std::vector<double>& local, std::vector<double>& memory, std::size_t groups,
               GroupCalls& calls) const {
    const int n = cluster_.size();
    const auto un = static_cast<std::size_t>(n);
    const Touch t = touch(v);
    const double row = static_cast<double>(v.row_bytes());
    const bool shared = cluster_.hosts == 1 && n > 1;
    const double header = 8.0 * static_cast<double>(groups + 2) / static_cast<double>(sparse_in_group(v));
    const bool aggregate = cluster_.local_aggregation && cluster_.hosts > 1 && cluster_.hosts < n;
    calls.shared = shared;
    calls.aggregate = aggregate;
    Calls &pull_route = calls.pull_route, &reply = calls.reply, &push = calls.push, &hop = calls.hop;
    for (int i = 0; i < n; ++i)
      for (int p = 0; p < n; ++p) {
        if (i == p) continue;
        const double u = t.by_owner[static_cast<std::size_t>(i)][static_cast<std::size_t>(p)];
        pull_route.add(i, p, header + (shared ? 0.0 : 8.0 * u));
        reply.add(p, i, row * u);
        if (!aggregate) push.add(i, p, header + block(v, u));
      }
    if (aggregate) aggregated_push(v, t, header, hop, push);
    const PartitionMap map(v.rows, partitions_of(v), n);
    for (std::size_t r = 0; r < un; ++r) {
      double served = 0;
      for (std::size_t j = 0; j < un; ++j) served += t.by_owner[j][r];
      local[r] += lookups(v, r) * costs_.sort_per_id * 2 + served * row * (costs_.gather_per_byte + costs_.coalesce_per_byte) +
                  t.owner_union[r] * row * costs_.update_per_byte;
      memory[r] += static_cast<double>(map.shard_rows(static_cast<int>(r))) * row * (1.0 + costs_.optimizer_slots);
    }
  }

  /// A table group's calls: their time, and their bytes booked.
  void sharded_calls(const GroupCalls& c, Estimate& e) const {
    e.comm_s += c.pull_route.seconds(cluster_) + (c.shared ? 0.0 : c.reply.seconds(cluster_)) +
                c.push.seconds(cluster_) + (c.aggregate ? c.hop.seconds(cluster_) : 0.0);
    c.pull_route.book(cluster_, e.bytes);
    c.reply.book(cluster_, e.bytes);
    if (c.shared)  // read in place: no call of its own
      for (auto& b : e.bytes) --b.calls;
    if (c.aggregate) c.hop.book(cluster_, e.bytes);
    c.push.book(cluster_, e.bytes);
  }

  /// A row block of `rows` rows on the wire: ids and values, padded to 8
  /// bytes (exact counts), or its mean size (rows touched uniformly).
  double block(const Variable& v, double rows) const {
    return exact(v) ? static_cast<double>(pad8(static_cast<std::uint64_t>(rows) * (8 + v.row_bytes())))
                    : rows * (8 + static_cast<double>(v.row_bytes()));
  }

  /// The push with local aggregation (several hosts, some of several
  /// ranks): hop 1 sends each row to its owner when the owner shares the
  /// host, else to the host's aggregator for that owner (its rank o mod L
  /// among the host's L ranks); hop 2 sends each aggregator's distinct rows
  /// on to their owners. Each hop is a route with a header to every peer.
  void aggregated_push(const Variable& v, const Touch& t, double header, Calls& hop1, Calls& hop2) const {
    const int n = cluster_.size(), per_host = cluster_.ranks_per_host;
    const auto un = static_cast<std::size_t>(n);
    auto via = [&](int i, int o) { return cluster_.same_host(i, o) ? o : cluster_.host_of(i) * per_host + o % per_host; };
    std::vector<std::vector<double>> first(un, std::vector<double>(un, 0.0)), second(un, std::vector<double>(un, 0.0));
    if (exact(v)) {
      const PartitionMap map(v.rows, partitions_of(v), n);
      std::vector<std::set<index_t>> held(un);  // rows each rank holds after hop 1
      for (int i = 0; i < n; ++i)
        for (index_t id : std::set<index_t>(v.ids[static_cast<std::size_t>(i)].begin(), v.ids[static_cast<std::size_t>(i)].end())) {
          const int a = via(i, map.owner(id));
          first[static_cast<std::size_t>(i)][static_cast<std::size_t>(a)] += 1;
          held[static_cast<std::size_t>(a)].insert(id);
        }
      for (std::size_t a = 0; a < un; ++a)
        for (index_t id : held[a]) second[a][static_cast<std::size_t>(map.owner(id))] += 1;
    } else {
      for (int i = 0; i < n; ++i)
        for (int o = 0; o < n; ++o) {
          const double u = t.by_owner[static_cast<std::size_t>(i)][static_cast<std::size_t>(o)];
          first[static_cast<std::size_t>(i)][static_cast<std::size_t>(via(i, o))] += u;
          if (!cluster_.same_host(i, o) && via(i, o) == i) {
            // This rank aggregates owner o's rows of its host's L ranks:
            // distinct among L uniform draws of u from the owner's rows.
            const double owned = static_cast<double>(v.rows) / n;
            second[static_cast<std::size_t>(i)][static_cast<std::size_t>(o)] +=
                owned * (1.0 - std::pow(1.0 - std::min(u / owned, 1.0), per_host));
          }
        }
    }
    for (int i = 0; i < n; ++i)
      for (int p = 0; p < n; ++p) {
        if (i == p) continue;
        hop1.add(i, p, header + block(v, first[static_cast<std::size_t>(i)][static_cast<std::size_t>(p)]));
        hop2.add(i, p, header + block(v, second[static_cast<std::size_t>(i)][static_cast<std::size_t>(p)]));
      }
  }

  /// AllGatherv: each rank's rows (ids and values, padded to 8 bytes) and
  /// its count reach every peer, by direct messages or around a ring; every
  /// rank sums all of them and updates its whole replica.
  void all_gathered(const Variable& v, Estimate& e, std::vector<double>& local, std::vector<double>& memory) const {
    const int n = cluster_.size();
    const auto un = static_cast<std::size_t>(n);
    const Touch t = touch(v);
    const double row = static_cast<double>(v.row_bytes());
    Calls counts(n), rows(n);
    double gathered = 0;
    std::vector<double> block(un);
    for (std::size_t r = 0; r < un; ++r) {
      gathered += t.distinct[r];
      block[r] = exact(v) ? static_cast<double>(pad8(static_cast<std::uint64_t>(t.distinct[r]) * (8 + v.row_bytes())))
                          : t.distinct[r] * (8 + row);
    }
    for (int i = 0; i < n; ++i) {
      if (cluster_.ring_allgather) {
        // Every block but the right neighbour's goes to i+1, in N-1 steps.
        if (n == 1) continue;
        const int right = detail::ring::mod(i + 1, n);
        double sent = 0;
        for (int j = 0; j < n; ++j)
          if (j != right) sent += block[static_cast<std::size_t>(j)];
        rows.add(i, right, sent);
        counts.add(i, right, 8.0 * (n - 1));
        continue;
      }
      for (int p = 0; p < n; ++p)
        if (p != i) {
          counts.add(i, p, 8);
          rows.add(i, p, block[static_cast<std::size_t>(i)]);
        }
    }
    // The counts and the rows: one call each, booked as one.
    const int rounds = cluster_.ring_allgather && n > 1 ? n - 1 : 1;
    e.comm_s += counts.seconds(cluster_, rounds) + rows.seconds(cluster_, rounds);
    rows.book(cluster_, e.bytes);
    std::vector<Traffic> c(un);
    counts.book(cluster_, c);
    for (std::size_t r = 0; r < un; ++r) {
      c[r].calls = 0;
      e.bytes[r] += c[r];
      local[r] += lookups(v, r) * costs_.sort_per_id + t.distinct[r] * row * costs_.gather_per_byte +
                  gathered * row * costs_.coalesce_per_byte + t.all_union * row * costs_.update_per_byte;
      memory[r] += static_cast<double>(v.bytes()) * (1.0 + costs_.optimizer_slots);
    }
  }

  /// arch::PS's dense variable: an alltoallv of each owner's rows of the
  /// gradient, then an all-gather (ring) of the updated shards.
  void dense_shards(const Variable& v, Estimate& e, std::vector<double>& local, std::vector<double>& memory) const {
    const int n = cluster_.size();
    const PartitionMap map(v.rows, partitions_of(v), n);
    const double row = static_cast<double>(v.row_bytes());
    Calls scatter(n), gather(n);
    for (int i = 0; i < n; ++i)
      for (int p = 0; p < n; ++p)
        if (p != i) scatter.add(i, p, static_cast<double>(map.shard_rows(p)) * row);
    // Ring all-gather: every block but the right neighbour's goes to i+1.
    for (int i = 0; i < n && n > 1; ++i)
      gather.add(i, detail::ring::mod(i + 1, n),
                 static_cast<double>(v.rows - map.shard_rows(detail::ring::mod(i + 1, n))) * row);
    e.comm_s += scatter.seconds(cluster_) + gather.seconds(cluster_, n > 1 ? n - 1 : 0);
    scatter.book(cluster_, e.bytes);
    gather.book(cluster_, e.bytes);
    for (int r = 0; r < n; ++r) {
      const double mine = static_cast<double>(map.shard_rows(r)) * row;
      local[static_cast<std::size_t>(r)] += mine * costs_.dense_update_per_byte;
      memory[static_cast<std::size_t>(r)] += static_cast<double>(v.bytes()) + mine * costs_.optimizer_slots;
    }
  }

  bool exact(const Variable& v) const { return !v.ids.empty(); }
  double lookups(const Variable& v, std::size_t r) const {
    return v.ids.empty() ? v.touched : static_cast<double>(v.ids[r].size());
  }
  /// Sparse variables sharing v's group (same width and type): they share
  /// each route's header.
  std::size_t sparse_in_group(const Variable& v) const {
    std::size_t k = 0;
    for (const auto& w : vars_)
      if (w.sparse && w.cols == v.cols && w.type == v.type) ++k;
    return std::max<std::size_t>(k, 1);
  }

  Cluster cluster_;
  std::vector<Variable> vars_;
  LocalCosts costs_;
};

}  // namespace parallax::plan
