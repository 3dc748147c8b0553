#pragma once
/// @file
/// Bags: multi-hot lookups pooled into one vector per bag (a user's clicked
/// items, the words of a query), as TorchRec's EmbeddingBagCollection and
/// FBGEMM's table-batched embeddings do.
///
/// A request names a sparse variable, `bags + 1` offsets and the ids, CSR
/// style (bag b holds ids[offsets[b] .. offsets[b + 1])), and a combiner:
///
/// * Combiner::sum          pooled[b] = sum of the bag's rows
/// * Combiner::mean         that sum divided by the bag's number of ids
///                          (repeats count; an empty bag stays zero)
/// * Combiner::weighted_sum sum of weights[j] * row(ids[j]), a weight per id
///
/// A bag of no ids pools to a zero vector. The pooled gradient (one row per
/// bag, BagGradient) flows back as d row(ids[j]) = g[b] for sum, g[b] / count
/// for mean and weights[j] * g[b] for weighted_sum: what the sum of a plain
/// lookup's rows, pooled by hand, would give. Where the pooling happens is
/// the policy's (docs/design.md, "Bags"); the results are the same.
///
/// The kernels below serve every place that pools: a rank pooling rows it
/// looked up (local pooling), an owner pooling the rows it holds of each bag
/// (ShardedPS), and a rank adding the owners' partial sums of its bags.

#include <parallax/detail/agreement.hpp>
#include <parallax/detail/algorithms.hpp>
#include <parallax/error.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace parallax {

/// How a bag's rows become one vector (see the file comment).
enum class Combiner { sum, mean, weighted_sum };

namespace detail {
/// names[e] for an enumerator numbered from 0 in declaration order, "?" past them.
template <class E, std::size_t N>
constexpr const char* name_in(E e, const char* const (&names)[N]) noexcept {
  const auto i = static_cast<std::size_t>(e);
  return i < N ? names[i] : "?";
}
}  // namespace detail

inline const char* to_string(Combiner c) noexcept { return detail::name_in(c, {"sum", "mean", "weighted_sum"}); }

/// Where a policy that can choose pools a request's bags (ShardedPS; the
/// others pool where the rows are looked up): at the owners of the rows, a
/// row per (bag, owner) pair each way; where they are looked up, a row per
/// unique id each way; or whichever moves fewer bytes for this batch, over
/// every rank (docs/design.md, "Bags").
enum class Pooling { automatic, owner, local };

inline const char* to_string(Pooling p) noexcept { return detail::name_in(p, {"automatic", "owner", "local"}); }

/// One request of a batched bag lookup: `offsets_count` offsets (bags + 1:
/// the first 0, ascending, the last n), `n` ids and, for weighted_sum, `n`
/// weights, all in the variable's memory space and valid until the lookup
/// returns. Requests of one batch share the variable type (CTAD reads it:
/// `px::Bags{emb, offsets, ids}`).
template <class V>
struct Bags {
  using value_type = typename V::value_type;
  using space = typename V::space;
  V* var;
  const index_t* offsets;
  std::size_t offsets_count;
  const index_t* ids;
  std::size_t n;
  Combiner combiner = Combiner::sum;
  const value_type* weights = nullptr;  ///< weighted_sum only
  Pooling pooling = Pooling::automatic;  ///< where ShardedPS pools (every rank alike)

  Bags(V& v, const index_t* offs, std::size_t offs_count, const index_t* i, std::size_t count,
       Combiner c = Combiner::sum, const value_type* w = nullptr)
      : var(&v), offsets(offs), offsets_count(offs_count), ids(i), n(count), combiner(c), weights(w) {}
  Bags(V& v, const Buffer<index_t, space>& offs, const Buffer<index_t, space>& i, Combiner c = Combiner::sum,
       const Buffer<value_type, space>* w = nullptr)
      : Bags(v, offs.data(), offs.size(), i.data(), i.size(), c, w && w->size() ? w->data() : nullptr) {}
  /// Host offsets, ids and weights, for variables in HostSpace.
  template <class S = space, std::enable_if_t<std::is_same_v<S, HostSpace>, int> = 0>
  Bags(V& v, const std::vector<index_t>& offs, const std::vector<index_t>& i, Combiner c = Combiner::sum,
       const std::vector<value_type>& w = {})
      : Bags(v, offs.data(), offs.size(), i.data(), i.size(), c, w.empty() ? nullptr : w.data()) {}

  /// This request, pooled at `p`.
  Bags& pooled_at(Pooling p) noexcept {
    pooling = p;
    return *this;
  }
  /// Number of bags (0 when the offsets are missing: a problem).
  std::size_t bags() const noexcept { return offsets_count ? offsets_count - 1 : 0; }
};

/// The gradient of one request's pooled rows: `bags x cols` values in the
/// variable's space (row b for bag b), valid until the call returns.
template <class V>
struct BagGradient {
  using value_type = typename V::value_type;
  using space = typename V::space;
  V* var;
  Rows<const value_type, space> values;

  BagGradient(V& v, const value_type* g, std::size_t r) : var(&v), values{g, r, v.cols()} {}
  BagGradient(V& v, const Rows<value_type, space>& g) : var(&v), values{g.data, g.rows, g.cols} {}
  BagGradient(V& v, const Buffer<value_type, space>& g) : BagGradient(v, g.data(), g.size(), Elements{}) {}
  /// Host values, for variables in HostSpace.
  template <class S = space, std::enable_if_t<std::is_same_v<S, HostSpace>, int> = 0>
  BagGradient(V& v, const std::vector<value_type>& g) : BagGradient(v, g.data(), g.size(), Elements{}) {}

 private:
  struct Elements {};
  /// `size` values end to end as rows of the variable's width; cols 0 when
  /// they do not fill whole rows (the check then names the shape given).
  BagGradient(V& v, const value_type* g, std::size_t size, Elements)
      : var(&v), values{g, size / v.cols(), size % v.cols() ? 0 : v.cols()} {}
};

namespace detail {

/// Pools bags with the coalesce's segment sum (detail/row_sums.hpp): a
/// bag's rows (segments: its offsets), an owner's rows of each (bag, owner)
/// pair, and a bag's partial sums from its owners; `divide` gives a mean
/// bag its count of ids.
template <class T, class R = T>
using PoolBags = SumSegments<T, R>;

/// Runs PoolBags over m bags: a thread per element on a device, a task per
/// bag on the host.
template <class T, class R, class Space>
void pool_segments(const Exec<Space>& ex, const PoolBags<T, R>& f, std::size_t m) {
  sum_segments(ex, f, m, 0, 4);
}

/// A pooled gradient as rows: for each bag b and k in [segments[b],
/// segments[b + 1]), ids_out[k] = ids[k] and row k of out = weights[k] *
/// grads.row(b) (no weights: grads.row(b) itself; `mean`: grads.row(b)
/// divided by the bag's number of ids, where each segment is a whole bag).
/// A bag at a time.
template <class T>
struct ExpandBags {
  RowsAt<T> grads;
  const index_t* segments;
  const T* weights;
  bool mean;
  const index_t* ids;
  index_t* ids_out;
  T* out;
  std::size_t cols;
  PARALLAX_HOST_DEVICE void operator()(std::size_t b) const {
    const T* g = grads.row(b, cols);
    for (index_t k = segments[b]; k < segments[b + 1]; ++k) {
      const auto uk = static_cast<std::size_t>(k);
      ids_out[uk] = ids[uk];
      T* o = out + uk * cols;
      if (weights) {
        for (std::size_t c = 0; c < cols; ++c) o[c] = weights[uk] * g[c];
      } else if (mean) {
        const auto count = static_cast<T>(segments[b + 1] - segments[b]);
        for (std::size_t c = 0; c < cols; ++c) o[c] = g[c] / count;
      } else {
        for (std::size_t c = 0; c < cols; ++c) o[c] = g[c];
      }
    }
  }
};

/// out[b] = g[b] / (the bag's ids): what a mean bag's gradient gives each of
/// its rows (an empty bag's row is left as it is). An element per call.
template <class T>
struct DivideByCount {
  const T* g;
  const index_t* offsets;
  T* out;
  std::size_t cols;
  /// Bag b's number of ids.
  PARALLAX_HOST_DEVICE index_t count(std::size_t b) const { return offsets[b + 1] - offsets[b]; }
  PARALLAX_HOST_DEVICE void operator()(std::size_t b, std::size_t c) const {
    out[b * cols + c] = count(b) > 0 ? g[b * cols + c] / static_cast<T>(count(b)) : g[b * cols + c];
  }
};

/// A request's offsets on the host (copied when they live in a device).
template <class Space>
std::vector<index_t> host_offsets(const index_t* offsets, std::size_t count) {
  std::vector<index_t> out(count);
  if (count) space_traits<Space>::copy_to_host(out.data(), offsets, count * sizeof(index_t));
  return out;
}

/// The first problem with a bag request, as a sentence naming the variable
/// (`name`, `rows` rows), or nothing. `offsets` are on the host. Local.
template <class T, class Space>
std::optional<std::string> bag_problem(const Exec<Space>& ex, const std::string& name, std::size_t rows,
                                       const std::vector<index_t>& offsets, const index_t* ids, std::size_t n,
                                       const T* weights, Combiner combiner) {
  const auto at = [&](auto... what) { return concat("bags of variable '", name, "': ", what...); };
  if (offsets.empty()) return at("no offsets: give one per bag and one more (the first 0, the last the number of ids)");
  if (offsets.front() != 0) return at("the offsets start at ", offsets.front(), ", not 0");
  for (std::size_t b = 0; b + 1 < offsets.size(); ++b)
    if (offsets[b + 1] < offsets[b])
      return at("the offsets are not ascending: offset ", b + 1, " is ", offsets[b + 1], ", after ", offsets[b]);
  if (static_cast<std::size_t>(offsets.back()) != n)
    return at("the offsets end at ", offsets.back(), " but there are ", n, " ids");
  if (combiner == Combiner::weighted_sum && !weights && n)
    return at("combiner weighted_sum needs a weight per id; none were given");
  if (combiner != Combiner::weighted_sum && weights)
    return at("weights were given with combiner ", to_string(combiner), " (they are for weighted_sum)");
  if (auto bad = find_out_of_range(ex, ids, n, rows)) {
    const auto bag = static_cast<std::size_t>(std::upper_bound(offsets.begin(), offsets.end(),
                                                               static_cast<index_t>(*bad)) - offsets.begin()) - 1;
    return at("id ", read_one<index_t, Space>(ids + *bad), " (entry ", *bad, ", bag ", bag, ") is outside [0, ",
              rows, ")");
  }
  return std::nullopt;
}

/// A pooled gradient of variable `name` that no lookup of bags awaits.
inline std::string no_bag_lookup(const std::string& name) {
  return concat("gradient of the bags of variable '", name, "': no lookup of its bags awaits a gradient this step");
}

/// The first problem with a request's pooled gradient, or nothing.
inline std::optional<std::string> bag_gradient_problem(const std::string& name, std::size_t bags, std::size_t cols,
                                                       std::size_t rows, std::size_t given_cols) {
  if (rows != bags || given_cols != cols)
    return concat("gradient of the bags of variable '", name, "' has ", rows, " x ", given_cols,
                  " values; the lookup pooled ", bags, " bags of ", cols, " columns");
  return std::nullopt;
}

}  // namespace detail

/// Pools rows already looked up (row j for id j of the request: `rows`, n x
/// cols end to end, or placed as a RowsAt says, in Space) into out (bags x
/// cols). Local.
template <class T, class Space>
void pool_bags(const Exec<Space>& ex, detail::RowsAt<detail::identity_t<T>> rows, const index_t* offsets,
               std::size_t bags, const T* weights, Combiner combiner, std::size_t cols, T* out) {
  detail::pool_segments(
      ex, detail::PoolBags<T>{rows, offsets, weights, combiner == Combiner::mean ? offsets : nullptr, out, cols},
      bags);
  ex.synchronize();
}

/// The rows a pooled gradient `g` (bags x cols) gives the request's ids:
/// n ids to ids_out and n x cols values to out (in Space), in one pass (a
/// mean bag's division included). Local.
template <class T, class Space>
void expand_bags(const Exec<Space>& ex, const T* g, const index_t* offsets, std::size_t bags, const index_t* ids,
                 const T* weights, Combiner combiner, std::size_t cols, index_t* ids_out, T* out) {
  if (!bags) return;
  for_each(ex, bags,
           detail::ExpandBags<T>{detail::RowsAt<T>(g), offsets, combiner == Combiner::weighted_sum ? weights : nullptr,
                                 combiner == Combiner::mean, ids, ids_out, out, cols},
           Cost{cols * 4});
  ex.synchronize();
}

namespace detail {
/// The first problem with any request of a batch (offsets, ids, weights),
/// or nothing; each request's offsets on the host go to `offsets`. Local.
template <class V>
std::optional<std::string> batch_problem(const Exec<typename V::space>& ex, const Bags<V>* batch, std::size_t count,
                                         std::vector<std::vector<index_t>>& offsets) {
  offsets.assign(count, {});
  std::optional<std::string> problem;
  for (std::size_t i = 0; i < count; ++i) {
    const Bags<V>& q = batch[i];
    offsets[i] = host_offsets<typename V::space>(q.offsets, q.offsets_count);
    if (!problem) problem = bag_problem(ex, q.var->name(), q.var->rows(), offsets[i], q.ids, q.n, q.weights, q.combiner);
  }
  return problem;
}
}  // namespace detail

/// Every request of a batch checked (offsets, ids, weights), and the first
/// problem any rank found thrown on every rank. Collective (one small
/// all-reduce). Returns each request's offsets on the host.
template <class Engine, class V>
std::vector<std::vector<index_t>> check_bags(Engine& engine, const Bags<V>* batch, std::size_t count) {
  std::vector<std::vector<index_t>> offsets;
  detail::agree(engine, detail::batch_problem(engine.exec(), batch, count, offsets));
  return offsets;
}

/// Bags pooled where their rows were looked up: a policy looks the ids up as
/// plain rows (its own lookup()), pools them here, and the gradient gives
/// the ids their rows of the pooled gradient as a plain sparse gradient
/// (SparseGrad::add_rows). Keeps a copy of each request until clear().
template <class T, class Space>
class LocalBags {
 public:
  /// A batched bag lookup pooled here: checks the batch (collective: a bad
  /// request throws on every rank), looks its ids up with `plain()` (the
  /// policy's plain lookup of every request's ids, returning the rows of
  /// each) and pools them.
  template <class Engine, class V, class Plain>
  std::vector<Rows<T, Space>> lookup(Engine& engine, const Bags<V>* batch, std::size_t count, Plain&& plain) {
    check_bags(engine, batch, count);
    return pool(engine.exec(), batch, count, plain());
  }

  /// Pools the rows `looked_up[i]` of request i (checked already) as one
  /// batch: one row per bag, valid until clear(). Request i is kept as
  /// pooled() + i (as pooled() was before the call).
  template <class V>
  std::vector<Rows<T, Space>> pool(const Exec<Space>& ex, const Bags<V>* batch, std::size_t count,
                                   const std::vector<Rows<T, Space>>& looked_up) {
    std::vector<detail::RowsAt<T>> rows;
    rows.reserve(looked_up.size());
    for (const Rows<T, Space>& r : looked_up) rows.emplace_back(r.data);
    return pool(ex, batch, count, rows);
  }
  /// pool() with request i's row j where `rows[i]` places it (the rows of
  /// repeated ids read once, say).
  template <class V>
  std::vector<Rows<T, Space>> pool(const Exec<Space>& ex, const Bags<V>* batch, std::size_t count,
                                   const std::vector<detail::RowsAt<T>>& rows) {
    batches_.push_back(Batch{used_, count, false});
    std::vector<Rows<T, Space>> out;
    out.reserve(count);
    for (std::size_t i = 0; i < count; ++i) {
      const Bags<V>& q = batch[i];
      Kept& k = keep(&q.var->state(), q.var->cols(), q.offsets, q.offsets_count, q.ids, q.n, q.weights, q.combiner);
      Buffer<T, Space>& pooled = next_output(k.bags * k.cols);
      pool_bags(ex, rows[i], k.offsets.data(), k.bags, k.weights.size() ? k.weights.data() : nullptr,
                k.combiner, k.cols, pooled.data());
      out.push_back(Rows<T, Space>{pooled.data(), k.bags, k.cols});
    }
    return out;
  }
  /// Requests pooled since clear().
  std::size_t pooled() const noexcept { return used_; }

  /// The gradients of the step's last batch whose gradient was not given
  /// yet, one per request in its order: checked (collective: a mismatch
  /// throws on every rank), then given to the ids (expand()).
  template <class Engine, class V>
  void gradients(Engine& engine, const BagGradient<V>* g, std::size_t count) {
    detail::agree(engine, gradients_problem(g, count));
    give(engine.exec(), g, count);
  }
  /// The problem with `g` as the gradients of the awaiting batch (none
  /// awaits, another count, variable or shape), or nothing. Local.
  template <class V>
  std::optional<std::string> gradients_problem(const BagGradient<V>* g, std::size_t count) {
    const Batch* b = awaiting();
    if (!b) return detail::no_bag_lookup(count ? g[0].var->name() : std::string());
    if (count != b->count)
      return detail::concat("a gradient of bags was given for ", count,
                            " requests; the batch of bags it belongs to had ", b->count);
    for (std::size_t i = 0; i < count; ++i)
      if (auto problem = problem_of(b->first + i, g[i])) return problem;
    return std::nullopt;
  }
  /// Gives the awaiting batch its gradients `g` (checked already:
  /// gradients_problem()), each id its row (expand()). Local.
  template <class V>
  void give(const Exec<Space>& ex, const BagGradient<V>* g, std::size_t count) {
    Batch* b = awaiting();
    b->given = true;
    for (std::size_t i = 0; i < count; ++i) expand(ex, b->first + i, g[i]);
  }

  /// The problem with `g` as the gradient of kept request `index` (another
  /// variable, another shape), or nothing.
  template <class V>
  std::optional<std::string> problem_of(std::size_t index, const BagGradient<V>& g) const {
    const Kept& k = *kept_[index];
    if (k.var != &g.var->state())
      return detail::concat("a gradient of bags for variable '", g.var->name(),
                            "' was given where its batch looked up another variable");
    return detail::bag_gradient_problem(g.var->name(), k.bags, k.cols, g.values.rows, g.values.cols);
  }
  /// Adds to the variable's sparse gradient the rows kept request `index`'s
  /// ids get from `g` (checked already). Local.
  template <class V>
  void expand(const Exec<Space>& ex, std::size_t index, const BagGradient<V>& g) {
    const Kept& k = *kept_[index];
    auto rows = g.var->grad().add_rows(k.n);
    expand_bags(ex, g.values.data, k.offsets.data(), k.bags, k.ids.data(),
                k.weights.size() ? k.weights.data() : nullptr, k.combiner, k.cols, rows.ids, rows.values.data);
  }

  /// Forgets the step's lookups (the buffers stay for the next one).
  void clear() noexcept {
    used_ = 0;
    outputs_used_ = 0;
    batches_.clear();
  }

 private:
  struct Kept {
    const void* var = nullptr;
    std::size_t cols = 0, bags = 0, n = 0;
    Combiner combiner = Combiner::sum;
    Buffer<index_t, Space> offsets, ids;
    Buffer<T, Space> weights;
  };
  struct Batch {
    std::size_t first, count;
    bool given;
  };
  Kept& keep(const void* var, std::size_t cols, const index_t* offsets, std::size_t offsets_count, const index_t* ids,
             std::size_t n, const T* weights, Combiner combiner) {
    if (used_ == kept_.size()) kept_.push_back(std::make_unique<Kept>());
    Kept& k = *kept_[used_++];
    k.var = var;
    k.cols = cols;
    k.bags = offsets_count - 1;
    k.n = n;
    k.combiner = combiner;
    k.offsets.resize_discard(offsets_count);
    space_traits<Space>::copy(k.offsets.data(), offsets, offsets_count * sizeof(index_t));
    k.ids.resize_discard(n);
    if (n) space_traits<Space>::copy(k.ids.data(), ids, n * sizeof(index_t));
    k.weights.resize_discard(weights ? n : 0);
    if (weights && n) space_traits<Space>::copy(k.weights.data(), weights, n * sizeof(T));
    return k;
  }
  Batch* awaiting() noexcept {
    for (std::size_t i = batches_.size(); i-- > 0;)
      if (!batches_[i].given) return &batches_[i];
    return nullptr;
  }
  Buffer<T, Space>& next_output(std::size_t elements) {
    if (outputs_used_ == outputs_.size()) outputs_.emplace_back();
    Buffer<T, Space>& b = outputs_[outputs_used_++];
    b.resize_discard(elements);
    return b;
  }

  std::vector<std::unique_ptr<Kept>> kept_;
  std::size_t used_ = 0;
  std::vector<Batch> batches_;
  std::vector<Buffer<T, Space>> outputs_;
  std::size_t outputs_used_ = 0;
};

/// LocalBags for each element type a variable may have.
template <class Space>
class LocalBagsOfEachType {
 public:
  template <class T>
  LocalBags<T, Space>& of() noexcept {
    static_assert(detail::is_any_of_v<T, float, double>, "bags of float or double");
    if constexpr (std::is_same_v<T, float>) return f_;
    else return d_;
  }
  void clear() noexcept {
    f_.clear();
    d_.clear();
  }

 private:
  LocalBags<float, Space> f_;
  LocalBags<double, Space> d_;
};

}  // namespace parallax
