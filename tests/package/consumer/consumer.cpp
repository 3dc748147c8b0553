// The program both packaging tests build: it includes only the umbrella
// header, as a user does, and checks that the pieces parallax links (MPI,
// OpenMP, Thrust from CCCL) work in a project that is not parallax's own.
// Prints "consumer OK" on rank 0 and exits 0 only when every check passes.
#include <parallax/parallax.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

namespace px = parallax;

namespace {

/// Element i of rank r's contribution: distinct for every rank and element.
std::int64_t contribution(int rank, std::size_t i) { return 1000 * static_cast<std::int64_t>(rank) + 1 + static_cast<std::int64_t>(i); }

/// Sets v[i] = contribution(rank, i) with the portable for_each (OpenMP).
struct Fill {
  std::int64_t* v;
  int rank;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i) const { v[i] = contribution(rank, i); }
};

}  // namespace

int main(int argc, char** argv) {
  px::Context ctx(argc, argv);
  px::engine::Mpi mpi(ctx);
  const int n = ctx.size();
  bool ok = true;

  // All-reduce of rank-distinct values: sum over r of (1000 r + 1 + i).
  const std::size_t count = 7;
  px::Buffer<std::int64_t> v(count);
  px::for_each(px::Exec<px::HostSpace>{}, count, Fill{v.data(), ctx.rank()});
  mpi.allreduce(v.data(), v.data(), count, px::DataType::i64, px::ReduceOp::sum);
  for (std::size_t i = 0; i < count; ++i) {
    const std::int64_t want = 1000 * static_cast<std::int64_t>(n) * (n - 1) / 2 + n * static_cast<std::int64_t>(1 + i);
    if (v[i] != want) {
      std::fprintf(stderr, "rank %d: element %zu is %lld, expected %lld\n", ctx.rank(), i,
                   static_cast<long long>(v[i]), static_cast<long long>(want));
      ok = false;
    }
  }

  // A sparse gradient coalesced with Thrust's OpenMP backend: rows 3, 1, 3.
  px::SparseGrad<float> g(px::Shape{4, 1}, "consumer");
  g.add(std::vector<px::index_t>{3, 1, 3}, std::vector<float>{1.f, 2.f, 4.f});
  g.coalesce();
  if (g.size() != 2 || g.indices()[0] != 1 || g.indices()[1] != 3 || g.values()[0] != 2.f || g.values()[1] != 5.f) {
    std::fprintf(stderr, "rank %d: SparseGrad::coalesce gave a wrong result\n", ctx.rank());
    ok = false;
  }

  // Every rank reports the same verdict.
  std::int32_t all_ok = ok ? 1 : 0;
  mpi.allreduce(&all_ok, &all_ok, 1, px::DataType::i32, px::ReduceOp::min);
  if (all_ok == 1 && ctx.is_root())
    std::printf("consumer OK: parallax %s, %d ranks, %d OpenMP threads per rank\n", PARALLAX_VERSION_STRING, n,
                ctx.threads());
  return all_ok == 1 ? 0 : 1;
}
