// TrainerOptions::resolve(): the one place a trainer reads the environment,
// and where what depends on the job is settled.

#include "support.hpp"

#include <cstdlib>
#include <optional>
#include <string>

namespace {

/// Sets (or, with nothing, unsets) an environment variable for its lifetime.
class Env {
 public:
  Env(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* was = std::getenv(name)) was_ = was;
    if (value) ::setenv(name, value->c_str(), 1);
    else ::unsetenv(name);
  }
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;
  ~Env() {
    if (was_) ::setenv(name_, was_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> was_;
};

}  // namespace

TEST_CASE("resolve() reads PARALLAX_TIMELINE where the timeline is not set", "[options]") {
  auto& ctx = test::world();
  px::TrainerOptions o;
  {
    const Env unset("PARALLAX_TIMELINE", std::nullopt);
    CHECK(o.resolve(ctx).timeline.empty());
  }
  const Env set("PARALLAX_TIMELINE", "/tmp/parallax_options_test.json");
  CHECK(o.resolve(ctx).timeline == "/tmp/parallax_options_test.json");
  o.timeline = "/tmp/mine.json";  // the option wins
  CHECK(o.resolve(ctx).timeline == "/tmp/mine.json");
  CHECK(o.timeline == "/tmp/mine.json");  // resolve() returns a copy
}

namespace {
/// A ShardedOptions switch that `variable`=0 turns off and nothing turns on.
void check_off_only(const char* variable, bool px::ShardedOptions::*flag) {
  auto& ctx = test::world();
  px::TrainerOptions o;
  {
    const Env unset(variable, std::nullopt);
    CHECK(o.resolve(ctx).sharded.*flag);
  }
  {
    const Env off(variable, "0");
    CHECK(!(o.resolve(ctx).sharded.*flag));
  }
  const Env on(variable, "1");
  CHECK(o.resolve(ctx).sharded.*flag);
  o.sharded.*flag = false;
  CHECK(!(o.resolve(ctx).sharded.*flag));
}
}  // namespace

TEST_CASE("resolve() turns shared shards off with PARALLAX_SHARED_SHARDS=0, never on", "[options]") {
  check_off_only("PARALLAX_SHARED_SHARDS", &px::ShardedOptions::shared_memory);
}

TEST_CASE("resolve() turns early rows off with PARALLAX_EARLY_ROWS=0, never on", "[options]") {
  check_off_only("PARALLAX_EARLY_ROWS", &px::ShardedOptions::early_rows);
}

TEST_CASE("resolve() settles on_non_finite: skip, or ignore where updates precede the step", "[options]") {
  auto& ctx = test::world();
  px::TrainerOptions o;
  CHECK(o.on_non_finite == px::NonFinite::automatic);
  CHECK(o.resolve(ctx).on_non_finite == px::NonFinite::skip);
  o.update_when_ready = true;
  CHECK(o.resolve(ctx).on_non_finite == px::NonFinite::ignore);
  for (auto mode : {px::NonFinite::skip, px::NonFinite::fail, px::NonFinite::ignore}) {
    o.on_non_finite = mode;  // chosen: kept (the trainer refuses what it cannot honour)
    CHECK(o.resolve(ctx).on_non_finite == mode);
  }
}

TEST_CASE("resolve() says whether the communication thread runs, and resolving again changes nothing",
          "[options]") {
  auto& ctx = test::world();
  px::TrainerOptions o;
  o.overlap = false;
  const px::TrainerOptions off = o.resolve(ctx);
  CHECK(!off.overlap);
  CHECK(off.engine.yield == px::engine::Options::Yield::automatic);
  o.overlap = true;
  o.overlap_needs_spare_core = false;  // the thread wherever MPI allows one
  const px::TrainerOptions on = o.resolve(ctx);
  CHECK(on.overlap == ctx.serialized_threads());
  // A device space's thread needs no spare core either.
  o.overlap_needs_spare_core = true;
  CHECK(o.resolve<px::CudaSpace>(ctx).overlap == ctx.serialized_threads());
  const px::TrainerOptions twice = on.resolve(ctx);
  CHECK(twice.overlap == on.overlap);
  CHECK(twice.engine.yield == on.engine.yield);
  CHECK(twice.on_non_finite == on.on_non_finite);
}
