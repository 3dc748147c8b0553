// Must not compile: only sparse variables (tables) store their rows in 16 bits.
#include <parallax/parallax.hpp>
namespace px = parallax;
int main() {
  px::Context ctx(MPI_COMM_SELF);
  px::Variable<px::Dense, px::bf16> w(ctx, "w", {2});
}
