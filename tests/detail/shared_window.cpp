// detail/shared_window.hpp: every rank reads every rank's segment where it
// lies; a window that would not fit in /dev/shm is refused on every rank.
#include "support.hpp"

#include <parallax/detail/shared_window.hpp>

TEST_CASE("every rank reads the others' segments of a shared window", "[detail][shared][needs-shm]") {
  if (test::skip_without_shm_room()) return;
  auto& ctx = test::world();
  const int n = ctx.size(), me = ctx.rank();
  // Segments of different sizes; rank 1's empty.
  const auto count = [](int r) { return r == 1 ? std::size_t{0} : static_cast<std::size_t>(3 + 2 * r); };
  auto w = px::detail::SharedWindow<std::int64_t>::create(ctx.comm(), count(me));
  REQUIRE(test::all_ranks(static_cast<bool>(w)));  // every test rank runs on this machine
  for (std::size_t i = 0; i < count(me); ++i) w.local()[i] = me * 1000 + static_cast<std::int64_t>(i);
  w.sync();
  MPI_Barrier(ctx.comm());
  w.sync();
  bool exact = true;
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < count(r); ++i) exact = exact && w.bases()[r][i] == r * 1000 + static_cast<std::int64_t>(i);
  CHECK(test::all_ranks(exact));
  CHECK(w.bases()[me] == w.local());
  MPI_Barrier(ctx.comm());  // nobody writes again before everyone has read
}

TEST_CASE("a shared window larger than /dev/shm is refused on every rank", "[detail][shared]") {
  auto& ctx = test::world();
  // 2^44 floats (64 TiB) per rank: no /dev/shm holds them, and nothing is mapped.
  auto w = px::detail::SharedWindow<float>::create(ctx.comm(), std::size_t{1} << 44);
  CHECK(!w);
  CHECK(w.local() == nullptr);
  // The communicator still agrees: a small window right after is made on
  // every rank or on none ("... then a small one" below: made, given room).
  auto small = px::detail::SharedWindow<float>::create(ctx.comm(), 4);
  CHECK(test::all_ranks(static_cast<bool>(small)) == static_cast<bool>(small));
}

TEST_CASE("after a refused shared window, a small one is made on every rank", "[detail][shared][needs-shm]") {
  if (test::skip_without_shm_room()) return;
  auto& ctx = test::world();
  auto huge = px::detail::SharedWindow<float>::create(ctx.comm(), std::size_t{1} << 44);
  REQUIRE(!huge);
  auto small = px::detail::SharedWindow<float>::create(ctx.comm(), 4);
  CHECK(test::all_ranks(static_cast<bool>(small)));
}
