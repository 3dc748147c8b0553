// Must not compile: DynamicPS (a dynamic table under a synchronous
// architecture) does not pool bags (look the keys up and pool them with
// pool_bags()).
#include <parallax/parallax.hpp>
#include <vector>
namespace px = parallax;
int main() {
  px::Context ctx(MPI_COMM_SELF);
  px::dynamic::Options o;
  o.capacity = 16;
  px::DynamicVariable<float> emb(ctx, "emb", o);
  px::Trainer<px::arch::Hybrid, px::optim::Sgd> trainer(ctx, px::optim::Sgd{}, emb);
  const std::vector<px::index_t> offsets{0, 1}, ids{2};
  trainer.lookup({px::Bags<decltype(emb)>(emb, offsets, ids, px::Combiner::sum)});
}
