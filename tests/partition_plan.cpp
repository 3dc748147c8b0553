// partition_plan.hpp: the load model picks N for uniform ids and more
// partitions for a hot range; the measured fit recovers a known model.
#include "support.hpp"

TEST_CASE("plan_partitions keeps P = N when ids are spread evenly", "[partition_plan]") {
  px::engine::Mpi mpi(test::world());
  const int n = mpi.size();
  const std::size_t rows = 64 * 100;
  std::vector<px::index_t> sample;
  for (std::size_t i = static_cast<std::size_t>(mpi.rank()); i < rows; i += 3) sample.push_back(static_cast<px::index_t>(i));
  const px::PartitionPlan plan = px::plan_partitions(mpi, rows, sample);
  CHECK(plan.partitions == n);
  CHECK(plan.candidates.front().partitions == n);
  CHECK(plan.candidates.front().imbalance < 1.01);
}

TEST_CASE("plan_partitions spreads a hot range of rows over more partitions", "[partition_plan]") {
  px::engine::Mpi mpi(test::world());
  const int n = mpi.size();
  const std::size_t rows = 64 * 100;
  // Every rank asks only for rows in the first 1/N of the table: with P = N,
  // one owner serves everything.
  std::vector<px::index_t> sample;
  for (std::size_t i = 0; i < rows / static_cast<std::size_t>(n); ++i) sample.push_back(static_cast<px::index_t>(i));
  const px::PartitionPlan plan = px::plan_partitions(mpi, rows, sample);
  CHECK(plan.candidates.front().imbalance == Approx(n));
  if (n > 1) {
    CHECK(plan.partitions > n);
    const auto chosen = std::find_if(plan.candidates.begin(), plan.candidates.end(),
                                     [&](const auto& c) { return c.partitions == plan.partitions; });
    CHECK(chosen->imbalance < 1.05);
  }
  // Every rank got the same plan.
  int p = plan.partitions, lo = 0, hi = 0;
  MPI_Allreduce(&p, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&p, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  CHECK(lo == hi);
}

TEST_CASE("plan_partitions rejects ids outside the variable", "[partition_plan]") {
  px::engine::Mpi mpi(test::world());
  CHECK_THAT(test::error_of([&] { px::plan_partitions(mpi, 10, {3, 10}); }), Catch::Contains("sample id 10"));
}

TEST_CASE("fit_partition_model recovers b/P + a(P-1) + c", "[partition_plan]") {
  const px::PartitionModel truth{0.002, 8.0, 1.5};
  const std::vector<int> ps{4, 8, 16, 32, 64, 128};
  std::vector<double> ts;
  for (int p : ps) ts.push_back(truth(p));
  const px::PartitionModel fit = px::fit_partition_model(ps, ts);
  CHECK(fit.a == Approx(truth.a).epsilon(1e-9));
  CHECK(fit.b == Approx(truth.b).epsilon(1e-9));
  CHECK(fit.c == Approx(truth.c).epsilon(1e-9));
  // The optimum of b/P + aP is near sqrt(b/a) = 63.2.
  CHECK(fit.best(ps) == 64);
  CHECK_THAT(test::error_of([] { px::fit_partition_model({1, 2}, {1.0, 2.0}); }), Catch::Contains("at least three"));
  CHECK_THAT(test::error_of([] { px::fit_partition_model({2, 2, 2}, {1.0, 1.0, 1.0}); }), Catch::Contains("distinct"));
}
