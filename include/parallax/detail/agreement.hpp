#pragma once
// Agreement across ranks: every rank learns the same verdict, so an error
// found on one rank is thrown on all of them and none waits in a collective
// that the others have left.

#include <parallax/error.hpp>
#include <parallax/types.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace parallax::detail {

/// What agree_step() settled besides that nothing failed.
struct StepVerdict {
  bool request = false;                ///< some rank made the request
  std::optional<std::string> notice;   ///< the lowest rank's notice, prefixed with its rank
};

/// Collective. Throws parallax::error on every rank if any rank has a
/// problem (the lowest such rank's message, prefixed with its rank), or if no
/// rank has `has_work` (then with `no_work_message`). Otherwise returns
/// whether any rank made `request` (a flag that rides along, e.g. "save
/// now") and the lowest rank's `notice`, if any rank has one: a finding that
/// fails nothing but that every rank acts on alike (a gradient that is not
/// finite, whose step the trainer skips); a problem anywhere outranks it.
/// One 24-byte all-reduce; a second call (a broadcast of the message) only
/// when some rank has a problem or a notice.
template <class Engine>
StepVerdict agree_step(Engine& engine, const std::optional<std::string>& problem,
                       const std::optional<std::string>& notice, bool has_work, const char* no_work_message,
                       bool request) {
  auto scope = engine.stats().scope("", "control");
  const int n = engine.size(), me = engine.rank();
  // The lowest rank with a problem (0..n-1), else n + the lowest with a notice, else 2n.
  std::int64_t verdict[3] = {problem ? me : notice ? n + me : 2 * n, has_work ? 0 : 1, request ? 0 : 1};
  engine.allreduce(verdict, verdict, 3, DataType::i64, ReduceOp::min);
  StepVerdict out{verdict[2] == 0, std::nullopt};
  if (verdict[0] < 2 * n) {
    const bool failed = verdict[0] < n;
    const int from = static_cast<int>(failed ? verdict[0] : verdict[0] - n);
    const std::optional<std::string>& text_of_mine = failed ? problem : notice;
    std::array<char, 1024> text{};
    if (me == from && text_of_mine) std::strncpy(text.data(), text_of_mine->c_str(), text.size() - 1);
    engine.broadcast(text.data(), text.size(), DataType::u8, from);
    if (failed) throw error(concat("rank ", from, ": ", text.data()));
    out.notice = concat("rank ", from, ": ", text.data());
  }
  if (verdict[1] == 1) throw error(no_work_message);
  return out;
}

/// agree_step() without notices: returns whether any rank made `request`.
template <class Engine>
bool agree(Engine& engine, const std::optional<std::string>& problem, bool has_work = true,
           const char* no_work_message = "", bool request = false) {
  return agree_step(engine, problem, std::nullopt, has_work, no_work_message, request).request;
}

/// What a rank declares about one variable; compared across ranks.
struct VarRecord {
  char name[56] = {};
  std::uint64_t rows = 0, cols = 0;
  std::uint8_t type = 0, sparse = 0;
  std::uint8_t padding[6] = {};
  char policy[16] = {};

  static VarRecord make(const std::string& name, Shape shape, DataType t, bool is_sparse, const char* policy) {
    VarRecord r;
    std::strncpy(r.name, name.c_str(), sizeof(r.name) - 1);
    r.rows = shape.rows;
    r.cols = shape.cols;
    r.type = static_cast<std::uint8_t>(t);
    r.sparse = is_sparse ? 1 : 0;
    std::strncpy(r.policy, policy, sizeof(r.policy) - 1);
    return r;
  }
  bool operator==(const VarRecord& o) const { return std::memcmp(this, &o, sizeof(VarRecord)) == 0; }
  std::string describe() const {
    return concat("'", name, "' (", rows, " x ", cols, ", ", to_string(static_cast<DataType>(type)), ", ",
                  sparse ? "sparse" : "dense", ", ", policy, ")");
  }
};

inline std::uint64_t hash_records(const std::vector<VarRecord>& records) {
  std::uint64_t h = 1469598103934665603ull ^ records.size();
  for (const auto& r : records) {
    const auto* p = reinterpret_cast<const unsigned char*>(&r);
    for (std::size_t i = 0; i < sizeof(VarRecord); ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  return h;
}

/// Collective. Throws parallax::error on every rank, naming the first
/// variable and the ranks that differ, unless all ranks declared the same
/// variables in the same order. One all-reduce when they agree.
template <class Engine>
void agree_on_variables(Engine& engine, const std::vector<VarRecord>& mine) {
  auto scope = engine.stats().scope("", "control");
  const int n = engine.size();
  const std::uint64_t h = hash_records(mine);
  std::int64_t lohi[2] = {static_cast<std::int64_t>(h >> 1), -static_cast<std::int64_t>(h >> 1)};
  engine.allreduce(lohi, lohi, 2, DataType::i64, ReduceOp::min);
  if (lohi[0] == -lohi[1]) return;

  // They differ: gather everything and name the first difference.
  const auto un = static_cast<std::size_t>(n);
  std::int64_t count = static_cast<std::int64_t>(mine.size());
  std::vector<std::int64_t> counts(un);
  engine.allgather(&count, counts.data(), 1, DataType::i64);
  const auto most = static_cast<std::size_t>(*std::max_element(counts.begin(), counts.end()));
  std::vector<VarRecord> padded(most), all(most * un);
  std::copy(mine.begin(), mine.end(), padded.begin());
  engine.allgather(padded.data(), all.data(), most * sizeof(VarRecord), DataType::u8);
  for (std::size_t i = 0; i < most; ++i) {
    for (int r = 1; r < n; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      const bool has0 = i < static_cast<std::size_t>(counts[0]), hasr = i < static_cast<std::size_t>(counts[ur]);
      if (has0 && hasr && all[i] == all[ur * most + i]) continue;
      const std::string a = has0 ? all[i].describe() : std::string("missing");
      const std::string b = hasr ? all[ur * most + i].describe() : std::string("missing");
      throw error(concat("ranks disagree on the model's variables: variable #", i, " is ", a, " on rank 0 but ", b,
                         " on rank ", r, " (declare the same variables, in the same order, on every rank)"));
    }
  }
  throw error("ranks disagree on the model's variables");  // hash collision of equal lists cannot happen here
}

/// An FNV-1a hash of words and strings: the shape word of a collective call,
/// which every rank computes alike from what the call carries.
class Fingerprint {
 public:
  Fingerprint& add(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) h_ = (h_ ^ ((v >> (8 * i)) & 0xFFu)) * 1099511628211ull;
    return *this;
  }
  Fingerprint& add(std::string_view s) {
    add(s.size());
    for (char c : s) h_ = (h_ ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    return *this;
  }
  std::uint64_t value() const noexcept { return h_; }

 private:
  std::uint64_t h_ = 1469598103934665603ull;
};

/// Collective: every rank of a call whose ranks found that they carried
/// different shapes calls it (`shapes[r]` is rank r's shape word, known to
/// every rank from the call's headers). Throws the same parallax::error on
/// every rank: "parallax: ranks make different <what>", then each group of
/// ranks that carried one shape with what it carried, then `rule`.
/// `describe(false)` names what this rank's call carries; `describe(true)`
/// says more, and is used when the short forms do not tell the groups apart.
/// Two small all-gathers of the descriptions; nothing when ranks agree,
/// since it is called only then.
template <class Engine, class Describe>
[[noreturn]] void throw_different_calls(Engine& engine, const std::vector<std::uint64_t>& shapes, const char* what,
                                        const char* rule, Describe&& describe) {
  auto scope = engine.stats().scope("", "control");
  const int n = engine.size();
  const auto un = static_cast<std::size_t>(n);
  const std::string mine = describe(false) + std::string(1, '\0') + describe(true);
  const std::int64_t length = static_cast<std::int64_t>(mine.size());
  std::vector<std::int64_t> lengths(un);
  engine.allgather(&length, lengths.data(), 1, DataType::i64);
  std::vector<std::size_t> counts(un), displs(un);
  std::size_t total = 0;
  for (std::size_t r = 0; r < un; ++r) {
    counts[r] = static_cast<std::size_t>(lengths[r]);
    displs[r] = total;
    total += counts[r];
  }
  std::string all(total, '\0');
  engine.allgatherv(mine.data(), mine.size(), all.data(), counts.data(), displs.data(), DataType::u8);
  auto form = [&](std::size_t r, bool detailed) {
    const std::string text = all.substr(displs[r], counts[r]);
    const auto cut = text.find('\0');
    return detailed ? text.substr(cut + 1) : text.substr(0, cut);
  };
  // Groups of ranks by shape, in the order of their lowest rank.
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < n; ++r) {
    auto g = std::find_if(groups.begin(), groups.end(),
                          [&](const auto& members) { return shapes[static_cast<std::size_t>(members[0])] == shapes[static_cast<std::size_t>(r)]; });
    if (g == groups.end()) groups.push_back({r});
    else g->push_back(r);
  }
  bool short_forms_differ = true;
  for (std::size_t a = 0; a < groups.size(); ++a)
    for (std::size_t b = 0; b < a; ++b)
      short_forms_differ = short_forms_differ && form(static_cast<std::size_t>(groups[a][0]), false) !=
                                                     form(static_cast<std::size_t>(groups[b][0]), false);
  std::string text = concat("parallax: ranks make different ", what, ": ");
  for (std::size_t g = 0; g < groups.size(); ++g) {
    text += g ? "; " : "";
    text += groups[g].size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < groups[g].size(); ++i) text += concat(i ? ", " : "", groups[g][i]);
    text += ": " + form(static_cast<std::size_t>(groups[g][0]), !short_forms_differ);
  }
  throw error(concat(text, ". ", rule));
}

}  // namespace parallax::detail
