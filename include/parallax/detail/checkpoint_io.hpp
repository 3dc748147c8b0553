#pragma once
// Checkpoint files: CRC-32C, the manifest (text) and the per-rank data files
// (binary), with atomic writes. Host code only; the slots copy to and from
// their space. Format described in docs/design.md ("Checkpoints").
//
// A checkpoint is a directory step-<S>/ holding
//   manifest        text: format, step, ranks, optimizer, one line per
//                   variable (name, shape, type, layout), one line per data
//                   file (name, size, CRC-32C), and a checksum of the text
//   rank-<r>.bin    "PXCKPT01", rank, variable count, then per variable
//                   (rows stored, cols, slots, offset), then the data: per
//                   variable the stored rows of the value and of each slot.
// Rows a rank stores: its shard (sharded layout), or all rows on rank 0
// and none elsewhere (replicated layout).

#include <parallax/error.hpp>
#include <parallax/half.hpp>
#include <parallax/partition.hpp>
#include <parallax/types.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace parallax::detail {

// ---------------------------------------------------------------- CRC-32C

/// CRC-32C (Castagnoli), the checksum of iSCSI, ext4 and Btrfs metadata.
class Crc32c {
 public:
  void update(const void* data, std::size_t n) noexcept {
    static const std::array<std::uint32_t, 256> table = make_table();
    const auto* p = static_cast<const unsigned char*>(data);
    std::uint32_t c = crc_;
    for (std::size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
    crc_ = c;
  }
  std::uint32_t value() const noexcept { return crc_ ^ 0xFFFFFFFFu; }

 private:
  static std::array<std::uint32_t, 256> make_table() {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }
  std::uint32_t crc_ = 0xFFFFFFFFu;
};

inline std::uint32_t crc32c(const void* data, std::size_t n) {
  Crc32c c;
  c.update(data, n);
  return c.value();
}

// ---------------------------------------------------------------- test events

/// Checkpoint events (tests only): where a save or a removal has got to.
/// A program compiled with PARALLAX_CHECKPOINT_EVENTS defined (in every
/// translation unit) may set a hook that is called at each of them; the
/// kill drill (tests/fault/checkpoint_drill.cpp) kills ranks there. Without
/// the macro they compile to nothing.
using CheckpointHook = void (*)(const char* event);
#ifdef PARALLAX_CHECKPOINT_EVENTS
inline CheckpointHook& checkpoint_hook() {
  static CheckpointHook hook = nullptr;
  return hook;
}
#endif
inline void checkpoint_event([[maybe_unused]] const char* event) {
#ifdef PARALLAX_CHECKPOINT_EVENTS
  if (CheckpointHook hook = checkpoint_hook()) hook(event);
#endif
}

// ---------------------------------------------------------------- files

[[noreturn]] inline void io_fail(const std::string& path, const std::string& what) {
  throw error(concat("checkpoint file ", path, ": ", what, errno ? concat(" (", std::strerror(errno), ")") : ""));
}

/// Writes a file under a temporary name, flushes it to disk, then renames it.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
    errno = 0;
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) io_fail(tmp_, "cannot create");
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(tmp_.c_str());  // not committed: leave nothing behind
    }
  }
  void write(const void* data, std::size_t n) {
    const auto* p = static_cast<const char*>(data);
    crc_.update(data, n);
    size_ += n;
    while (n > 0) {
      errno = 0;
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) io_fail(tmp_, "write failed");
      p += w;
      n -= static_cast<std::size_t>(w);
    }
  }
  /// fsync, close, rename into place.
  void commit() {
    errno = 0;
    if (::fsync(fd_) != 0) io_fail(tmp_, "fsync failed");
    ::close(fd_);
    fd_ = -1;
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) io_fail(path_, "rename failed");
  }
  std::uint64_t size() const noexcept { return size_; }
  std::uint32_t crc() const noexcept { return crc_.value(); }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  Crc32c crc_;
  std::uint64_t size_ = 0;
};

inline void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

/// Removes a directory and everything under it, one file at a time
/// (std::filesystem::remove_all, with an event after each file). Errors are
/// ignored: what is left stays for the next attempt.
inline void remove_tree(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> entries;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) entries.push_back(it->path());
  for (const auto& entry : entries) {
    if (fs::is_directory(fs::symlink_status(entry, ec))) {
      remove_tree(entry);
    } else {
      fs::remove(entry, ec);
      checkpoint_event("remove:file");
    }
  }
  fs::remove(path, ec);
}

inline bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

inline std::uint64_t file_size(const std::string& path) {
  struct stat st;
  errno = 0;
  if (::stat(path.c_str(), &st) != 0) io_fail(path, "is missing");
  return static_cast<std::uint64_t>(st.st_size);
}

/// CRC-32C and size of a whole file.
inline std::pair<std::uint64_t, std::uint32_t> checksum_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  errno = 0;
  if (!in) io_fail(path, "cannot be opened");
  Crc32c c;
  std::vector<char> buf(std::size_t{1} << 20);
  std::uint64_t size = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto got = static_cast<std::size_t>(in.gcount());
    c.update(buf.data(), got);
    size += got;
  }
  return {size, c.value()};
}

// ---------------------------------------------------------------- manifest

// ---------------------------------------------------------------- element types

/// The element types a variable may have in a checkpoint, by the name the
/// manifest records (to_string of the DataType).
inline std::optional<DataType> saved_type_named(const std::string& name) {
  for (DataType t : {DataType::f32, DataType::f64, DataType::bf16, DataType::f16})
    if (name == to_string(t)) return t;
  return std::nullopt;
}

/// Whether a value saved as `saved` restores into a variable of `wanted`:
/// the same type, or any two of f32, bf16 and f16 (through float, rounded
/// to nearest even where the target is narrower). f64 restores only into
/// f64: f64 -> 16 bits through float would round twice.
inline bool restorable(DataType saved, DataType wanted) {
  auto narrow = [](DataType t) { return t == DataType::f32 || t == DataType::bf16 || t == DataType::f16; };
  return saved == wanted || (narrow(saved) && narrow(wanted));
}

/// Whether converting `saved` into `wanted` keeps every value: widening to
/// f32, or the same type. bf16 <-> f16 rounds both ways (bf16 has the
/// range, f16 the precision).
inline bool converts_exactly(DataType saved, DataType wanted) { return saved == wanted || wanted == DataType::f32; }

/// dst[i] = src[i] (n elements of `from`) converted to T through float,
/// rounded to nearest even (half.hpp) where T is narrower.
template <class T>
void convert_elements(DataType from, const void* src, T* dst, std::size_t n) {
  if constexpr (std::is_same_v<T, float> || is_half_v<T>) {
    auto each = [&](const auto* in) {
      for (std::size_t i = 0; i < n; ++i) dst[i] = T(static_cast<float>(in[i]));
    };
    switch (from) {
      case DataType::f32: return each(static_cast<const float*>(src));
      case DataType::bf16: return each(static_cast<const bf16*>(src));
      case DataType::f16: return each(static_cast<const fp16*>(src));
      default: break;
    }
  }
  throw error(concat("checkpoint: cannot convert ", to_string(from), " elements to ", to_string(data_type_of_v<T>)));
}

struct ManifestVariable {
  std::string name;
  bool sparse = false;
  std::string type;  // to_string of its DataType: "f32", "f64", "bf16", "f16"
  std::uint64_t rows = 0, cols = 0;
  int partitions = 0;  // 0: replicated on rank 0; else sharded with this P
};

/// A variable without a fixed row layout (a dynamic table), saved in files
/// of its own: each saving rank's, then one that describes them.
struct ManifestTable {
  std::string name;
  std::string type;  // as ManifestVariable's
  std::uint64_t cols = 0;
};

struct ManifestFile {
  std::string name;
  std::uint64_t size = 0;
  std::uint32_t crc = 0;
};

struct Manifest {
  static constexpr int format = 1;
  std::uint64_t step = 0;
  int ranks = 0;
  std::string optimizer;
  /// The trainer's base learning rate (Trainer::set_learning_rate), for
  /// optimizers that have one; exact (written as a hexadecimal float).
  std::optional<double> learning_rate;
  int slots = 0;
  std::vector<ManifestVariable> variables;
  std::vector<ManifestTable> tables;
  /// The rank files (rank_file_name(r) for r in [0, ranks)), then each
  /// table's files: one per saving rank and its description.
  std::vector<ManifestFile> files;

  std::string serialize() const {
    std::ostringstream os;
    os << "parallax-checkpoint " << format << "\n"
       << "step " << step << "\n"
       << "ranks " << ranks << "\n"
       << "optimizer " << optimizer << " " << slots << "\n";
    if (learning_rate) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%a", *learning_rate);
      os << "learning_rate " << buf << "\n";
    }
    for (const auto& v : variables)
      os << "variable " << v.name << " " << (v.sparse ? "sparse" : "dense") << " " << v.type << " " << v.rows << " "
         << v.cols << " " << v.partitions << "\n";
    for (const auto& t : tables) os << "table " << t.name << " " << t.type << " " << t.cols << "\n";
    for (const auto& f : files) os << "file " << f.name << " " << f.size << " " << f.crc << "\n";
    std::string body = os.str();
    return body + "checksum " + std::to_string(crc32c(body.data(), body.size())) + "\n";
  }

  /// Parses a manifest; throws parallax::error naming `path` and the problem.
  static Manifest parse(const std::string& text, const std::string& path) {
    auto bad = [&](const std::string& what) -> error {
      return error(concat("checkpoint manifest ", path, ": ", what));
    };
    const auto tail = text.rfind("checksum ");
    if (tail == std::string::npos || (tail > 0 && text[tail - 1] != '\n'))
      throw bad("has no checksum line (truncated?)");
    {
      std::istringstream cs(text.substr(tail + 9));
      std::uint64_t want = 0;
      if (!(cs >> want)) throw bad("has a malformed checksum line");
      if (crc32c(text.data(), tail) != want) throw bad("checksum mismatch: the manifest is corrupt");
    }
    Manifest m;
    std::istringstream in(text.substr(0, tail));
    std::string line;
    int line_no = 0;
    bool header = false;
    while (std::getline(in, line)) {
      ++line_no;
      std::istringstream ls(line);
      std::string key;
      ls >> key;
      auto need = [&](bool ok) {
        if (!ok || !(ls >> std::ws).eof()) throw bad(concat("line ", line_no, " is malformed: '", line, "'"));
      };
      if (key == "parallax-checkpoint") {
        int f = 0;
        need(static_cast<bool>(ls >> f));
        if (f != format) throw bad(concat("format ", f, " is not supported (this build reads format ", format, ")"));
        header = true;
      } else if (key == "step") {
        need(static_cast<bool>(ls >> m.step));
      } else if (key == "ranks") {
        need(static_cast<bool>(ls >> m.ranks) && m.ranks > 0 && m.ranks <= (1 << 24));
      } else if (key == "optimizer") {
        need(static_cast<bool>(ls >> m.optimizer >> m.slots) && m.slots >= 0 && m.slots <= 2);
      } else if (key == "learning_rate") {
        std::string word;
        ls >> word;
        char* end = nullptr;
        const double lr = std::strtod(word.c_str(), &end);
        need(!word.empty() && end == word.c_str() + word.size() && std::isfinite(lr) && lr >= 0);
        m.learning_rate = lr;
      } else if (key == "variable") {
        ManifestVariable v;
        std::string kind;
        need(static_cast<bool>(ls >> v.name >> kind >> v.type >> v.rows >> v.cols >> v.partitions) &&
             (kind == "sparse" || kind == "dense") && saved_type_named(v.type) && v.rows > 0 &&
             v.cols > 0 && v.partitions >= 0 && static_cast<std::uint64_t>(v.partitions) <= v.rows);
        v.sparse = kind == "sparse";
        m.variables.push_back(v);
      } else if (key == "table") {
        ManifestTable t;
        need(static_cast<bool>(ls >> t.name >> t.type >> t.cols) && saved_type_named(t.type) && t.cols > 0);
        m.tables.push_back(t);
      } else if (key == "file") {
        ManifestFile f;
        need(static_cast<bool>(ls >> f.name >> f.size >> f.crc) && f.name.find('/') == std::string::npos);
        m.files.push_back(f);
      } else if (!key.empty()) {
        throw bad(concat("line ", line_no, " has an unknown key '", key, "'"));
      }
    }
    if (!header) throw bad("is not a parallax checkpoint manifest");
    if (m.ranks <= 0) throw bad("has no rank count");
    const std::size_t ranks = static_cast<std::size_t>(m.ranks);
    if (m.files.size() != ranks + m.tables.size() * (ranks + 1))
      throw bad(concat("lists ", m.files.size(), " data files for ", m.ranks, " ranks and ", m.tables.size(),
                       " dynamic tables"));
    return m;
  }
};

inline std::string rank_file_name(int r) { return concat("rank-", r, ".bin"); }

/// Whether the directory `path` holds a complete checkpoint: an intact
/// manifest, and every data file it names, of the size it records. Reads
/// the manifest and stats the files; the data are checked on restore.
inline bool checkpoint_complete(const std::string& path) {
  std::ifstream in(path + "/manifest", std::ios::binary);
  if (!in) return false;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    for (const ManifestFile& f : Manifest::parse(text, path).files) {
      struct stat st;
      if (::stat((path + "/" + f.name).c_str(), &st) != 0 || static_cast<std::uint64_t>(st.st_size) != f.size)
        return false;
    }
  } catch (const error&) {
    return false;
  }
  return true;
}

/// Where the saved rows of one variable live: replicated (all rows in rank
/// 0's file) or sharded (partition map of the saving job).
struct SavedLayout {
  std::uint64_t rows = 0, cols = 0;
  int partitions = 0;
  int ranks = 1;
  std::uint64_t stored_rows(int r) const {
    if (partitions == 0) return r == 0 ? rows : 0;
    return PartitionMap(rows, partitions, ranks).shard_rows(r);
  }
};

/// One rank's data file.
struct RankFileHeader {
  static constexpr char magic[9] = "PXCKPT01";
  struct Entry {
    std::uint64_t rows = 0, cols = 0, slots = 0, offset = 0;
  };
  std::vector<Entry> entries;
  static std::uint64_t bytes(std::size_t variables) { return 8 + 8 + 8 + variables * sizeof(Entry); }
};

/// Reads row ranges of saved variables from the rank files of a checkpoint,
/// through the layout the saving job used.
class CheckpointReader {
 public:
  CheckpointReader(std::string dir, Manifest manifest) : dir_(std::move(dir)), manifest_(std::move(manifest)) {}

  const Manifest& manifest() const noexcept { return manifest_; }

  /// out[(i - first) * cols + c] = saved element (row i, col c) of variable v,
  /// of its value (what = 0) or optimizer slot what - 1, for i in [first, first + n).
  /// Saved in another type than T (restorable()), the elements are converted
  /// (convert_elements).
  template <class T>
  void read_rows(std::size_t v, int what, std::uint64_t first, std::uint64_t n, T* out) {
    const ManifestVariable& mv = manifest_.variables[v];
    const std::optional<DataType> saved = saved_type_named(mv.type);
    if (!saved) throw error(concat("checkpoint variable '", mv.name, "' has the unknown element type '", mv.type, "'"));
    if (*saved == data_type_of_v<T>) return read_saved_rows(v, what, first, n, out, sizeof(T));
    if (!restorable(*saved, data_type_of_v<T>))
      throw error(concat("checkpoint variable '", mv.name, "' was saved as ", mv.type, " and cannot be restored as ",
                         to_string(data_type_of_v<T>)));
    std::vector<unsigned char> raw(n * mv.cols * size_of(*saved));
    read_saved_rows(v, what, first, n, raw.data(), size_of(*saved));
    convert_elements(*saved, raw.data(), out, n * mv.cols);
  }

 private:
  /// read_rows() in the saved type (`element` bytes each), into `out_bytes`
  /// (room for n rows of it).
  void read_saved_rows(std::size_t v, int what, std::uint64_t first, std::uint64_t n, void* out_bytes,
                       std::size_t element) {
    const ManifestVariable& mv = manifest_.variables[v];
    const std::uint64_t row_bytes = mv.cols * element;
    auto* out = static_cast<char*>(out_bytes);
    auto read_from = [&](int r, std::uint64_t local, std::uint64_t count, char* dst) {
      RankFile& f = file(r);
      const RankFileHeader::Entry& e = f.header.entries.at(v);
      if (local + count > e.rows) io_fail(f.path, concat("holds ", e.rows, " rows of variable '", mv.name, "', not ", local + count));
      const std::uint64_t at = e.offset + static_cast<std::uint64_t>(what) * e.rows * row_bytes + local * row_bytes;
      f.in.seekg(static_cast<std::streamoff>(at));
      f.in.read(dst, static_cast<std::streamsize>(count * row_bytes));
      errno = 0;
      if (!f.in) io_fail(f.path, concat("ends before the rows of variable '", mv.name, "'"));
    };
    if (mv.partitions == 0) return read_from(0, first, n, out);
    const PartitionMap map(mv.rows, mv.partitions, manifest_.ranks);
    std::uint64_t row = first, done = 0;
    while (done < n) {
      const int p = map.partition_of(static_cast<index_t>(row));
      const std::uint64_t end = std::min<std::uint64_t>(map.begin(p) + map.size(p), first + n);
      read_from(map.owner_of_partition(p), map.shard_offset(p) + (row - map.begin(p)), end - row,
                out + done * row_bytes);
      done += end - row;
      row = end;
    }
  }

  struct RankFile {
    std::string path;
    std::ifstream in;
    RankFileHeader header;
  };
  RankFile& file(int r) {
    auto it = files_.find(r);
    if (it != files_.end()) return it->second;
    RankFile& f = files_[r];
    f.path = dir_ + "/" + rank_file_name(r);
    f.in.open(f.path, std::ios::binary);
    errno = 0;
    if (!f.in) io_fail(f.path, "cannot be opened");
    char magic[8];
    std::uint64_t rank = 0, count = 0;
    f.in.read(magic, 8);
    f.in.read(reinterpret_cast<char*>(&rank), 8);
    f.in.read(reinterpret_cast<char*>(&count), 8);
    if (!f.in || std::memcmp(magic, RankFileHeader::magic, 8) != 0) io_fail(f.path, "is not a parallax rank file");
    if (rank != static_cast<std::uint64_t>(r)) io_fail(f.path, concat("belongs to rank ", rank, ", not ", r));
    if (count != manifest_.variables.size())
      io_fail(f.path, concat("holds ", count, " variables; the manifest lists ", manifest_.variables.size()));
    f.header.entries.resize(count);
    f.in.read(reinterpret_cast<char*>(f.header.entries.data()),
              static_cast<std::streamsize>(count * sizeof(RankFileHeader::Entry)));
    if (!f.in) io_fail(f.path, "has a truncated header");
    for (std::size_t v = 0; v < count; ++v) {
      const auto& mv = manifest_.variables[v];
      const SavedLayout layout{mv.rows, mv.cols, mv.partitions, manifest_.ranks};
      const auto& e = f.header.entries[v];
      if (e.rows != layout.stored_rows(r) || e.cols != mv.cols || e.slots != static_cast<std::uint64_t>(manifest_.slots))
        io_fail(f.path, concat("does not match the manifest's layout of variable '", mv.name, "'"));
    }
    return f;
  }

  std::string dir_;
  Manifest manifest_;
  std::map<int, RankFile> files_;
};

}  // namespace parallax::detail
