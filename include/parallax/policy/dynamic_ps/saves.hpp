#pragma once
/// @file
/// The files of a saved dynamic table (in a checkpoint's directory by
/// Trainer::save and Checkpoints, or alone by DynamicSynchronizer::save;
/// docs/design.md, "Dynamic tables"): one file per rank with its shard's
/// live keys in key order, their counts, last steps, rows and optimizer
/// state, written under a temporary name, fsynced and renamed; then rank 0's
/// manifest, which names each file's size and CRC-32C, written the same way.
/// A restore checks every file against the manifest, so a save that died
/// part way is refused by name, never read as a mix; a save into a
/// directory of its own leaves the previous ones whole.

#include <parallax/detail/checkpoint_io.hpp>
#include <parallax/dynamic/table.hpp>
#include <parallax/error.hpp>
#include <parallax/types.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace parallax::policy::dynamic_ps {

inline constexpr char shard_magic[8] = {'P', 'X', 'D', 'Y', 'N', '0', '1', '\0'};

/// What a save's manifest records.
struct SavedTable {
  std::string name;
  int ranks = 0;
  std::uint64_t step = 0;  ///< the step the next lookup inserts at
  std::size_t cols = 0;
  int slots = 0;
  std::size_t value_bytes = 0;  ///< sizeof(T)
  std::vector<std::pair<std::uint64_t, std::uint32_t>> files;  ///< size, CRC-32C of each rank's

  std::string serialize() const {
    std::ostringstream os;
    os << "parallax dynamic table\nname " << name << "\nranks " << ranks << "\nstep " << step << "\ncols " << cols
       << "\nslots " << slots << "\nvalue_bytes " << value_bytes << "\n";
    for (const auto& f : files) os << "file " << f.first << " " << f.second << "\n";
    return os.str();
  }
  static SavedTable parse(const std::string& path, const std::string& text) {
    std::istringstream is(text);
    std::string line, word;
    SavedTable t;
    std::getline(is, line);
    if (line != "parallax dynamic table") throw error("dynamic table manifest " + path + ": not a dynamic table manifest");
    while (is >> word) {
      if (word == "name") is >> t.name;
      else if (word == "ranks") is >> t.ranks;
      else if (word == "step") is >> t.step;
      else if (word == "cols") is >> t.cols;
      else if (word == "slots") is >> t.slots;
      else if (word == "value_bytes") is >> t.value_bytes;
      else if (word == "file") {
        std::pair<std::uint64_t, std::uint32_t> f;
        is >> f.first >> f.second;
        t.files.push_back(f);
      } else {
        throw error("dynamic table manifest " + path + ": unknown entry '" + word + "'");
      }
      if (!is) throw error("dynamic table manifest " + path + ": entry '" + word + "' is malformed");
    }
    if (t.ranks < 1 || t.files.size() != static_cast<std::size_t>(t.ranks))
      throw error("dynamic table manifest " + path + ": lists " + std::to_string(t.files.size()) + " files for " +
                  std::to_string(t.ranks) + " ranks");
    return t;
  }
};

inline std::string manifest_path(const std::string& dir, const std::string& name) {
  return dir + "/" + name + ".dynamic";
}
inline std::string shard_path(const std::string& dir, const std::string& name, int rank) {
  return dir + "/" + name + ".dynamic.rank" + std::to_string(rank);
}

/// Writes one shard; returns its size and CRC-32C.
template <class T>
std::pair<std::uint64_t, std::uint32_t> write_shard(const std::string& path, const dynamic::Snapshot<T>& s) {
  parallax::detail::AtomicFile f(path);
  const std::uint64_t head[4] = {s.size(), s.cols, static_cast<std::uint64_t>(s.slots), sizeof(T)};
  f.write(shard_magic, sizeof shard_magic);
  f.write(head, sizeof head);
  f.write(s.keys.data(), s.size() * sizeof(std::uint64_t));
  f.write(s.counts.data(), s.size() * sizeof(std::uint64_t));
  f.write(s.last_steps.data(), s.size() * sizeof(std::uint64_t));
  f.write(s.rows.data(), s.rows.size() * sizeof(T));
  for (int k = 0; k < s.slots; ++k) f.write(s.state[k].data(), s.state[k].size() * sizeof(T));
  f.commit();
  return {f.size(), f.crc()};
}

/// Reads one shard, checking it against its manifest entry.
template <class T>
dynamic::Snapshot<T> read_shard(const std::string& path, std::pair<std::uint64_t, std::uint32_t> want) {
  const auto got = parallax::detail::checksum_file(path);
  if (got.first != want.first || got.second != want.second)
    throw error("dynamic table file " + path + ": its size or checksum differs from its manifest's (a corrupt or "
                "foreign file)");
  std::ifstream in(path, std::ios::binary);
  char magic[8];
  std::uint64_t head[4];
  in.read(magic, sizeof magic);
  in.read(reinterpret_cast<char*>(head), sizeof head);
  if (!in || std::memcmp(magic, shard_magic, sizeof magic) != 0 || head[3] != sizeof(T))
    throw error("dynamic table file " + path + ": not a shard of " + std::to_string(sizeof(T)) + "-byte values");
  dynamic::Snapshot<T> s;
  const std::size_t n = head[0];
  s.cols = head[1];
  s.slots = static_cast<int>(head[2]);
  auto read = [&](auto& v, std::size_t count) {
    v.resize(count);
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * sizeof(v[0])));
  };
  read(s.keys, n);
  read(s.counts, n);
  read(s.last_steps, n);
  read(s.rows, n * s.cols);
  for (int k = 0; k < s.slots; ++k) read(s.state[k], n * s.cols);
  if (!in) throw error("dynamic table file " + path + ": shorter than its header says");
  return s;
}

}  // namespace parallax::policy::dynamic_ps
