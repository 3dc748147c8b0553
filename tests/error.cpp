// error.hpp: the exception hierarchy and the check macros.
#include "support.hpp"

TEST_CASE("PARALLAX_EXPECTS throws parallax::error with the streamed message", "[error]") {
  auto f = [](int v) { PARALLAX_EXPECTS(v >= 0, "value ", v, " must be >= 0"); };
  CHECK_NOTHROW(f(1));
  CHECK(test::error_of([&] { f(-3); }) == "value -3 must be >= 0");
  CHECK_THROWS_AS(f(-1), px::error);
  CHECK_THROWS_AS(f(-1), std::runtime_error);
}

TEST_CASE("PARALLAX_MPI_CHECK turns an MPI failure into mpi_error with the call and place", "[error][mpi]") {
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  int x = 0;
  try {
    PARALLAX_MPI_CHECK(MPI_Bcast(&x, 1, MPI_INT, /*root=*/1 << 20, comm));  // no such root
    FAIL("no exception");
  } catch (const px::mpi_error& e) {
    CHECK(e.status() != MPI_SUCCESS);
    CHECK_THAT(e.call(), Catch::Contains("MPI_Bcast"));
    CHECK_THAT(std::string(e.file()), Catch::Contains("error.cpp"));
    CHECK(e.line() > 0);
    CHECK_THAT(std::string(e.what()), Catch::Contains("MPI call failed") && Catch::Contains("MPI_Bcast"));
  }
  MPI_Comm_free(&comm);
}

TEST_CASE("every parallax exception is a parallax::error", "[error]") {
  CHECK_THROWS_AS(throw px::timeout_error("late"), px::error);
  CHECK_THROWS_AS(throw px::cuda_error("CUDA", 2, "out of memory", "cudaMalloc(&p, n)", "f.cu", 3), px::error);
  CHECK_THROWS_AS(throw px::nccl_error("NCCL", 3, "internal error", "ncclAllReduce(...)", "f.cu", 4),
                  px::runtime_call_error);
}
