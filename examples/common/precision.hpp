#pragma once
// --table-type f32|bf16|fp16 (the sparse tables' storage) and --compress
// none|bf16|fp16 (dense gradients on the wire), shared by the examples that
// take them.

#include "common/backend.hpp"

#include <parallax/parallax.hpp>

#include <boost/program_options.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace examples {

struct Precision {
  std::string table_type = "f32";  ///< the tables' storage: f32, bf16 or fp16
  std::string compress = "none";   ///< dense gradients on the wire: none, bf16 or fp16

  px::Compression compression() const {
    return compress == "bf16" ? px::Compression::bf16 : compress == "fp16" ? px::Compression::fp16 : px::Compression::none;
  }
};

inline void add_precision_options(boost::program_options::options_description& desc, Precision& p) {
  namespace po = boost::program_options;
  desc.add_options()
    ("table-type", po::value(&p.table_type)->default_value(p.table_type),
     "the sparse tables' storage: f32, bf16 or fp16 (16-bit rows are trained in float and rounded stochastically)")
    ("compress", po::value(&p.compress)->default_value(p.compress),
     "dense gradients on the wire: none, bf16 or fp16 (summed in float, rounded to 16 bits)");
}

/// What is wrong with the options, or "".
inline std::string check_precision(const Precision& p) {
  if (p.table_type != "f32" && p.table_type != "bf16" && p.table_type != "fp16")
    return "--table-type must be f32, bf16 or fp16, not '" + p.table_type + "'";
  if (p.compress != "none" && p.compress != "bf16" && p.compress != "fp16")
    return "--compress must be none, bf16 or fp16, not '" + p.compress + "'";
  return "";
}

/// Prints (rank 0) the bytes of the tables' rows stored on rank 0 and the
/// most on any rank, as stored. Collective.
template <class Trainer, class... Tables>
void print_table_bytes(const px::Context& ctx, Trainer& trainer, const Precision& p, const Tables&... tables) {
  std::uint64_t mine = 0;
  auto add = [&](const auto& t) {
    if constexpr (px::is_variable_v<std::decay_t<decltype(t)>>) mine += trainer.stored_bytes(t);
    else for (const auto& v : t) mine += trainer.stored_bytes(v);
  };
  (add(tables), ...);
  std::uint64_t most = mine;
  MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_UINT64_T, MPI_MAX, ctx.comm());
  if (ctx.is_root())
    std::printf("tables: %s, %llu bytes on rank 0, %llu at most on a rank; dense gradients on the wire: %s\n",
                p.table_type.c_str(), static_cast<unsigned long long>(mine), static_cast<unsigned long long>(most),
                p.compress.c_str());
}

/// f(Stored{}) with the table storage --table-type names (float, px::bf16 or
/// px::fp16), where Arch's policy for such tables stores 16-bit rows;
/// throws naming the architecture where it does not.
template <class Arch, class F>
int with_table_type(const Precision& p, F&& f) {
  auto with = [&](auto stored) -> int {
    using Table = px::Variable<px::Sparse, decltype(stored), DefaultSpace>;
    if constexpr (px::policy::stores_half<px::policy_for_t<Arch, Table>>::value) {
      return f(stored);
    } else {
      throw px::error(std::string("--table-type ") + p.table_type + ": the " + Arch::name +
                      " architecture cannot store its tables in 16 bits (use --arch hybrid, ps or allreduce, or "
                      "--sync async)");
    }
  };
  if (p.table_type == "bf16") return with(px::bf16{});
  if (p.table_type == "fp16") return with(px::fp16{});
  return f(float{});
}

}  // namespace examples
