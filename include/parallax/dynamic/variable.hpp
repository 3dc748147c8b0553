#pragma once
/// @file
/// DynamicVariable: a sparse variable keyed by 64-bit ids, whose rows live in
/// one dynamic::Table per rank (the owner of a key is dynamic::owner(key,
/// ranks)), created on first lookup, up to a capacity per rank, evicted by
/// score (docs/design.md, "Dynamic tables"). A trainer routes it to the
/// AllGatherv policy (a replica of the table on every rank) under
/// arch::AllReduce, to DynamicPS under the other synchronous architectures.

#include <parallax/context.hpp>
#include <parallax/dynamic/table.hpp>
#include <parallax/error.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>
#include <parallax/variable.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace parallax {
namespace dynamic {

/// The gradient of a dynamic variable: rows given for 64-bit keys this step
/// (duplicates allowed; the owner sums them). As SparseGrad, a wrong-shaped
/// add is not thrown on the spot: inside a Trainer it surfaces at the next
/// step() on every rank at once.
template <class T>
class Grad {
 public:
  Grad() = default;
  Grad(std::size_t cols, std::string name) : cols_(cols), name_(std::move(name)) {}

  /// Appends n rows: keys[i] gets values[i*cols() .. (i+1)*cols()).
  void add(const std::uint64_t* keys, const T* values, std::size_t n) {
    touched_ = true;
    keys_.insert(keys_.end(), keys, keys + n);
    values_.insert(values_.end(), values, values + n * cols_);
  }
  /// Appends rows from host vectors; values.size() must be keys.size() * cols().
  void add(const std::vector<std::uint64_t>& keys, const std::vector<T>& values) {
    touched_ = true;
    if (values.size() != keys.size() * cols_) {
      if (!problem_) problem_ = parallax::detail::concat("gradient of dynamic variable '", name_, "' has ", values.size(),
                                               " values for ", keys.size(), " keys; ", cols_, " columns need ",
                                               keys.size() * cols_);
      return;
    }
    add(keys.data(), values.data(), keys.size());
  }
  /// Appends rows given as a view (rows.cols must be cols(), rows.rows keys.size()).
  void add(const std::vector<std::uint64_t>& keys, const Rows<T, HostSpace>& rows) {
    touched_ = true;
    if (rows.cols != cols_ || rows.rows != keys.size()) {
      if (!problem_) problem_ = parallax::detail::concat("gradient of dynamic variable '", name_, "' has ", rows.rows,
                                               " rows of ", rows.cols, " columns for ", keys.size(),
                                               " keys; the variable has ", cols_, " columns");
      return;
    }
    add(keys.data(), rows.data, keys.size());
  }

  std::size_t size() const noexcept { return keys_.size(); }
  std::size_t cols() const noexcept { return cols_; }
  const std::uint64_t* keys() const noexcept { return keys_.data(); }
  const T* values() const noexcept { return values_.data(); }
  bool touched() const noexcept { return touched_; }
  /// The first problem with what was added, as a sentence, or nothing.
  const std::optional<std::string>& problem() const noexcept { return problem_; }
  void clear() noexcept {
    keys_.clear();
    values_.clear();
    touched_ = false;
    problem_.reset();
  }

 private:
  std::size_t cols_ = 1;
  std::string name_;
  std::vector<std::uint64_t> keys_;
  std::vector<T> values_;
  bool touched_ = false;
  std::optional<std::string> problem_;
};

/// What a DynamicVariable's handles share.
template <class T>
struct VariableState {
  std::string name;
  Options options;
  Grad<T> grad;
  bool grad_touched = false;
  const void* trainer = nullptr;         // the trainer it is registered with
  const Table<T>* table = nullptr;       // this rank's shard, once registered
};

}  // namespace dynamic

/// A sparse variable of `options.cols` columns keyed by `std::uint64_t`.
///
/// Rows are created at their first lookup with the initializer of
/// `options.init` (a pure function of the variable's name, the key and the
/// column, so every rank count gives the same fresh row), held by rank
/// `dynamic::owner(key, ranks)` in a dynamic::Table of `options.capacity`
/// rows per rank, and evicted by `options.evict` when full; an admission
/// filter (`options.admission`) may make a key wait for a row, reading a
/// default row meanwhile and pushing nothing. Read rows with
/// `Trainer::lookup(var, keys)` and give gradients with
/// `grad().add(keys, rows)`. Host memory only.
///
/// @tparam T      element type (float or double)
/// @tparam Space  px::HostSpace (a CUDA table is not built)
/// @tparam Policy use_arch (AllGatherv under arch::AllReduce, DynamicPS
///                under the other synchronous architectures), or either one
template <class T = float, class Space = HostSpace, class Policy = use_arch>
class DynamicVariable {
  static_assert(std::is_floating_point_v<T>, "parallax::DynamicVariable: T must be float or double");
  static_assert(std::is_same_v<Space, HostSpace>,
                "parallax::DynamicVariable: dynamic tables live in host memory only (px::HostSpace); no "
                "policy holds the device table (dynamic::CudaTable) yet");

 public:
  using sparsity = Sparse;
  using value_type = T;
  using space = Space;
  using policy = Policy;
  using grad_type = dynamic::Grad<T>;

  /// Declares the variable. `options.name` is set to `name`; the trainer
  /// sets the optimizer's slots. Every rank must declare the same variables
  /// in the same order with the same capacity and columns; the Trainer checks.
  DynamicVariable(const Context& ctx, std::string name, dynamic::Options options)
      : state_(std::make_shared<dynamic::VariableState<T>>()) {
    (void)ctx;
    PARALLAX_EXPECTS(!name.empty(), "a variable needs a non-empty name");
    PARALLAX_EXPECTS(options.capacity > 0 && options.cols > 0, "dynamic variable '", name, "': capacity ",
                     options.capacity, " and cols ", options.cols, " must be positive");
    options.name = name;
    state_->name = std::move(name);
    state_->grad = dynamic::Grad<T>(options.cols, state_->name);
    state_->options = std::move(options);
  }

  const std::string& name() const noexcept { return state_->name; }
  /// capacity per rank x cols: what the ranks compare and checkpoints record.
  Shape shape() const noexcept { return Shape{state_->options.capacity, state_->options.cols}; }
  std::size_t cols() const noexcept { return state_->options.cols; }
  std::size_t capacity() const noexcept { return state_->options.capacity; }
  const dynamic::Options& options() const noexcept { return state_->options; }
  static constexpr bool is_sparse() noexcept { return true; }
  static constexpr bool is_dynamic() noexcept { return true; }

  /// The gradient to fill this step (marks it given, as Variable::grad()).
  grad_type& grad() {
    state_->grad_touched = true;
    return state_->grad;
  }
  const grad_type& grad() const noexcept { return state_->grad; }

  /// This rank's shard's statistics (size, inserts, evictions, admissions
  /// refused, hit rate); all zero before a trainer registers the variable.
  /// Over every rank: DynamicSynchronizer::stats (collective).
  dynamic::Stats local_stats() const {
    if (!state_->table) return dynamic::Stats{0, state_->options.capacity};
    return state_->table->stats();
  }

  /// The shared state; for the Trainer and the policy.
  dynamic::VariableState<T>& state() const noexcept { return *state_; }
  bool same_as(const DynamicVariable& o) const noexcept { return state_ == o.state_; }

 private:
  std::shared_ptr<dynamic::VariableState<T>> state_;
};

template <class T, class Space, class P>
struct is_variable<DynamicVariable<T, Space, P>> : std::true_type {};

namespace dynamic {
/// Whether V is a dynamic variable (has `static constexpr bool is_dynamic()`, true).
template <class V, class = void>
struct is_dynamic : std::false_type {};
template <class V>
struct is_dynamic<V, std::enable_if_t<V::is_dynamic()>> : std::true_type {};
template <class V>
inline constexpr bool is_dynamic_v = is_dynamic<V>::value;
}  // namespace dynamic

}  // namespace parallax
