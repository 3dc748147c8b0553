// Must not compile: an engine without most of the contract.
#include <parallax/parallax.hpp>
namespace px = parallax;
struct HalfEngine {
  using space = px::HostSpace;
  HalfEngine(const px::Context&, px::engine::Options) {}
  int rank() const { return 0; }
  int size() const { return 1; }
};
int main() {
  px::Context ctx(MPI_COMM_SELF);
  px::Variable<px::Dense, float> w(ctx, "w", {2});
  px::Trainer<px::arch::Hybrid, px::optim::Sgd, HalfEngine> trainer(ctx, px::optim::Sgd{}, w);
}
