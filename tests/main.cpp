// The test runner: Catch2 inside MPI. Every rank runs the same test cases
// (they are collective); the process exits with the worst verdict of any
// rank, so every rank reports the same result to CTest: 1 if a check failed
// anywhere, else test::kSkipExit if a case skipped anywhere (skip.hpp), else 0.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "skip.hpp"

#include <mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);

  Catch::Session session;
  int status = session.applyCommandLine(argc, argv);
  if (status == 0) {
    // Ranks other than 0 print only their failures.
    if (rank != 0) session.configData().showSuccessfulTests = false;
    // A filter that matches no case fails (Catch2 passes it by default): a
    // CTest entry that runs nothing must not read as a pass.
    auto& warnings = session.configData().warnings;
    warnings = static_cast<Catch::WarnAbout::What>(warnings | Catch::WarnAbout::NoTests);
    status = session.run();
  }
  int worst = 0;
  MPI_Allreduce(&status, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && worst != status) std::printf("another rank failed (exit status %d)\n", worst);
  int skipped = test::skipped_cases() > 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &skipped, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  if (worst != 0) return 1;
  return skipped ? test::kSkipExit : 0;
}
