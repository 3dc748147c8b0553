#pragma once
/// @file
/// Variable: a named `rows x cols` parameter and its gradient, as a cheap
/// handle (copies share one state).

#include <parallax/context.hpp>
#include <parallax/error.hpp>
#include <parallax/half.hpp>
#include <parallax/init.hpp>
#include <parallax/space.hpp>
#include <parallax/sparse_grad.hpp>
#include <parallax/types.hpp>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace parallax {

/// The default fourth argument of Variable: the trainer's architecture picks
/// the communicator policy from the variable's sparsity.
struct use_arch {
  static constexpr const char* name = "use_arch";
};

namespace detail {

template <class T, class Space>
struct VariableState {
  std::string name;
  Shape shape;
  Init init;
  int rank = 0;
  Buffer<T, Space> value;  // dense: the replica every rank reads
  Buffer<T, Space> grad;   // dense: the gradient the user writes
  SparseGrad<T, Space> sparse_grad;  // sparse: the rows the user touched
  bool grad_touched = false;
  const void* trainer = nullptr;  // the trainer it is registered with
  Rounding rounding;               // how updates store rows of a 16-bit table
};

}  // namespace detail

/// A model parameter of `shape.rows x shape.cols` elements of T in Space.
///
/// Dense variables hold a full replica on every rank (`value()`) and a dense
/// gradient the user writes (`grad()`). Sparse variables hold no values
/// until a Trainer places them (sharded for ShardedPS, replicated for
/// AllGatherv); read their rows with `Trainer::lookup` and give gradients as
/// rows with `grad().add(ids, rows)`.
///
/// @tparam Sparsity px::Dense or px::Sparse
/// A sparse variable may store its rows in 16 bits (T = px::bf16 or
/// px::fp16): its value_type, the type of the rows its lookups return and
/// of the gradients the user gives, is then float; storage_type is T. The
/// policy holding it stores T and computes in float (docs/design.md,
/// "Half precision"); set_rounding() says how updates round.
///
/// @tparam T        element type (float or double), or, sparse only, bf16 / fp16 storage
/// @tparam Space    memory space (px::HostSpace, px::CudaSpace)
/// @tparam Policy   use_arch, or a communicator policy that overrides the
///                  architecture for this variable (px::AllGatherv, ...)
template <class Sparsity, class T = float, class Space = HostSpace, class Policy = use_arch>
class Variable {
  static_assert(is_sparsity_v<Sparsity>, "parallax::Variable: the first argument must be px::Dense or px::Sparse");
  static_assert(std::is_floating_point_v<T> || is_half_v<T>,
                "parallax::Variable: T must be float or double (or, for a sparse variable, px::bf16 or px::fp16)");
  static_assert(!is_half_v<T> || std::is_same_v<Sparsity, Sparse>,
                "parallax::Variable: a dense variable is float or double; only sparse variables (tables) store "
                "their rows in 16 bits (px::bf16, px::fp16). Compress a dense variable's exchange instead "
                "(TrainerOptions::compress)");
  static_assert(is_space_v<Space>, "parallax::Variable: Space must be px::HostSpace or px::CudaSpace");

 public:
  using sparsity = Sparsity;
  /// The rows lookups return and gradients take: float for a 16-bit table.
  using value_type = compute_t<T>;
  /// The type the rows are stored in.
  using storage_type = T;
  using space = Space;
  using policy = Policy;
  using grad_type =
      std::conditional_t<std::is_same_v<Sparsity, Sparse>, SparseGrad<value_type, Space>, Buffer<value_type, Space>>;

  /// Declares the variable. Every rank must declare the same variables in
  /// the same order with the same shapes; the Trainer checks.
  /// @param ctx   the job
  /// @param name  unique name, used in errors, statistics and checkpoints
  /// @param shape rows x cols
  /// @param init  initial values (a function of seed, name and element)
  Variable(const Context& ctx, std::string name, Shape shape, Init init = init::Zeros{})
      : state_(std::make_shared<detail::VariableState<value_type, Space>>()) {
    PARALLAX_EXPECTS(!name.empty(), "a variable needs a non-empty name");
    PARALLAX_EXPECTS(shape.rows > 0 && shape.cols > 0, "variable '", name, "': shape ", shape.rows, " x ",
                     shape.cols, " has a zero dimension");
    state_->name = std::move(name);
    state_->shape = shape;
    state_->init = init;
    state_->rank = ctx.rank();
    if constexpr (std::is_same_v<Sparsity, Dense>) {
      state_->value.resize_discard(shape.elements());
      fill_initial(Exec<Space>{}, state_->value.data(), 0, shape.rows);
      state_->grad.resize_discard(shape.elements());
      state_->grad.zero();
    } else {
      state_->sparse_grad = SparseGrad<value_type, Space>(shape, state_->name);
    }
  }

  const std::string& name() const noexcept { return state_->name; }
  Shape shape() const noexcept { return state_->shape; }
  std::size_t rows() const noexcept { return state_->shape.rows; }
  std::size_t cols() const noexcept { return state_->shape.cols; }
  static constexpr bool is_sparse() noexcept { return std::is_same_v<Sparsity, Sparse>; }
  /// Whether the rows are stored in 16 bits (bf16 or fp16).
  static constexpr bool is_half() noexcept { return is_half_v<T>; }

  /// How the optimizer's updates store this 16-bit table's rows: to nearest
  /// even (the default) or stochastically, seeded (runs stay bit-identical
  /// at any rank count). Before the variable joins a Trainer.
  void set_rounding(Rounding r) {
    static_assert(is_half_v<T>, "set_rounding: only a table stored in 16 bits (bf16, fp16) rounds its updates");
    PARALLAX_EXPECTS(state_->trainer == nullptr, "variable '", name(),
                     "': set_rounding() after it joined a Trainer; set it before");
    state_->rounding = r;
  }
  Rounding rounding() const noexcept { return state_->rounding; }

  /// Dense: the replica, `rows x cols` row-major. Updated by Trainer::step().
  const Buffer<value_type, Space>& value() const {
    static_assert(!is_sparse(), "a sparse variable has no full value on a rank: use Trainer::lookup or Trainer::fetch");
    return state_->value;
  }
  /// The gradient to fill this step: a dense buffer (zeroed after every step)
  /// for dense variables, a SparseGrad for sparse ones. Calling it on a
  /// non-const handle marks the gradient as given this step (a step in which
  /// no variable's was is an error); read one through a const handle
  /// (`std::as_const(v).grad()`), which marks nothing. A Trainer moves the
  /// dense gradients it all-reduces into one arena when it is constructed
  /// (so they are fused without copies), and back when it is destroyed: the
  /// buffer grad() returns stays the same object, but its data() changes
  /// then, so take `grad().data()` after constructing the Trainer.
  grad_type& grad() {
    state_->grad_touched = true;
    if constexpr (is_sparse()) return state_->sparse_grad;
    else return state_->grad;
  }
  const grad_type& grad() const noexcept {
    if constexpr (is_sparse()) return state_->sparse_grad;
    else return state_->grad;
  }

  /// Writes the initial values of global rows [first, first + n) to out (in
  /// Space), as U (the storage type, or value_type).
  template <class U>
  void fill_initial(const Exec<Space>& ex, U* out, std::size_t first, std::size_t n) const {
    for_each(ex, n * cols(), detail::FillInit<U>{rule(), out, cols(), first, nullptr});
  }
  detail::InitRule rule() const { return detail::make_init_rule(state_->init, state_->name, state_->shape); }

  /// The shared state; for the Trainer and policies.
  detail::VariableState<value_type, Space>& state() const noexcept { return *state_; }
  /// True when both handles refer to the same variable.
  bool same_as(const Variable& o) const noexcept { return state_ == o.state_; }

 private:
  std::shared_ptr<detail::VariableState<value_type, Space>> state_;
};

template <class V>
struct is_variable : std::false_type {};
template <class S, class T, class Space, class P>
struct is_variable<Variable<S, T, Space, P>> : std::true_type {};
template <class V>
inline constexpr bool is_variable_v = is_variable<V>::value;

namespace detail {
template <class V, class = void>
struct storage_of {
  using type = typename V::value_type;
};
template <class V>
struct storage_of<V, std::void_t<typename V::storage_type>> {
  using type = typename V::storage_type;
};
}  // namespace detail
/// The type a variable's rows are stored in: its storage_type, or, for a
/// variable type without one, its value_type.
template <class V>
using storage_type_t = typename detail::storage_of<V>::type;
/// Whether a variable type stores its rows in 16 bits.
template <class V>
inline constexpr bool stores_half_v = is_half_v<storage_type_t<V>>;

/// A runtime collection of variables of one kind (a model's 500 embedding
/// tables, say): a Trainer takes it as it takes one variable, and a batched
/// lookup's requests are a std::vector too. The variables are handles, so
/// the collection and the trainer hold the same variables.
template <class V>
using Variables = std::vector<V>;

namespace detail {
/// The variable type of a Trainer argument: a variable, or a collection.
template <class A>
struct variable_of {
  using type = A;
  static constexpr bool collection = false;
};
template <class V, class Alloc>
struct variable_of<std::vector<V, Alloc>> {
  using type = V;
  static constexpr bool collection = true;
};
template <class A>
using variable_of_t = typename variable_of<A>::type;

/// Calls f on the argument's variable, or on each variable of a collection.
template <class A, class F>
void for_each_variable(A& a, F&& f) {
  if constexpr (variable_of<A>::collection) {
    for (auto& v : a) f(v);
  } else {
    f(a);
  }
}
}  // namespace detail

}  // namespace parallax
