// The test runner: Catch2 inside MPI. Every rank runs the same test cases
// (they are collective); the process exits with the worst verdict of any
// rank, so every rank reports the same result to CTest.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

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
    status = session.run();
  }
  int worst = 0;
  MPI_Allreduce(&status, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && worst != status) std::printf("another rank failed (exit status %d)\n", worst);
  MPI_Finalize();
  return worst == 0 ? 0 : 1;
}
