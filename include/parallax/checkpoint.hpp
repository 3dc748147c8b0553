#pragma once
/// @file
/// Checkpoints: finding them on disk, and the component that saves and
/// restores a trainer's variables (Trainer::save(), restore() and the
/// automatic saves of TrainerOptions::checkpoint call it). The format is in
/// docs/design.md ("Checkpoints").

#include <parallax/detail/agreement.hpp>
#include <parallax/detail/checkpoint_io.hpp>
#include <parallax/error.hpp>
#include <parallax/options.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/types.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace parallax {

/// A variable that restore() converted: saved in one element type, restored
/// into a variable of another (any two of f32, bf16 and f16).
struct CheckpointConversion {
  std::string variable;
  DataType saved = DataType::f32;
  DataType restored = DataType::f32;
  /// Whether every value came through unchanged (a widening to f32); else
  /// each was rounded to nearest, ties to even (values beyond the target's
  /// range became infinities).
  bool exact = false;
  /// "variable 'emb': saved as f32, restored as bf16, rounded to nearest even".
  std::string describe() const {
    return detail::concat("variable '", variable, "': saved as ", to_string(saved), ", restored as ", to_string(restored),
                          exact ? ", exactly" : ", rounded to nearest even");
  }
};

/// A complete checkpoint found on disk.
struct CheckpointInfo {
  std::uint64_t step = 0;
  std::string path;
};

namespace detail {
inline std::string checkpoint_dir_name(std::uint64_t step) {
  std::string digits = std::to_string(step);
  if (digits.size() < 10) digits.insert(0, 10 - digits.size(), '0');
  return "step-" + digits;
}

/// The step of a name `step-<digits>` followed by `suffix`, if the name is one.
inline std::optional<std::uint64_t> checkpoint_step(const std::string& name, const std::string& suffix = "") {
  if (name.rfind("step-", 0) != 0 || name.size() <= 5 + suffix.size() || name.size() > 5 + 19 + suffix.size() ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  const std::string digits = name.substr(5, name.size() - 5 - suffix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  return std::stoull(digits);
}

/// Renames a checkpoint (or leftover) directory out of the listed names to
/// `<path>.removing`, makes the rename durable, then deletes it file by
/// file. A kill before the rename leaves it as it was; after, a leftover.
inline void remove_checkpoint_dir(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path where = fs::path(path).lexically_normal();
  if (where.filename().empty()) where = where.parent_path();  // "dir/step-N/"
  const std::string doomed = where.string() + ".removing";
  remove_tree(doomed);  // an earlier removal of this name, interrupted
  fs::rename(where, doomed);
  fsync_directory(where.parent_path().empty() ? "." : where.parent_path().string());
  checkpoint_event("remove:renamed");
  remove_tree(doomed);
}
}  // namespace detail

/// The complete checkpoints under `dir`, oldest first: the directories
/// `step-<N>` whose manifest is intact and whose every data file is there,
/// of the size the manifest records (the data themselves are checked when
/// one is restored). A save or a removal, killed at any instant, leaves
/// only these and leftovers that are not listed (docs/design.md,
/// "Checkpoints").
inline std::vector<CheckpointInfo> list_checkpoints(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<CheckpointInfo> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto step = detail::checkpoint_step(it->path().filename().string());
    if (step && detail::checkpoint_complete(it->path().string())) out.push_back({*step, it->path().string()});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

/// The newest complete checkpoint under `dir`, if any.
inline std::optional<CheckpointInfo> latest_checkpoint(const std::string& dir) {
  auto all = list_checkpoints(dir);
  if (all.empty()) return std::nullopt;
  return all.back();
}

/// Removes the checkpoint at `path` (a `step-<N>` directory) so that no
/// instant of the removal leaves it listed but incomplete: it leaves the
/// listed names in one rename before any file goes. Not collective; call it
/// from one process, while no save runs in the same directory. Throws
/// parallax::error if it cannot be renamed.
inline void remove_checkpoint(const std::string& path) {
  try {
    detail::remove_checkpoint_dir(path);
  } catch (const std::exception& e) {
    throw error(detail::concat("cannot remove checkpoint ", path, ": ", e.what()));
  }
}

/// Removes what interrupted saves and removals left under `dir`, and that
/// list_checkpoints() does not list: `step-<N>.partial` (a save),
/// `step-<N>.removing` (a removal) and `step-<N>` directories that are not
/// complete checkpoints (removals by versions of parallax that deleted in
/// place). Every save does this first. Returns the paths removed. Not
/// collective; call it from one process, while no save runs in the same
/// directory.
inline std::vector<std::string> remove_checkpoint_leftovers(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code kind;
    if (!fs::is_directory(it->symlink_status(kind))) continue;
    const bool leftover = detail::checkpoint_step(name, ".partial") || detail::checkpoint_step(name, ".removing") ||
                          (detail::checkpoint_step(name) && !detail::checkpoint_complete(it->path().string()));
    if (leftover) removed.push_back(it->path().string());
  }
  for (const auto& path : removed) detail::remove_tree(path);  // none is listed, whatever is left of it
  return removed;
}

/// A trainer's checkpoints: every variable (its members, in registration
/// order) and its optimizer state, saved by every rank in its own layout and
/// restored onto any rank count; dynamic tables (Member::saves_files) in
/// files of their own in the same directory, listed and checked by the same
/// manifest. Every call is collective.
template <class Engine>
class Checkpoints {
 public:
  /// @param optimizer the optimizer's name and state values per element,
  ///                  recorded in the manifest and checked on restore
  Checkpoints(Engine& engine, CheckpointOptions options, std::string optimizer, int slots,
              std::vector<policy::Member*> members)
      : engine_(&engine), options_(std::move(options)), optimizer_(std::move(optimizer)), slots_(slots) {
    for (policy::Member* m : members) (m->saves_files() ? tables_ : members_).push_back(m);
  }

  const CheckpointOptions& options() const noexcept { return options_; }

  /// Whether rank 0's clock says a timed save is due (the request travels
  /// with the step's agreement, so every rank decides alike).
  bool time_to_save() const {
    return engine_->rank() == 0 && !options_.dir.empty() && options_.every_seconds > 0 &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save_).count() >=
               options_.every_seconds;
  }
  /// Whether a save is due after `steps` steps, given whether a timed save
  /// was requested.
  bool due(std::uint64_t steps, bool requested) const {
    return !options_.dir.empty() && (requested || (options_.every_steps > 0 && steps % options_.every_steps == 0));
  }

  /// Saves every variable and its optimizer state as checkpoint
  /// `dir/step-<step>`: each rank writes its own rows into
  /// `step-<step>.partial`, rank 0 adds the manifest and renames the
  /// directory, so it is listed only once complete; then the checkpoints
  /// beyond the newest `keep_last` are removed (each renamed out of the
  /// listed names first). A kill at any instant leaves complete checkpoints
  /// and unlisted leftovers, which the next save removes first
  /// (docs/design.md, "Checkpoints"). `learning_rate`, when given, is
  /// recorded in the manifest (restored_learning_rate() reads it back).
  /// Returns the checkpoint's path.
  std::string save(const std::string& dir, std::uint64_t step, std::optional<double> learning_rate = std::nullopt) {
    namespace fs = std::filesystem;
    auto scope = engine_->stats().scope("", "checkpoint");
    const int me = engine_->rank(), n = engine_->size();
    const std::string final_dir = dir + "/" + detail::checkpoint_dir_name(step);
    const std::string partial = final_dir + ".partial";
    std::optional<std::string> problem;
    detail::checkpoint_event("save:begin");
    if (me == 0) {
      try {
        std::error_code ec;
        fs::create_directories(dir, ec);
        remove_checkpoint_leftovers(dir);
        if (!fs::create_directory(partial, ec))
          problem = detail::concat("cannot create checkpoint directory ", partial, ": ", ec.message());
      } catch (const std::exception& e) {
        problem = detail::concat("cannot prepare checkpoint directory ", partial, ": ", e.what());
      }
    }
    detail::agree(*engine_, problem);

    std::uint64_t meta[2] = {0, 0};
    try {
      detail::AtomicFile file(partial + "/" + detail::rank_file_name(me));
      write_rank_header(file);
      for (policy::Member* m : members_) m->save(file);
      file.commit();
      detail::checkpoint_event("save:rank-file");
      meta[0] = file.size();
      meta[1] = file.crc();
    } catch (const std::exception& e) {
      problem = e.what();
    }
    detail::agree(*engine_, problem);
    std::vector<std::uint64_t> metas(2 * static_cast<std::size_t>(n));
    engine_->allgather(meta, metas.data(), 2, DataType::i64);
    std::vector<detail::ManifestFile> table_files;  // dynamic tables: their own files, listed after the rank files
    for (policy::Member* t : tables_) {
      auto files = t->save_files(partial);  // collective; throws on every rank
      table_files.insert(table_files.end(), files.begin(), files.end());
    }

    if (me == 0) {
      try {
        detail::Manifest m = manifest_of_model();
        m.step = step;
        m.learning_rate = learning_rate;
        m.ranks = n;
        for (int r = 0; r < n; ++r)
          m.files.push_back({detail::rank_file_name(r), metas[2 * r], static_cast<std::uint32_t>(metas[2 * r + 1])});
        m.files.insert(m.files.end(), table_files.begin(), table_files.end());
        const std::string text = m.serialize();
        detail::AtomicFile mf(partial + "/manifest");
        mf.write(text.data(), text.size());
        mf.commit();
        detail::checkpoint_event("save:manifest");
        detail::fsync_directory(partial);
        // A checkpoint of this step saved before (a run resumed from an
        // earlier one) leaves the listed names first: rename() does not
        // replace a directory that has files.
        std::error_code ec;
        const bool replaces = fs::exists(final_dir, ec);
        if (replaces) {
          detail::remove_tree(final_dir + ".removing");
          fs::rename(final_dir, final_dir + ".removing");
        }
        fs::rename(partial, final_dir);
        detail::fsync_directory(dir);
        detail::checkpoint_event("save:committed");
        if (replaces) detail::remove_tree(final_dir + ".removing");
      } catch (const std::exception& e) {
        problem = detail::concat("cannot finish checkpoint ", final_dir, ": ", e.what());
      }
      if (!problem) prune(dir, options_.keep_last);
    }
    detail::agree(*engine_, problem);
    last_save_ = std::chrono::steady_clock::now();
    return final_dir;
  }

  /// Restores every variable and its optimizer state from the checkpoint
  /// directory `path`, onto any number of ranks (sharded variables are cut
  /// again), and returns the step it was saved at. Everything is checked
  /// first (manifest, model, every file's size and CRC-32C) and a problem
  /// found by any rank is thrown on every rank before anything is loaded.
  /// If loading itself fails, damaged() says so afterwards. A variable saved
  /// in another of f32, bf16 and f16 than its own type is converted (rounded
  /// to nearest even where narrower), and restored_conversions() names it.
  std::uint64_t restore(const std::string& path) {
    auto scope = engine_->stats().scope("", "checkpoint");
    conversions_.clear();
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
      for (std::size_t v = 0; v < members_.size(); ++v) members_[v]->load(reader, v);
    } catch (const std::exception& e) {
      problem = e.what();
    }
    try {
      detail::agree(*engine_, problem);
      for (policy::Member* t : tables_) t->load_files(path);  // collective; throws on every rank
    } catch (...) {
      damaged_ = true;
      throw;
    }
    damaged_ = false;
    last_save_ = std::chrono::steady_clock::now();
    restored_learning_rate_ = m.learning_rate;
    conversions_ = conversions_from(m);
    return m.step;
  }

  /// True when the last restore() failed while loading: the variables may
  /// be half-loaded.
  bool damaged() const noexcept { return damaged_; }
  /// The learning rate recorded by the checkpoint the last restore() loaded,
  /// if it recorded one.
  std::optional<double> restored_learning_rate() const noexcept { return restored_learning_rate_; }
  /// The variables the last successful restore() converted from the element
  /// type they were saved in, in registration order (empty when every type
  /// matched). The same on every rank.
  const std::vector<CheckpointConversion>& restored_conversions() const noexcept { return conversions_; }

  /// The step of the newest complete checkpoint under `dir` (rank 0 looks),
  /// if any.
  std::optional<std::uint64_t> latest(const std::string& dir) {
    std::int64_t step = -1;
    if (engine_->rank() == 0)
      if (auto found = latest_checkpoint(dir)) step = static_cast<std::int64_t>(found->step);
    engine_->broadcast(&step, 1, DataType::i64, 0);
    if (step < 0) return std::nullopt;
    return static_cast<std::uint64_t>(step);
  }

 private:
  detail::Manifest manifest_of_model() const {
    detail::Manifest m;
    m.optimizer = optimizer_;
    m.slots = slots_;
    for (const policy::Member* s : members_) {
      const detail::VarRecord r = s->record();
      m.variables.push_back({r.name, r.sparse != 0, to_string(static_cast<DataType>(r.type)), r.rows, r.cols,
                             s->saved_partitions()});
    }
    for (const policy::Member* t : tables_) {
      const detail::VarRecord r = t->record();
      m.tables.push_back({r.name, to_string(static_cast<DataType>(r.type)), r.cols});
    }
    return m;
  }
  /// With optim::Groups on both sides (each variable's optimizer recorded,
  /// "groups:adagrad,adam,..."): "; variable 'x' was saved with ..." for
  /// the first variable whose optimizer differs; else empty.
  static std::string first_optimizer_difference(const detail::Manifest& saved, const detail::Manifest& here) {
    const std::string prefix = "groups:";
    if (saved.optimizer.rfind(prefix, 0) != 0 || here.optimizer.rfind(prefix, 0) != 0) return {};
    auto split = [&](const std::string& s) {
      std::vector<std::string> out(1);
      for (std::size_t i = prefix.size(); i < s.size(); ++i) {
        if (s[i] == ',') out.emplace_back();
        else out.back() += s[i];
      }
      return out;
    };
    const auto a = split(saved.optimizer), b = split(here.optimizer);
    for (std::size_t v = 0; v < a.size() && v < b.size() && v < here.variables.size(); ++v)
      if (a[v] != b[v])
        return detail::concat("; variable '", here.variables[v].name, "' was saved with ", a[v], ", here it uses ",
                              b[v]);
    return {};
  }
  /// Throws unless the checkpoint holds this model's variables and optimizer.
  void check_model(const detail::Manifest& m, const std::string& mpath) const {
    const detail::Manifest here = manifest_of_model();
    auto describe = [](const detail::ManifestVariable& v) {
      return detail::concat("'", v.name, "' (", v.rows, " x ", v.cols, ", ", v.type, ", ", v.sparse ? "sparse" : "dense",
                            ")");
    };
    if (m.optimizer != here.optimizer || m.slots != here.slots)
      throw error(detail::concat("checkpoint manifest ", mpath, " was saved with optimizer ", m.optimizer,
                                 "; this trainer uses ", here.optimizer, first_optimizer_difference(m, here)));
    if (m.variables.size() != here.variables.size())
      throw error(detail::concat("checkpoint manifest ", mpath, " holds ", m.variables.size(),
                                 " variables; this model has ", here.variables.size(), " (a different model?)"));
    for (std::size_t v = 0; v < m.variables.size(); ++v) {
      const auto &a = m.variables[v], &b = here.variables[v];
      const auto saved = detail::saved_type_named(a.type), wanted = detail::saved_type_named(b.type);
      const bool types = saved && wanted && detail::restorable(*saved, *wanted);
      if (a.name != b.name || a.sparse != b.sparse || !types || a.rows != b.rows || a.cols != b.cols)
        throw error(detail::concat("checkpoint manifest ", mpath, " is of a different model: variable #", v, " is ",
                                   describe(a), " there but ", describe(b), " here"));
    }
    auto tables = [](const std::vector<detail::ManifestTable>& ts) {
      std::string out;
      for (const auto& t : ts) out += detail::concat(out.empty() ? "" : ", ", "'", t.name, "' (", t.cols, " columns, ", t.type, ")");
      return out.empty() ? std::string("none") : out;
    };
    bool same = m.tables.size() == here.tables.size();
    for (std::size_t t = 0; same && t < m.tables.size(); ++t)
      same = m.tables[t].name == here.tables[t].name && m.tables[t].type == here.tables[t].type &&
             m.tables[t].cols == here.tables[t].cols;
    if (!same)
      throw error(detail::concat("checkpoint manifest ", mpath, " is of a different model: its dynamic tables are ",
                                 tables(m.tables), "; this model's are ", tables(here.tables)));
  }
  /// The variables whose saved type differs from the type this model
  /// stores them in (check_model accepted m; members_ are m's variables,
  /// in order).
  std::vector<CheckpointConversion> conversions_from(const detail::Manifest& m) const {
    std::vector<CheckpointConversion> out;
    for (std::size_t v = 0; v < m.variables.size(); ++v) {
      const auto saved = detail::saved_type_named(m.variables[v].type);
      const DataType stored = members_[v]->stored_type();
      if (saved && *saved != stored)
        out.push_back({members_[v]->name(), *saved, stored, detail::converts_exactly(*saved, stored)});
    }
    return out;
  }
  void write_rank_header(detail::AtomicFile& file) const {
    const int me = engine_->rank(), n = engine_->size();
    const std::uint64_t rank = static_cast<std::uint64_t>(me), count = members_.size();
    file.write(detail::RankFileHeader::magic, 8);
    file.write(&rank, 8);
    file.write(&count, 8);
    std::uint64_t offset = detail::RankFileHeader::bytes(members_.size());
    for (const policy::Member* s : members_) {
      const detail::VarRecord r = s->record();
      const detail::SavedLayout layout{r.rows, r.cols, s->saved_partitions(), n};
      detail::RankFileHeader::Entry e{layout.stored_rows(me), r.cols, static_cast<std::uint64_t>(slots_), offset};
      file.write(&e, sizeof(e));
      offset += e.rows * e.cols * (1 + e.slots) * size_of(static_cast<DataType>(r.type));
    }
  }
  /// Removes the complete checkpoints beyond the newest `keep`, oldest
  /// first. Best effort, and local to rank 0: one that cannot be removed
  /// stays listed, whole.
  static void prune(const std::string& dir, int keep) noexcept {
    detail::checkpoint_event("prune:begin");
    try {
      const auto all = list_checkpoints(dir);
      for (std::size_t i = 0; i + static_cast<std::size_t>(std::max(keep, 1)) < all.size(); ++i) {
        try {
          detail::remove_checkpoint_dir(all[i].path);
        } catch (const std::exception&) {
        }
      }
    } catch (const std::exception&) {
    }
  }

  Engine* engine_;
  CheckpointOptions options_;
  std::string optimizer_;
  int slots_;
  std::vector<policy::Member*> members_;  // fixed row layouts: rows in the rank files
  std::vector<policy::Member*> tables_;   // dynamic tables: files of their own
  std::chrono::steady_clock::time_point last_save_ = std::chrono::steady_clock::now();
  bool damaged_ = false;
  std::optional<double> restored_learning_rate_;
  std::vector<CheckpointConversion> conversions_;
};

}  // namespace parallax
