// engine::alltoallv_any: messages whose receivers do not know their sizes,
// in one alltoallv_unsized (engine::Mpi) or, on an engine without it, the
// sizes ahead in an alltoall and then an alltoallv; the same bytes land in
// the same places either way.
#include "support.hpp"

#include <parallax/engine/alltoallv_any.hpp>

#include <cstdint>
#include <vector>

namespace {

/// engine::Mpi without alltoallv_unsized: alltoallv_any takes its sized path.
struct MpiSized : px::engine::Mpi {
  using px::engine::Mpi::Mpi;
};
static_assert(!px::engine::supports_v<MpiSized, px::engine::op_alltoallv_unsized>);
static_assert(px::engine::supports_v<px::engine::Mpi, px::engine::op_alltoallv_unsized>);

/// Bytes rank `from` sends rank `to`: a different count for every pair, none
/// from rank 1 to rank 0 (an empty message).
std::size_t bytes_of(int from, int to) { return from == 1 && to == 0 ? 0 : static_cast<std::size_t>(3 * from + to + 1); }
std::byte byte_of(int from, int to, std::size_t i) { return static_cast<std::byte>(from * 64 + to * 8 + static_cast<int>(i % 8)); }

struct Messages {
  std::vector<std::byte> send, recv;
  std::vector<std::size_t> sbytes, sdispls, rbytes, rdispls;
  std::vector<std::int64_t> words;
};

template <class Engine>
Messages messages_of(Engine& e) {
  const int n = e.size(), me = e.rank();
  const auto un = static_cast<std::size_t>(n);
  Messages m{{}, {}, std::vector<std::size_t>(un), std::vector<std::size_t>(un), std::vector<std::size_t>(un, 0),
             std::vector<std::size_t>(un, 0), {}};
  for (int p = 0; p < n; ++p) {
    m.sdispls[p] = m.send.size();
    m.sbytes[p] = bytes_of(me, p);
    for (std::size_t i = 0; i < m.sbytes[p]; ++i) m.send.push_back(byte_of(me, p, i));
  }
  return m;
}

}  // namespace

TEMPLATE_TEST_CASE("alltoallv_any delivers messages of sizes the receivers learn", "[engine][alltoallv_any]",
                   px::engine::Mpi, MpiSized) {
  TestType e(test::world());
  const int n = e.size(), me = e.rank();
  Messages m = messages_of(e);
  const auto before = e.stats().total();
  std::size_t allocated = 0;
  px::engine::alltoallv_any(e, m.send.data(), m.sbytes.data(), m.sdispls.data(), m.rbytes.data(), m.rdispls.data(),
                            [&](std::size_t total) {
                              allocated = total;
                              m.recv.resize(total);
                              return m.recv.data();
                            },
                            m.words);
  const auto used = e.stats().total() - before;
  constexpr bool unsized = px::engine::supports_v<TestType, px::engine::op_alltoallv_unsized>;
  CHECK(used.calls == (unsized ? 1u : 2u));
  std::size_t at = 0;
  for (int p = 0; p < n; ++p) {
    CHECK(m.rbytes[p] == bytes_of(p, me));
    CHECK(m.rdispls[p] == at);
    for (std::size_t i = 0; i < bytes_of(p, me); ++i) REQUIRE(m.recv[at + i] == byte_of(p, me, i));
    at += bytes_of(p, me);
  }
  CHECK(allocated == at);
}

TEST_CASE("alltoallv_any without alltoallv_unsized stops before the messages when told", "[engine][alltoallv_any]") {
  // A route whose ranks disagree (or report a problem) reads the words sent
  // ahead and moves nothing more: one engine call, no room asked for.
  MpiSized e(test::world());
  const int n = e.size(), me = e.rank();
  const auto un = static_cast<std::size_t>(n);
  Messages m = messages_of(e);
  std::vector<std::int64_t> ahead(2 * un), got(2 * un);
  for (std::size_t p = 0; p < un; ++p) {
    ahead[2 * p] = me;  // a word the receivers decide by
    ahead[2 * p + 1] = static_cast<std::int64_t>(m.sbytes[p]);
  }
  const auto before = e.stats().total();
  bool allocated = false;
  const bool moved = px::engine::alltoallv_any(
      e, m.send.data(), m.sbytes.data(), m.sdispls.data(), m.rbytes.data(), m.rdispls.data(),
      [&](std::size_t) {
        allocated = true;
        return m.recv.data();
      },
      2, ahead.data(), got.data(), [&](const std::int64_t* words, std::size_t*) {
        for (int p = 0; p < n; ++p) CHECK(words[2 * p] == p);
        return false;
      });
  CHECK_FALSE(moved);
  CHECK_FALSE(allocated);
  CHECK((e.stats().total() - before).calls == 1u);
  for (std::size_t p = 0; p < un; ++p) CHECK(got[2 * p + 1] == static_cast<std::int64_t>(bytes_of(static_cast<int>(p), me)));
}
