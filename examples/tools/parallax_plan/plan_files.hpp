#pragma once
/// @file
/// parallax-plan's input files: a cluster file and a model file, both INI
/// (read by Boost.Program_options), turned into a plan::Cluster, the model's
/// plan::Variables and its plan::LocalCosts. Every problem is reported as an
/// error that names the file and the field ("model.ini: variable.emb.rows:
/// missing").
///
///   # cluster.ini                        # model.ini
///   [cluster]                            [costs]
///   hosts = 8                            gather = 1933GB/s
///   ranks_per_host = 6                   coalesce = 1306GB/s
///   inter = 100Gbit/s,5us                update = 1306GB/s
///   intra = 100GB/s,5us                  dense_update = 1306GB/s
///   allgather = ring                     sort_per_id = 1ns
///                                        compute = 250ms
///                                        optimizer_slots = 1
///                                        [variable.emb]
///                                        kind = sparse
///                                        rows = 793470
///                                        cols = 512
///                                        touched = 1200

#include <parallax/link/emulation.hpp>
#include <parallax/plan/model.hpp>

#include <boost/program_options.hpp>

#include <algorithm>
#include <fstream>
#include <istream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace plan_files {

namespace px = parallax;
namespace po = boost::program_options;

/// A problem in an input file, naming the file and the field.
struct bad_input : px::error {
  using px::error::error;
};

/// The fields of one INI stream, "section.key" -> value, in file order.
class Fields {
 public:
  Fields(std::istream& in, std::string file) : file_(std::move(file)) {
    po::options_description none;
    po::parsed_options parsed(&none);
    try {
      parsed = po::parse_config_file(in, none, true);
    } catch (const std::exception& e) {
      throw bad_input(file_ + ": " + e.what());
    }
    for (const auto& o : parsed.options) {
      if (o.value.empty()) continue;
      if (!values_.emplace(o.string_key, o.value.front()).second)
        throw bad_input(file_ + ": " + o.string_key + ": given twice");
      order_.push_back(o.string_key);
    }
  }
  const std::string& file() const noexcept { return file_; }
  const std::vector<std::string>& keys() const noexcept { return order_; }
  bool has(const std::string& key) const { return values_.count(key) > 0; }
  /// The value of `key`; a missing key is an error naming it.
  const std::string& text(const std::string& key) const {
    used_.insert(key);
    auto it = values_.find(key);
    if (it == values_.end()) throw bad_input(file_ + ": " + key + ": missing");
    return it->second;
  }
  /// An unsigned whole number, at least `least`.
  std::size_t count(const std::string& key, std::size_t least = 1) const {
    const std::string& t = text(key);
    std::size_t used = 0;
    unsigned long long v = 0;
    try {
      v = std::stoull(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != t.size() || t.empty() || t[0] == '-')
      throw bad_input(file_ + ": " + key + ": '" + t + "' is not a whole number");
    if (v < least) throw bad_input(file_ + ": " + key + ": " + t + " is below " + std::to_string(least));
    return static_cast<std::size_t>(v);
  }
  /// A value with units (a bandwidth or a time), via `parse`.
  template <class Parse>
  auto with_units(const std::string& key, Parse&& parse) const {
    const std::string& t = text(key);
    try {
      return parse(t);
    } catch (const std::exception& e) {
      throw bad_input(file_ + ": " + key + ": " + e.what());
    }
  }
  /// Every key that no one read: an error naming the first (a misspelt field).
  void check_all_used() const {
    for (const auto& k : order_)
      if (!used_.count(k)) throw bad_input(file_ + ": " + k + ": unknown field");
  }

 private:
  std::string file_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> order_;
  mutable std::set<std::string> used_;
};

inline px::plan::Link link_of(const Fields& f, const std::string& key) {
  const auto s = f.with_units(key, [](const std::string& t) { return px::link::parse_link(t); });
  if (!s.enabled()) throw bad_input(f.file() + ": " + key + ": a link needs a bandwidth above zero");
  return {s.bytes_per_second, s.latency_s};
}

/// A rate ("1933GB/s") as seconds per byte.
inline double per_byte(const Fields& f, const std::string& key) {
  return 1.0 / link_of(f, key).bytes_per_second;
}

/// A time ("250ms", "1ns") in seconds.
inline double seconds(const Fields& f, const std::string& key) {
  return f.with_units(key, [](const std::string& t) {
    static const std::pair<const char*, double> units[] = {{"s", 1.0}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}};
    return px::link::parse_quantity(t, "time", t, units);
  });
}

inline px::plan::Cluster read_cluster(std::istream& in, const std::string& file) {
  Fields f(in, file);
  px::plan::Cluster c;
  c.hosts = static_cast<int>(f.count("cluster.hosts"));
  c.ranks_per_host = static_cast<int>(f.count("cluster.ranks_per_host"));
  c.inter = link_of(f, "cluster.inter");
  c.intra = link_of(f, "cluster.intra");
  if (f.has("cluster.allgather")) {
    const std::string& a = f.text("cluster.allgather");
    if (a != "ring" && a != "direct")
      throw bad_input(file + ": cluster.allgather: '" + a + "' is neither ring nor direct");
    c.ring_allgather = a == "ring";
  }
  f.check_all_used();
  return c;
}

struct ModelFile {
  std::vector<px::plan::Variable> variables;
  px::plan::LocalCosts costs;
  std::size_t items_per_step = 0;  ///< examples (or words) a rank trains on per step, for items/s
};

/// The [costs] rates and times present in `f` (compute required when
/// `need_compute`), over `c`.
inline void read_costs(const Fields& f, px::plan::LocalCosts& c, bool need_compute) {
  if (f.has("costs.gather")) c.gather_per_byte = per_byte(f, "costs.gather");
  if (f.has("costs.coalesce")) c.coalesce_per_byte = per_byte(f, "costs.coalesce");
  if (f.has("costs.update")) c.update_per_byte = per_byte(f, "costs.update");
  if (f.has("costs.dense_update")) c.dense_update_per_byte = per_byte(f, "costs.dense_update");
  if (f.has("costs.sort_per_id")) c.sort_per_id = seconds(f, "costs.sort_per_id");
  if (need_compute || f.has("costs.compute")) c.compute_s = seconds(f, "costs.compute");
  if (f.has("costs.optimizer_slots")) c.optimizer_slots = static_cast<int>(f.count("costs.optimizer_slots", 0));
}

/// A costs file (bench/plan_costs.py writes one from this machine's
/// bench_row_kernels): [costs] fields only, each overriding the model file's.
inline px::plan::LocalCosts read_costs_file(std::istream& in, const std::string& file, px::plan::LocalCosts c) {
  Fields f(in, file);
  read_costs(f, c, false);
  f.check_all_used();
  return c;
}

inline ModelFile read_model(std::istream& in, const std::string& file) {
  Fields f(in, file);
  ModelFile m;
  read_costs(f, m.costs, true);
  if (f.has("costs.items_per_step")) m.items_per_step = f.count("costs.items_per_step");
  // Variables: one section each, in file order.
  std::vector<std::string> names;
  for (const auto& k : f.keys()) {
    if (k.rfind("variable.", 0) != 0) continue;
    const auto dot = k.find('.', 9);
    if (dot == std::string::npos) throw bad_input(file + ": " + k + ": a field outside a [variable.<name>] section");
    const std::string name = k.substr(9, dot - 9);
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  if (names.empty()) throw bad_input(file + ": variable: no [variable.<name>] section");
  for (const auto& name : names) {
    const std::string p = "variable." + name + ".";
    const std::string& kind = f.text(p + "kind");
    if (kind != "sparse" && kind != "dense")
      throw bad_input(file + ": " + p + "kind: '" + kind + "' is neither sparse nor dense");
    auto v = kind == "sparse" ? px::plan::Variable::sparse_of(name, f.count(p + "rows"), f.count(p + "cols"))
                              : px::plan::Variable::dense_of(name, f.count(p + "rows"), f.count(p + "cols"));
    if (f.has(p + "type")) {
      const std::string& t = f.text(p + "type");
      if (t == "f32") v.type = px::DataType::f32;
      else if (t == "f64") v.type = px::DataType::f64;
      else throw bad_input(file + ": " + p + "type: '" + t + "' is neither f32 nor f64");
    }
    if (v.sparse) {
      v.touched = static_cast<double>(f.count(p + "touched"));
      if (v.touched > static_cast<double>(v.rows))
        throw bad_input(file + ": " + p + "touched: " + f.text(p + "touched") + " is more than the " +
                        std::to_string(v.rows) + " rows");
      if (f.has(p + "partitions")) v.partitions = static_cast<int>(f.count(p + "partitions", 0));
    }
    m.variables.push_back(std::move(v));
  }
  f.check_all_used();
  return m;
}

/// Opens `path` and reads it with `read`; a missing file is an error naming it.
template <class Read>
auto read_file(const std::string& path, Read&& read) {
  std::ifstream in(path);
  if (!in) throw bad_input(path + ": cannot be opened");
  return read(in, path);
}

}  // namespace plan_files
