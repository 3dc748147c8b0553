// Must not compile: a dynamic variable in CUDA memory (no CUDA table is built).
#include <parallax/parallax.hpp>
namespace px = parallax;
int main() {
  px::Context ctx(MPI_COMM_SELF);
  px::dynamic::Options o;
  o.capacity = 16;
  px::DynamicVariable<float, px::CudaSpace> emb(ctx, "emb", o);
}
