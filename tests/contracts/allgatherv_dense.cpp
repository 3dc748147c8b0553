// Must not compile: a dense variable has no rows for AllGatherv to gather.
#include <parallax/parallax.hpp>
namespace px = parallax;
int main() {
  px::Context ctx(MPI_COMM_SELF);
  px::Variable<px::Dense, float, px::HostSpace, px::AllGatherv> w(ctx, "w", {2});
  px::Trainer<px::arch::Hybrid, px::optim::Sgd> trainer(ctx, px::optim::Sgd{}, w);
}
