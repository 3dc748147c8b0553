// Must not compile: an optimizer with more state than its rule receives.
#include <parallax/parallax.hpp>
namespace px = parallax;
struct ThreeSlots {
  static constexpr const char* name = "three";
  static constexpr int slots = 3;
  template <class T> T slot_initial(int) const { return T(0); }
  template <class T> struct Rule { void operator()(T&, T, T&, T&) const {} };
  template <class T> Rule<T> rule(std::uint64_t) const { return {}; }
};
int main() {
  px::Context ctx(MPI_COMM_SELF);
  px::Variable<px::Dense, float> w(ctx, "w", {2});
  px::Trainer<px::arch::Hybrid, ThreeSlots> trainer(ctx, ThreeSlots{}, w);
}
