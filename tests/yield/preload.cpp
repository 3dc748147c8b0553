// tools/yield: the CTest entries of more ranks than the machine has cores
// run with libparallax_yield preloaded (tools/yield/CMakeLists.txt), through
// mpiexec into every rank, where it stands in for UCX's ucp_worker_progress
// and MPI's calls complete through it.
#include "support.hpp"

#include <dlfcn.h>
#include <mpi.h>

#include <string>

namespace {

/// The file of the ucp_worker_progress this process's calls reach, or ""
/// where nothing loaded defines one.
std::string progress_owner() {
  void* f = dlsym(RTLD_DEFAULT, "ucp_worker_progress");
  Dl_info info{};
  if (f == nullptr || dladdr(f, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

}  // namespace

TEST_CASE("ranks that outnumber the cores progress MPI through libparallax_yield, the others through UCX",
          "[yield][needs-ucx]") {
  const std::string owner = progress_owner();
  if (test::skip_unless(!owner.empty(), "this MPI does not progress through UCX (no ucp_worker_progress loaded)"))
    return;
  const int ranks = test::world().size();
  const bool oversubscribed = ranks > PARALLAX_TEST_CORES;
  INFO(ranks << " ranks, " << PARALLAX_TEST_CORES << " cores at configure time; ucp_worker_progress from " << owner);
  CHECK((owner.find("libparallax_yield") != std::string::npos) == oversubscribed);
  // MPI's calls go through it: a collective completes, with every rank's part.
  int one = 1, sum = 0;
  REQUIRE(MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS);
  CHECK(sum == ranks);
}
