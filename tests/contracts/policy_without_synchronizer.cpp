// Must not compile: a policy tag that names no synchronizer.
#include <parallax/parallax.hpp>
namespace px = parallax;
struct Nameless {
  static constexpr const char* name = "Nameless";
};
int main() {
  px::Context ctx(MPI_COMM_SELF);
  px::Variable<px::Dense, float, px::HostSpace, Nameless> w(ctx, "w", {2});
  px::Trainer<px::arch::Hybrid, px::optim::Sgd> trainer(ctx, px::optim::Sgd{}, w);
}
