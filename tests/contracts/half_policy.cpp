// Must not compile: a policy that does not say it stores 16-bit tables
// (no `stores_half`) is given one.
#include <parallax/parallax.hpp>
namespace px = parallax;
struct FloatOnly {  // ShardedPS's machinery, without its stores_half
  static constexpr const char* name = "FloatOnly";
  using options = std::tuple<px::policy::sharded::Options>;
  template <class Engine, class Optimizer>
  using synchronizer = px::policy::ShardedSynchronizer<Engine, Optimizer>;
};
int main() {
  px::Context ctx(MPI_COMM_SELF);
  px::Variable<px::Sparse, px::bf16, px::HostSpace, FloatOnly> emb(ctx, "emb", {4, 2});
  px::Trainer<px::arch::Hybrid, px::optim::Sgd> trainer(ctx, px::optim::Sgd{}, emb);
}
