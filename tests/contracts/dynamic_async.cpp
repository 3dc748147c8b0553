// Must not compile: a dynamic variable under an asynchronous architecture.
#include <parallax/parallax.hpp>
namespace px = parallax;
int main() {
  px::Context ctx(MPI_COMM_SELF);
  px::dynamic::Options o;
  o.capacity = 16;
  px::DynamicVariable<float> emb(ctx, "emb", o);
  px::Trainer<px::arch::Async, px::optim::Sgd> trainer(ctx, px::optim::Sgd{}, emb);
}
