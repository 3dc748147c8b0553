// Must not compile: lookup() of a dense variable.
#include <parallax/parallax.hpp>
namespace px = parallax;
int main() {
  px::Context ctx(MPI_COMM_SELF);
  px::Variable<px::Dense, float> w(ctx, "w", {2});
  px::Trainer<px::arch::Hybrid, px::optim::Sgd> trainer(ctx, px::optim::Sgd{}, w);
  trainer.lookup(w, std::vector<px::index_t>{0});
}
