// Must not compile: AsyncPS stores a 16-bit table, but does not pool bags
// (look the ids up and pool them with pool_bags()).
#include <parallax/parallax.hpp>
#include <vector>
namespace px = parallax;
int main() {
  px::Context ctx(MPI_COMM_SELF);
  px::Variable<px::Sparse, px::bf16> emb(ctx, "emb", {4, 2});
  px::Trainer<px::arch::Async, px::optim::Sgd> trainer(ctx, px::optim::Sgd{}, emb);
  const std::vector<px::index_t> offsets{0, 1}, ids{2};
  trainer.lookup({px::Bags<decltype(emb)>(emb, offsets, ids, px::Combiner::sum)});
}
