#pragma once
// Helpers shared by the tests: the job's context, verdicts agreed across
// ranks, skips (docs/testing.md, "Skipped checks"), the list of memory
// spaces a test is instantiated for, the engine that moves each space's
// memory, and copies between the host and a space.

#include "skip.hpp"

#include <parallax/parallax.hpp>

#include <catch2/catch.hpp>

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace px = parallax;

namespace test {

/// One Context for the whole test binary (MPI is initialised by main.cpp).
inline px::Context& world() {
  static px::Context ctx(MPI_COMM_WORLD);
  return ctx;
}

/// A fresh directory every rank of the world sees (made by rank 0 with
/// mkdtemp under the system's temporary directory, named `<prefix>-XXXXXX`),
/// removed at the end: tests that run at once never share one.
struct TempDir {
  std::string path;
  explicit TempDir(const char* prefix) {
    char buf[256] = {};
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (me == 0) {
      std::string tmpl = (std::filesystem::temp_directory_path() / (std::string(prefix) + "-XXXXXX")).string();
      if (const char* made = mkdtemp(tmpl.data())) std::snprintf(buf, sizeof(buf), "%s", made);
    }
    MPI_Bcast(buf, sizeof(buf), MPI_CHAR, 0, MPI_COMM_WORLD);
    path = buf;
    if (path.empty()) throw std::runtime_error(std::string("test::TempDir: mkdtemp failed for ") + prefix);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    std::error_code ec;
    if (me == 0) std::filesystem::remove_all(path, ec);
  }
};

/// A Context over the world whose hosts are groups of `per_host` ranks
/// (emulated hosts; per_host < 8), made once per binary and kept.
inline px::Context& hosts_of(int per_host) {
  static std::vector<std::unique_ptr<px::Context>> made(8);
  auto& c = made[static_cast<std::size_t>(per_host)];
  if (!c) {
    px::ContextOptions o;
    o.ranks_per_host = per_host;
    c = std::make_unique<px::Context>(MPI_COMM_WORLD, o);
  }
  return *c;
}

/// True on every rank iff `ok` is true on every rank: collective.
inline bool all_ranks(bool ok) {
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all == 1;
}

/// True on every rank iff every rank holds the same bytes in `v`: collective.
template <class T>
bool same_bits_everywhere(const std::vector<T>& v) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a of the bytes
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (std::size_t i = 0; i < v.size() * sizeof(T); ++i) h = (h ^ p[i]) * 1099511628211ull;
  std::uint64_t lo = h, hi = h;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

/// True on every rank iff every rank holds rank 0's `text`: collective.
inline bool same_on_every_rank(const std::string& text) {
  std::string zero = text;
  int size = static_cast<int>(zero.size());
  MPI_Bcast(&size, 1, MPI_INT, 0, MPI_COMM_WORLD);
  zero.resize(static_cast<std::size_t>(size));
  MPI_Bcast(zero.data(), size, MPI_CHAR, 0, MPI_COMM_WORLD);
  return all_ranks(zero == text);
}

/// Collective. Whether the current case must skip its check because
/// `can_run` is false on some rank; if so, reports the skip (rank 0 prints
/// "SKIPPED: <case>: <why>", and the program exits with kSkipExit unless a
/// check failed) and the case must return at once:
///
///   if (test::skip_unless(test::dev_shm_roomy(), "/dev/shm has under 1 GiB free")) return;
///
/// A case that can skip carries a [needs-<what>] tag, so that CTest runs it
/// in an entry of its own (tests/CMakeLists.txt) and a skip hides no other
/// case's pass. Call it before any GENERATE, so it reports once.
inline bool skip_unless(bool can_run, const std::string& why) {
  if (all_ranks(can_run)) return false;
  ++skipped_cases();
  if (world().rank() == 0)
    std::cout << "SKIPPED: " << Catch::getResultCapture().getCurrentTestName() << ": " << why << std::endl;
  return true;
}

/// Collective. skip_unless for a case tagged [np<k>+], whose check cannot
/// fail at fewer than `k` ranks: CTest registers it only at k ranks or more,
/// so it skips only where someone runs it by hand at fewer.
inline bool skip_below_ranks(int k) {
  return skip_unless(world().size() >= k, "needs " + std::to_string(k) + " ranks, runs at " +
                                              std::to_string(world().size()));
}

/// Whether /dev/shm has room for shared shards of test sizes with plenty to
/// spare (SharedWindow needs all of them and 16 MiB): where it does not, a
/// table keeps its shard private and tests cannot expect shared memory.
inline bool dev_shm_roomy() { return px::detail::dev_shm_room() >= (std::size_t{1} << 30); }

/// Collective. skip_unless(dev_shm_roomy()), for a case tagged [needs-shm]
/// whose check needs shared memory to be made.
inline bool skip_without_shm_room() {
  return skip_unless(dev_shm_roomy(), "/dev/shm has under 1 GiB free, where shared windows and shards are refused");
}

/// Whether a ShardedTable over `engine` with shared_memory on may keep its
/// shard in shared memory: host memory, several ranks, one host. Where
/// dev_shm_roomy(), it must.
template <class Engine>
bool can_share(const Engine& engine) {
  return std::is_same_v<typename Engine::space, px::HostSpace> && engine.size() > 1 &&
         engine.topology().num_hosts() == 1;
}

/// Runs `f`, expecting it to throw parallax::error on this rank; returns the
/// message ("" if nothing was thrown).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const px::error& e) {
    return e.what();
  }
  return "";
}

namespace detail {
template <class Space>
struct engine_for;
template <>
struct engine_for<px::HostSpace> {
  using type = px::engine::Mpi;
};
#if PARALLAX_HAS_CUDA
template <>
struct engine_for<px::CudaSpace> {
  using type = px::engine::MpiStaged;
};
#endif
}  // namespace detail

/// The engine a test over memory of `Space` runs on: engine::Mpi for host
/// memory, engine::MpiStaged (any rank count on one GPU) for device memory.
template <class Space>
using engine_for = typename detail::engine_for<Space>::type;

/// Engine calls one route of rows takes (sharded::route_lanes): one where the
/// engine has alltoallv_unsized (the header rides in front of the rows),
/// else a header alltoall and an alltoallv.
template <class Engine>
inline constexpr std::uint64_t route_calls = px::engine::supports_v<Engine, px::engine::op_alltoallv_unsized> ? 1 : 2;

/// The `n` elements at `data` (memory of `Space`), copied to a host vector.
template <class Space, class T>
std::vector<T> to_host(const T* data, std::size_t n) {
  std::vector<T> out(n);
  px::space_traits<Space>::copy_to_host(out.data(), data, n * sizeof(T));
  return out;
}
template <class T, class Space>
std::vector<T> to_host(const px::Rows<T, Space>& rows) {
  return to_host<Space>(rows.data, rows.size());
}

/// Copies a host vector to `dst` (memory of `Space`, room for all of it).
template <class Space, class T>
void copy_from_host(T* dst, const std::vector<T>& src) {
  px::space_traits<Space>::copy_from_host(dst, src.data(), src.size() * sizeof(T));
}

}  // namespace test

#if PARALLAX_HAS_CUDA
#define PARALLAX_TEST_SPACES px::HostSpace, px::CudaSpace
#else
#define PARALLAX_TEST_SPACES px::HostSpace
#endif
