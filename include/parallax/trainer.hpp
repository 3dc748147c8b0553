#pragma once
/// @file
/// Trainer: owns a model's variables and runs each step's synchronisation and
/// optimizer update, routing every variable to its policy at compile time.

#include <parallax/arch.hpp>
#include <parallax/checkpoint.hpp>
#include <parallax/comm_stats.hpp>
#include <parallax/context.hpp>
#include <parallax/detail/agreement.hpp>
#include <parallax/detail/slots.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/engine/mpi.hpp>
#include <parallax/error.hpp>
#include <parallax/policy/ring_allreduce.hpp>
#include <parallax/policy/sharded_ps.hpp>
#include <parallax/space.hpp>
#include <parallax/variable.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace parallax {

/// How the ranks' gradients are combined.
enum class Reduction {
  mean,  ///< sum over ranks divided by the rank count: with equal local batches
         ///< and per-rank mean losses, the gradient of the global batch's mean loss
  sum,   ///< plain sum over ranks (for gradients already scaled by the global batch)
};

/// Settings of a Trainer. Every field has a working default.
struct TrainerOptions {
  Reduction reduction = Reduction::mean;
  RingOptions ring;        ///< RingAllReduce: algorithm, segments, fusion buckets
  ShardedOptions sharded;  ///< ShardedPS: default partition count, local aggregation
  /// Partition count per variable name, overriding sharded.partitions.
  std::map<std::string, int> partitions;
  engine::Options engine;  ///< deadline of every collective
  CheckpointOptions checkpoint;  ///< automatic saves during step()
};

/// One request of a batched Trainer::lookup: a sparse variable and the ids
/// to look up in it (`n` ids at `ids`, in the trainer's memory space; they
/// must stay valid until the lookup returns). Requests of one batch share
/// the variable type; CTAD reads it: `px::Lookup{emb, ids}`.
template <class V>
struct Lookup {
  V* var;
  const index_t* ids;
  std::size_t n;

  Lookup(V& v, const index_t* i, std::size_t count) : var(&v), ids(i), n(count) {}
  Lookup(V& v, const Buffer<index_t, typename V::space>& i) : var(&v), ids(i.data()), n(i.size()) {}
  /// Host ids, for variables in HostSpace.
  template <class S = typename V::space, std::enable_if_t<std::is_same_v<S, HostSpace>, int> = 0>
  Lookup(V& v, const std::vector<index_t>& i) : var(&v), ids(i.data()), n(i.size()) {}
};

/// Synchronous data-parallel training of a set of variables.
///
/// @tparam Arch      arch::Hybrid, arch::AllReduce or arch::PS: which policy
///                   each variable gets (a variable may name its own)
/// @tparam Optimizer optim::Sgd, Momentum, Adagrad or Adam
/// @tparam Engine    the transport (engine::Mpi for HostSpace variables)
///
/// Per step, every rank calls lookup() for the sparse rows it needs, writes
/// gradients (`dense.grad()`, `sparse.grad().add(ids, rows)`), and calls
/// step(). Every call is collective: all ranks make the same calls in the
/// same order.
template <class Arch, class Optimizer, class Engine = engine::Mpi>
class Trainer {
 public:
  using space = engine::space_of_t<Engine>;
  using arch = Arch;
  using optimizer = Optimizer;
  using engine_type = Engine;

  /// Registers the variables and places them (replicas, shards). Collective;
  /// every rank must pass the same variables in the same order, or every
  /// rank throws parallax::error naming the first difference.
  template <class... Vars>
  Trainer(const Context& ctx, Optimizer opt, Vars&... vars) : Trainer(ctx, TrainerOptions{}, opt, vars...) {}

  template <class... Vars>
  Trainer(const Context& ctx, TrainerOptions options, Optimizer opt, Vars&... vars)
      : ctx_(&ctx), options_(std::move(options)), opt_(opt), engine_(std::make_unique<Engine>(ctx, options_.engine)) {
    static_assert(sizeof...(Vars) > 0, "a Trainer needs at least one variable");
    static_assert((is_variable_v<Vars> && ...), "Trainer takes parallax::Variable arguments");
    static_assert((std::is_same_v<typename Vars::space, space> && ...),
                  "every variable must live in the engine's memory space (HostSpace for engine::Mpi)");

    std::vector<detail::VarRecord> records;
    (records.push_back(detail::VarRecord::make(vars.name(), vars.shape(), data_type_of_v<typename Vars::value_type>,
                                               Vars::is_sparse(), policy_for_t<Arch, Vars>::name)),
     ...);
    for (std::size_t i = 0; i < records.size(); ++i)
      for (std::size_t j = 0; j < i; ++j)
        PARALLAX_EXPECTS(std::string(records[i].name) != records[j].name, "two variables are named '",
                         records[i].name, "'; names must be unique");
    (check_unregistered(vars), ...);
    detail::agree_on_variables(*engine_, records);

    (add(vars), ...);
    std::vector<TensorRef> fused = place_fused_gradients();
    reducer_ = std::make_unique<RingAllReducer<Engine>>(*engine_, options_.ring);
    fusion_ = std::make_unique<FusedAllReducer<Engine>>(*reducer_, std::move(fused));
  }

  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  ~Trainer() = default;  // the slots release their variables

  /// The rows of a sparse variable for `n` ids (in the engine's space),
  /// aligned to the ids (duplicates allowed). Collective for ShardedPS
  /// variables. The rows stay valid until step().
  template <class V>
  Rows<typename V::value_type, space> lookup(V& var, const index_t* ids, std::size_t n) {
    static_assert(V::is_sparse(), "lookup() is for sparse variables; read a dense variable's value() directly");
    ensure_usable();
    engine_->set_step(static_cast<std::int64_t>(steps_ + 1));
    return sparse_slot(var).lookup(ids, n);
  }
  template <class V>
  Rows<typename V::value_type, space> lookup(V& var, const Buffer<index_t, space>& ids) {
    return lookup(var, ids.data(), ids.size());
  }
  /// The rows of several sparse variables at once, `result[i]` for
  /// `batch[i]`, as lookup() of each in turn would return them. The ids of
  /// every ShardedPS variable in the batch travel in one route (one engine
  /// call on MPI, two elsewhere) and each such variable then answers in one
  /// alltoallv: 1 + V engine calls for V sharded variables instead of 2 V
  /// (2 + V instead of 3 V). On MPI the V replies are in flight together
  /// and complete in one wait.
  /// A bad id throws on every rank, naming its variable, before any row
  /// moves. Collective; the rows stay valid until step().
  template <class V>
  std::vector<Rows<typename V::value_type, space>> lookup(const Lookup<V>* batch, std::size_t count) {
    using LookupSlot = detail::SparseSlot<typename V::value_type, Engine, Optimizer>;
    static_assert(V::is_sparse(), "lookup() is for sparse variables; read a dense variable's value() directly");
    ensure_usable();
    engine_->set_step(static_cast<std::int64_t>(steps_ + 1));
    std::vector<LookupSlot*> slots(count);
    for (std::size_t i = 0; i < count; ++i) {
      slots[i] = &sparse_slot(*batch[i].var);
      for (std::size_t j = 0; j < i; ++j)
        PARALLAX_EXPECTS(slots[j] != slots[i], "variable '", batch[i].var->name(),
                         "' appears twice in one batched lookup; give it all its ids in one request");
    }
    std::vector<detail::RouteLane*> lanes;
    std::vector<std::size_t> lane_of;  // the request of each lane
    index_t bad = detail::no_problem;
    std::size_t bad_lane = 0;
    for (std::size_t i = 0; i < count; ++i) {
      if (detail::RouteLane* lane = slots[i]->plan_lookup(batch[i].ids, batch[i].n)) {
        if (bad == detail::no_problem && slots[i]->lookup_problem() != detail::no_problem) {
          bad = slots[i]->lookup_problem();
          bad_lane = lanes.size();
        }
        lanes.push_back(lane);
        lane_of.push_back(i);
      }
    }
    if (!lanes.empty()) {
      auto scope = lanes.size() == 1 ? engine_->stats().scope(slots[lane_of.front()]->name(), ShardedPS::name)
                                     : engine_->stats().scope("(fused sparse)", ShardedPS::name);
      // The push's buffers serve too: a lookup's ids are copied out as they
      // arrive, and pushes route only inside step().
      if (auto problem = detail::route_lanes(*engine_, lanes.data(), lanes.size(), route_buffers_, bad, bad_lane))
        slots[lane_of[problem->lane]]->lookup_failed(*problem);
    }
    // Every sharded table serves and starts its reply; where the engine can,
    // one wait completes them all (one round instead of one per table).
    for (std::size_t i = 0; i < count; ++i) slots[i]->start_reply();
    if constexpr (engine::supports_v<Engine, engine::op_start_alltoallv>) engine_->wait_started();
    std::vector<Rows<typename V::value_type, space>> rows;
    rows.reserve(count);
    for (std::size_t i = 0; i < count; ++i) rows.push_back(slots[i]->finish_lookup());
    return rows;
  }
  template <class V>
  std::vector<Rows<typename V::value_type, space>> lookup(const std::vector<Lookup<V>>& batch) {
    return lookup(batch.data(), batch.size());
  }
  template <class V>
  std::vector<Rows<typename V::value_type, space>> lookup(std::initializer_list<Lookup<V>> batch) {
    return lookup(batch.begin(), batch.size());
  }

  /// Host ids, copied to the engine's space first.
  template <class V>
  Rows<typename V::value_type, space> lookup(V& var, const std::vector<index_t>& ids) {
    if constexpr (std::is_same_v<space, HostSpace>) {
      return lookup(var, ids.data(), ids.size());
    } else {
      staged_ids_.assign_from_host(ids.data(), ids.size());
      return lookup(var, staged_ids_.data(), ids.size());
    }
  }

  /// Synchronises every variable's gradient with its policy and applies the
  /// optimizer, then clears the gradients. Collective. Throws on every rank
  /// if any rank gave bad data (ids out of range, wrong shapes) or if no rank
  /// gave any gradient.
  void step() {
    ensure_usable();
    engine_->set_step(static_cast<std::int64_t>(steps_ + 1));
    std::optional<std::string> problem;
    bool has_gradient = false;
    for (auto& s : slots_) {
      if (!problem) problem = s->problem();
      has_gradient = has_gradient || s->has_gradient();
    }
    const auto& ck = options_.checkpoint;
    const bool time_to_save = engine_->rank() == 0 && !ck.dir.empty() && ck.every_seconds > 0 &&
                              std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save_).count() >=
                                  ck.every_seconds;
    bool save_requested = false;
    try {
      save_requested = detail::agree(*engine_, problem, has_gradient,
                                     "step(): no variable was given a gradient on any rank since the last step",
                                     time_to_save);
    } catch (...) {
      clear();  // the step is abandoned on every rank alike
      throw;
    }
    const detail::StepInfo info{steps_ + 1,
                                options_.reduction == Reduction::mean ? 1.0 / engine_->size() : 1.0};
    {
      auto scope = engine_->stats().scope("(fused dense)", RingAllReduce::name);
      fusion_->run();
    }
    synchronize_slots(info);
    clear();
    ++steps_;
    if (!ck.dir.empty() && (save_requested || (ck.every_steps > 0 && steps_ % ck.every_steps == 0))) save(ck.dir);
  }

  /// Saves every variable and its optimizer state as checkpoint
  /// `dir/step-<steps()>`: each rank writes its own rows, the manifest is
  /// written last, and the directory appears only when complete (a crash
  /// leaves the previous checkpoints intact). Keeps the newest
  /// `checkpoint.keep_last`. Collective; returns the checkpoint's path.
  std::string save(const std::string& dir) {
    ensure_usable();
    namespace fs = std::filesystem;
    auto scope = engine_->stats().scope("", "checkpoint");
    const int me = engine_->rank(), n = engine_->size();
    const std::string final_dir = dir + "/" + detail::checkpoint_dir_name(steps_);
    const std::string partial = final_dir + ".partial";
    std::optional<std::string> problem;
    if (me == 0) {
      std::error_code ec;
      fs::create_directories(dir, ec);
      fs::remove_all(partial, ec);
      if (!fs::create_directory(partial, ec)) problem = detail::concat("cannot create checkpoint directory ", partial, ": ", ec.message());
    }
    detail::agree(*engine_, problem);

    std::uint64_t meta[2] = {0, 0};
    try {
      detail::AtomicFile file(partial + "/" + detail::rank_file_name(me));
      write_rank_header(file);
      for (auto& s : slots_) s->save(file);
      file.commit();
      meta[0] = file.size();
      meta[1] = file.crc();
    } catch (const std::exception& e) {
      problem = e.what();
    }
    detail::agree(*engine_, problem);
    std::vector<std::uint64_t> metas(2 * static_cast<std::size_t>(n));
    engine_->allgather(meta, metas.data(), 2, DataType::i64);

    if (me == 0) {
      try {
        detail::Manifest m = manifest_of_model();
        m.step = steps_;
        m.ranks = n;
        for (int r = 0; r < n; ++r)
          m.files.push_back({detail::rank_file_name(r), metas[2 * r], static_cast<std::uint32_t>(metas[2 * r + 1])});
        const std::string text = m.serialize();
        detail::AtomicFile mf(partial + "/manifest");
        mf.write(text.data(), text.size());
        mf.commit();
        detail::fsync_directory(partial);
        std::error_code ec;
        fs::remove_all(final_dir, ec);
        fs::rename(partial, final_dir);
        detail::fsync_directory(dir);
        prune(dir, options_.checkpoint.keep_last);
      } catch (const std::exception& e) {
        problem = detail::concat("cannot finish checkpoint ", final_dir, ": ", e.what());
      }
    }
    detail::agree(*engine_, problem);
    last_save_ = std::chrono::steady_clock::now();
    return final_dir;
  }
  /// save() into checkpoint.dir.
  std::string save() {
    PARALLAX_EXPECTS(!options_.checkpoint.dir.empty(), "save(): TrainerOptions::checkpoint.dir is empty");
    return save(options_.checkpoint.dir);
  }

  /// Restores every variable, its optimizer state and the step count from
  /// the checkpoint directory `path`, onto any number of ranks (sharded
  /// variables are cut again). Everything is checked first (manifest, model,
  /// every file's size and CRC-32C) and a problem found by any rank is thrown
  /// on every rank before anything is loaded. Collective.
  void restore(const std::string& path) {
    auto scope = engine_->stats().scope("", "checkpoint");
    const int me = engine_->rank(), n = engine_->size();
    std::optional<std::string> problem;
    detail::Manifest m;
    try {
      const std::string mpath = path + "/manifest";
      std::ifstream in(mpath, std::ios::binary);
      if (!in) throw error(detail::concat("checkpoint manifest ", mpath, " is missing or unreadable"));
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      m = detail::Manifest::parse(text, mpath);
      check_model(m, mpath);
    } catch (const std::exception& e) {
      problem = e.what();
    }
    detail::agree(*engine_, problem);

    // Every file is checked in full by one rank.
    for (std::size_t f = static_cast<std::size_t>(me); f < m.files.size() && !problem; f += static_cast<std::size_t>(n)) {
      const std::string fpath = path + "/" + m.files[f].name;
      try {
        if (!detail::file_exists(fpath)) throw error(detail::concat("checkpoint file ", fpath, " is missing"));
        const auto [size, crc] = detail::checksum_file(fpath);
        if (size != m.files[f].size)
          throw error(detail::concat("checkpoint file ", fpath, " has ", size, " bytes; the manifest says ",
                                     m.files[f].size, " (truncated or replaced)"));
        if (crc != m.files[f].crc)
          throw error(detail::concat("checkpoint file ", fpath, " fails its CRC-32C check (corrupt)"));
      } catch (const std::exception& e) {
        problem = e.what();
      }
    }
    detail::agree(*engine_, problem);

    try {
      detail::CheckpointReader reader(path, m);
      for (std::size_t v = 0; v < slots_.size(); ++v) slots_[v]->load(reader, v);
    } catch (const std::exception& e) {
      problem = e.what();
    }
    try {
      detail::agree(*engine_, problem);
    } catch (...) {
      unusable_ = "a restore failed while loading; the variables may be half-loaded";
      throw;
    }
    clear();
    steps_ = m.step;
    unusable_.clear();
    last_save_ = std::chrono::steady_clock::now();
  }

  /// Restores the newest complete checkpoint under `dir` and returns true,
  /// or returns false (changing nothing) if there is none. Collective.
  bool restore_latest(const std::string& dir) {
    std::int64_t step = -1;
    if (engine_->rank() == 0)
      if (auto latest = latest_checkpoint(dir)) step = static_cast<std::int64_t>(latest->step);
    engine_->broadcast(&step, 1, DataType::i64, 0);
    if (step < 0) return false;
    restore(dir + "/" + detail::checkpoint_dir_name(static_cast<std::uint64_t>(step)));
    return true;
  }

  /// Steps completed.
  std::uint64_t steps() const noexcept { return steps_; }

  /// The whole variable, row-major, on the host of every rank (collective for
  /// sharded variables). For tests, evaluation and export.
  template <class V>
  std::vector<typename V::value_type> fetch(const V& var) {
    std::vector<typename V::value_type> out(var.shape().elements());
    slot_of(var).fetch(out.data());
    return out;
  }

  /// Rows of `var` stored on this rank (a shard for ShardedPS).
  template <class V>
  std::size_t stored_rows(const V& var) { return slot_of(var).stored_rows(); }
  /// Whether `var`'s rows on this rank live in shared memory that the other
  /// ranks' lookups read directly (ShardedPS with ShardedOptions::shared_memory,
  /// every rank on one machine).
  template <class V>
  bool in_shared_memory(const V& var) { return slot_of(var).in_shared_memory(); }
  /// The policy synchronising `var` ("RingAllReduce", "AllGatherv", "ShardedPS").
  template <class V>
  std::string policy_of(const V& var) { return slot_of(var).policy(); }

  /// Bytes and calls of every engine call so far, by variable and policy.
  CommStats& stats() noexcept { return engine_->stats(); }
  Engine& engine() noexcept { return *engine_; }
  const Context& context() const noexcept { return *ctx_; }
  const TrainerOptions& options() const noexcept { return options_; }
  const FusedAllReducer<Engine>& fusion() const noexcept { return *fusion_; }

  /// One line per variable: policy, rows stored here.
  std::string describe() const {
    std::ostringstream os;
    for (const auto& s : slots_)
      os << s->name() << ": " << s->policy() << ", " << s->stored_rows() << " rows on rank " << engine_->rank()
         << (s->in_shared_memory() ? " (shared memory)" : "") << "\n";
    return os.str();
  }

 private:
  using Slot = detail::SlotBase<Engine, Optimizer>;

  /// Every slot's synchronisation after the dense all-reduce, in
  /// declaration order, except that the gradient rows of all ShardedPS
  /// variables travel in one route (one engine call on MPI, two elsewhere)
  /// instead of one per variable: ctr's 26 tables went from 52 engine calls
  /// a step to 2, then 1. Each owner then sums and applies what it got, as alone.
  void synchronize_slots(const detail::StepInfo& info) {
    lanes_.clear();
    pushing_.clear();
    for (auto& s : slots_)
      if (detail::RouteLane* lane = s->plan_push()) {
        lanes_.push_back(lane);
        pushing_.push_back(s.get());
      }
    if (!lanes_.empty()) {
      // One variable: its bytes are booked under its own name, as before.
      auto scope = lanes_.size() == 1 ? engine_->stats().scope(pushing_.front()->name(), pushing_.front()->policy())
                                      : engine_->stats().scope("(fused sparse)", ShardedPS::name);
      detail::route_lanes(*engine_, lanes_.data(), lanes_.size(), route_buffers_);
    }
    for (Slot* s : pushing_) s->finish_push(info);
    for (auto& s : slots_)
      if (std::find(pushing_.begin(), pushing_.end(), s.get()) == pushing_.end()) s->synchronize(info);
  }

  template <class V>
  void add(V& var) {
    using Policy = policy_for_t<Arch, V>;
    ShardedOptions sharded = options_.sharded;
    if (auto it = options_.partitions.find(var.name()); it != options_.partitions.end()) sharded.partitions = it->second;
    slots_.push_back(detail::make_slot<Policy>(var, *engine_, opt_, sharded, options_.ring));
    var.state().trainer = this;
  }
  /// Moves the gradients of the fused all-reduce into one arena, end to end
  /// in registration order (each aligned for its elements), as PyTorch DDP's
  /// gradient_as_bucket_view does: the ring then finds a bucket's tensors
  /// adjacent and sends them in place, with no packing. Returns them.
  std::vector<TensorRef> place_fused_gradients() {
    std::vector<TensorRef> fused;
    std::vector<std::size_t> owner, offsets;  // the slot of each fused gradient, its place in the arena
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      const std::size_t before = fused.size();
      slots_[i]->fused_tensors(fused);
      PARALLAX_EXPECTS(fused.size() - before <= 1, "a slot hands at most one gradient to the fused all-reduce");
      if (fused.size() == before) continue;
      const std::size_t align = size_of(fused.back().type);
      bytes = (bytes + align - 1) / align * align;
      owner.push_back(i);
      offsets.push_back(bytes);
      bytes += fused.back().count * align;
    }
    grad_arena_.resize_discard(bytes);
    for (std::size_t k = 0; k < fused.size(); ++k) {
      fused[k].data = grad_arena_.data() + offsets[k];
      slots_[owner[k]]->move_fused_gradient(fused[k].data);
    }
    return fused;
  }

  template <class V>
  void check_unregistered(const V& var) {
    PARALLAX_EXPECTS(var.state().trainer == nullptr, "variable '", var.name(),
                     "' is already registered with another Trainer");
  }

  template <class V>
  Slot& slot_of(const V& var) {
    for (auto& s : slots_)
      if (s->identity() == &var.state()) return *s;
    throw error(detail::concat("variable '", var.name(), "' is not registered with this Trainer"));
  }
  template <class V>
  detail::SparseSlot<typename V::value_type, Engine, Optimizer>& sparse_slot(V& var) {
    return static_cast<detail::SparseSlot<typename V::value_type, Engine, Optimizer>&>(slot_of(var));
  }
  void clear() {
    for (auto& s : slots_) s->clear();
  }
  void ensure_usable() const {
    if (!unusable_.empty()) throw error(detail::concat("this Trainer cannot be used: ", unusable_));
  }

  detail::Manifest manifest_of_model() const {
    detail::Manifest m;
    m.optimizer = Optimizer::name;
    m.slots = Optimizer::slots;
    for (const auto& s : slots_) {
      const detail::VarRecord r = s->record();
      m.variables.push_back({r.name, r.sparse != 0, to_string(static_cast<DataType>(r.type)), r.rows, r.cols,
                             s->saved_partitions()});
    }
    return m;
  }
  /// Throws unless the checkpoint holds this model's variables and optimizer.
  void check_model(const detail::Manifest& m, const std::string& mpath) const {
    const detail::Manifest here = manifest_of_model();
    auto describe = [](const detail::ManifestVariable& v) {
      return detail::concat("'", v.name, "' (", v.rows, " x ", v.cols, ", ", v.type, ", ", v.sparse ? "sparse" : "dense", ")");
    };
    if (m.optimizer != here.optimizer || m.slots != here.slots)
      throw error(detail::concat("checkpoint manifest ", mpath, " was saved with optimizer ", m.optimizer,
                                 "; this trainer uses ", here.optimizer));
    if (m.variables.size() != here.variables.size())
      throw error(detail::concat("checkpoint manifest ", mpath, " holds ", m.variables.size(),
                                 " variables; this model has ", here.variables.size(), " (a different model?)"));
    for (std::size_t v = 0; v < m.variables.size(); ++v) {
      const auto &a = m.variables[v], &b = here.variables[v];
      if (a.name != b.name || a.sparse != b.sparse || a.type != b.type || a.rows != b.rows || a.cols != b.cols)
        throw error(detail::concat("checkpoint manifest ", mpath, " is of a different model: variable #", v, " is ",
                                   describe(a), " there but ", describe(b), " here"));
    }
  }
  void write_rank_header(detail::AtomicFile& file) const {
    const int me = engine_->rank(), n = engine_->size();
    const std::uint64_t rank = static_cast<std::uint64_t>(me), count = slots_.size();
    file.write(detail::RankFileHeader::magic, 8);
    file.write(&rank, 8);
    file.write(&count, 8);
    std::uint64_t offset = detail::RankFileHeader::bytes(slots_.size());
    for (const auto& s : slots_) {
      const detail::VarRecord r = s->record();
      const detail::SavedLayout layout{r.rows, r.cols, s->saved_partitions(), n};
      detail::RankFileHeader::Entry e{layout.stored_rows(me), r.cols, static_cast<std::uint64_t>(Optimizer::slots), offset};
      file.write(&e, sizeof(e));
      offset += e.rows * e.cols * (1 + e.slots) * size_of(static_cast<DataType>(r.type));
    }
  }
  /// Keeps the newest `keep` complete checkpoints and no unfinished ones.
  static void prune(const std::string& dir, int keep) {
    namespace fs = std::filesystem;
    const auto all = list_checkpoints(dir);
    std::error_code ec;
    for (std::size_t i = 0; i + static_cast<std::size_t>(std::max(keep, 1)) < all.size(); ++i) fs::remove_all(all[i].path, ec);
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("step-", 0) == 0 && name.size() > 8 && name.substr(name.size() - 8) == ".partial")
        fs::remove_all(entry.path(), ec);
    }
  }

  const Context* ctx_;
  TrainerOptions options_;
  Optimizer opt_;
  std::unique_ptr<Engine> engine_;
  Buffer<std::byte, space> grad_arena_;  // the fused dense gradients; outlives the slots that borrow it
  std::vector<std::unique_ptr<Slot>> slots_;
  std::unique_ptr<RingAllReducer<Engine>> reducer_;
  std::unique_ptr<FusedAllReducer<Engine>> fusion_;
  std::vector<detail::RouteLane*> lanes_;  // this step's sparse route (synchronize_slots)
  std::vector<Slot*> pushing_;
  detail::RouteBuffers<space> route_buffers_;  // the sparse push's route and batched lookups'
  Buffer<index_t, space> staged_ids_;
  std::uint64_t steps_ = 0;
  std::chrono::steady_clock::time_point last_save_ = std::chrono::steady_clock::now();
  std::string unusable_;  // why the trainer refuses work, if it does
};

}  // namespace parallax
