#pragma once
/// @file
/// Checkpoints: where a Trainer saves, how often, how many it keeps, and how
/// to find them. Saving and restoring are Trainer::save() and
/// Trainer::restore(); the format is in docs/design.md ("Checkpoints").

#include <parallax/error.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace parallax {

/// When and where a Trainer saves on its own (during step()).
struct CheckpointOptions {
  /// Directory of the checkpoints (on a file system every rank sees). Empty:
  /// no automatic saves.
  std::string dir;
  /// Save after every this many steps (0: not by step count).
  std::uint64_t every_steps = 0;
  /// Save when this many seconds passed since the last save (0: not by time).
  /// Rank 0's clock decides; the decision travels with the step's agreement.
  double every_seconds = 0;
  /// Complete checkpoints kept; older ones are deleted after a save.
  int keep_last = 3;
};

/// A complete checkpoint found on disk.
struct CheckpointInfo {
  std::uint64_t step = 0;
  std::string path;
};

/// The complete checkpoints under `dir` (directories step-<N> holding a
/// manifest; unfinished ones end in .partial and are skipped), oldest first.
inline std::vector<CheckpointInfo> list_checkpoints(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<CheckpointInfo> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) != 0 || name.size() <= 5) continue;
    const std::string digits = name.substr(5);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    if (!fs::exists(entry.path() / "manifest", ec)) continue;
    out.push_back({std::stoull(digits), entry.path().string()});
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

namespace detail {
inline std::string checkpoint_dir_name(std::uint64_t step) {
  std::string digits = std::to_string(step);
  if (digits.size() < 10) digits.insert(0, 10 - digits.size(), '0');
  return "step-" + digits;
}
}  // namespace detail

}  // namespace parallax
