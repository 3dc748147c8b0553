// Must not compile: AsyncPS does not store 16-bit tables.
#include <parallax/parallax.hpp>
namespace px = parallax;
int main() {
  px::Context ctx(MPI_COMM_SELF);
  px::Variable<px::Sparse, px::bf16> emb(ctx, "emb", {4, 2});
  px::Trainer<px::arch::Async, px::optim::Sgd> trainer(ctx, px::optim::Sgd{}, emb);
}
