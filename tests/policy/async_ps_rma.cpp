// AsyncPS's route across hosts (MPI one-sided windows, policy/async_ps/rma.hpp)
// forced on one machine: every guarantee async_ps.cpp checks of the
// shared-memory route, checked again through RMA, plus what only this route
// has (the choice of route, and the staleness wait's deadline reading only
// this rank's memory).
#define PARALLAX_TEST_ASYNC_RMA 1
#include "async_ps.cpp"

#include <cstdlib>

TEST_CASE("AsyncPS takes the route it is told, and the RMA route across hosts by itself", "[async]") {
  auto& ctx = test::world();
  Table e(ctx, "e", {R, C});
  {
    px::Trainer<px::arch::Async, px::optim::Sgd> trainer(ctx, options(1), px::optim::Sgd{1.f}, e);
    CHECK(trainer.synchronizer<px::AsyncPS>().rma());
  }
  px::TrainerOptions o = options(1);
  o.async.route = px::AsyncOptions::Route::automatic;
  px::Trainer<px::arch::Async, px::optim::Sgd> trainer(ctx, o, px::optim::Sgd{1.f}, e);
  // One machine here: shared memory, unless PARALLAX_ASYNC_ROUTE says otherwise.
  const char* env = std::getenv("PARALLAX_ASYNC_ROUTE");
  CHECK(trainer.synchronizer<px::AsyncPS>().rma() == (env != nullptr && std::string(env) == "rma"));
}

TEST_CASE("PARALLAX_ASYNC_ROUTE: a value that names no route is refused by name", "[async]") {
  auto& ctx = test::world();
  Table e(ctx, "e", {R, C});
  const char* before = std::getenv("PARALLAX_ASYNC_ROUTE");
  const std::string saved = before ? before : "";
  setenv("PARALLAX_ASYNC_ROUTE", "rdma", 1);
  px::TrainerOptions o = options(1);
  o.async.route = px::AsyncOptions::Route::automatic;
  CHECK_THROWS_WITH((px::Trainer<px::arch::Async, px::optim::Sgd>(ctx, o, px::optim::Sgd{1.f}, e)),
                    Catch::Contains("PARALLAX_ASYNC_ROUTE") && Catch::Contains("'rdma'"));
  if (before) setenv("PARALLAX_ASYNC_ROUTE", saved.c_str(), 1);
  else unsetenv("PARALLAX_ASYNC_ROUTE");
}
