#pragma once
/// @file
/// SparseGrad: the gradient of a sparse variable as the rows a step touched.

#include <parallax/detail/algorithms.hpp>
#include <parallax/error.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace parallax {

/// Rows touched this step: `size()` indices (int64, duplicates allowed) and
/// `size() x cols()` values, row-major, in `Space`.
///
/// Entries are appended with add(). Data problems (a wrong-shaped add, an
/// index outside [0, rows)) are not thrown on the spot: inside a Trainer they
/// surface at the next step() on every rank at once, so no rank is left
/// waiting; standalone, coalesce() and validate() throw them.
///
/// @tparam T     element type
/// @tparam Space memory space of the indices and values
template <class T, class Space = HostSpace>
class SparseGrad {
 public:
  SparseGrad() = default;
  /// A gradient for a `shape.rows x shape.cols` variable called `name`.
  explicit SparseGrad(Shape shape, std::string name = {}) : shape_(shape), name_(std::move(name)) {}

  /// Appends n rows: ids[i] gets values[i*cols() .. (i+1)*cols()). Both
  /// pointers are in Space.
  void add(const index_t* ids, const T* values, std::size_t n) {
    indices_.append(ids, n);
    values_.append(values, n * shape_.cols);
    coalesced_ = false;
    touched_ = true;
  }
  /// The ids and values of rows appended by add_rows(), for the caller to
  /// write (in Space).
  struct NewRows {
    index_t* ids = nullptr;
    Rows<T, Space> values;
  };
  /// Appends n rows and returns where to write them: n ids and n x cols()
  /// values, uninitialised, in Space. A kernel that computes gradient rows
  /// can write them here instead of into a buffer of its own that add()
  /// would copy. The pointers are valid until the next add, add_rows() or
  /// coalesce(); every row must be written before the gradient is used.
  NewRows add_rows(std::size_t n) {
    const std::size_t at = indices_.size();
    indices_.resize(at + n);
    values_.resize((at + n) * shape_.cols);
    coalesced_ = false;
    touched_ = true;
    return NewRows{indices_.data() + at, Rows<T, Space>{values_.data() + at * shape_.cols, n, shape_.cols}};
  }
  /// Appends rows given as buffers of the same space; their sizes must agree
  /// (values.size() == ids.size() * cols()).
  void add(const Buffer<index_t, Space>& ids, const Buffer<T, Space>& values) {
    if (shape_ok(ids.size(), values.size())) add(ids.data(), values.data(), ids.size());
  }
  /// Appends rows given as a view (rows.cols must equal cols()).
  void add(const Buffer<index_t, Space>& ids, const Rows<T, Space>& rows) {
    touched_ = true;
    if (rows.cols != shape_.cols && problem_.empty())
      problem_ = detail::concat("gradient of variable '", name_, "' has rows of ", rows.cols,
                                " columns; the variable has ", shape_.cols);
    else if (shape_ok(ids.size(), rows.size()))
      add(ids.data(), rows.data, ids.size());
  }
  /// Appends rows from host vectors (copied into Space).
  void add(const std::vector<index_t>& ids, const std::vector<T>& values) {
    if (!shape_ok(ids.size(), values.size())) return;
    if constexpr (std::is_same_v<Space, HostSpace>) {
      add(ids.data(), values.data(), ids.size());
    } else {
      add(Buffer<index_t, Space>::from_host(ids), Buffer<T, Space>::from_host(values));
    }
  }

  /// Number of (possibly duplicate) rows held.
  std::size_t size() const noexcept { return indices_.size(); }
  bool empty() const noexcept { return indices_.empty(); }
  std::size_t rows() const noexcept { return shape_.rows; }
  std::size_t cols() const noexcept { return shape_.cols; }
  Shape shape() const noexcept { return shape_; }
  const std::string& name() const noexcept { return name_; }
  const index_t* indices() const noexcept { return indices_.data(); }
  const T* values() const noexcept { return values_.data(); }
  Buffer<index_t, Space>& index_buffer() noexcept { return indices_; }
  Buffer<T, Space>& value_buffer() noexcept { return values_; }
  /// True after coalesce() until the next add().
  bool is_coalesced() const noexcept { return coalesced_; }
  /// True when add() was called since the last clear().
  bool touched() const noexcept { return touched_; }

  /// Drops every row (keeps the allocations for the next step).
  void clear() noexcept {
    indices_.clear();
    values_.clear();
    coalesced_ = true;
    touched_ = false;
    problem_.clear();
  }

  /// The first problem with the data given so far, as a sentence, or nothing.
  std::optional<std::string> find_problem(const Exec<Space>& ex) const {
    if (!problem_.empty()) return problem_;
    if (auto bad = detail::find_out_of_range(ex, indices_.data(), indices_.size(), shape_.rows)) {
      const index_t id = detail::read_one<index_t, Space>(indices_.data() + *bad);
      return detail::concat("gradient of variable '", name_, "' has row index ", id, " (entry ", *bad,
                            ") outside [0, ", shape_.rows, ")");
    }
    return std::nullopt;
  }
  /// Throws parallax::error if find_problem() finds one.
  void validate(const Exec<Space>& ex) const {
    if (auto p = find_problem(ex)) throw error(*p);
  }

  /// Sorts the rows by index and sums duplicates, in the order they were
  /// added. Afterwards indices() is strictly ascending. Rows added with
  /// strictly ascending indices are that already: they stay where they are,
  /// not copied. Throws on bad data.
  void coalesce(const Exec<Space>& ex = Exec<Space>{}) {
    if (!problem_.empty()) throw error(problem_);
    if (coalesced_) return;
    validate(ex);
    if (detail::strictly_ascending(ex, indices_.data(), indices_.size())) {
      coalesced_ = true;
      return;
    }
    detail::coalesce_rows(ex, indices_.data(), values_.data(), indices_.size(), shape_.cols, out_ids_, out_values_,
                          scratch_);
    std::swap(indices_, out_ids_);
    std::swap(values_, out_values_);
    coalesced_ = true;
  }

 private:
  bool shape_ok(std::size_t n_ids, std::size_t n_values) {
    touched_ = true;
    if (n_values == n_ids * shape_.cols) return true;
    if (problem_.empty())
      problem_ = detail::concat("gradient of variable '", name_, "' has the wrong shape: ", n_ids, " indices but ",
                                n_values, " values (expected ", n_ids, " x ", shape_.cols, " = ", n_ids * shape_.cols,
                                ")");
    return false;
  }

  Shape shape_{};
  std::string name_;
  Buffer<index_t, Space> indices_;
  Buffer<T, Space> values_;
  Buffer<index_t, Space> out_ids_;
  Buffer<T, Space> out_values_;
  detail::CoalesceScratch<Space> scratch_;
  std::string problem_;
  bool coalesced_ = true;
  bool touched_ = false;
};

}  // namespace parallax
