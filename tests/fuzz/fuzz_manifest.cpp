// Fuzz target: the checkpoint manifest parser. Any input must either parse
// or throw parallax::error; what parses must survive a round trip.
#include <parallax/detail/checkpoint_io.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  parallax::detail::Manifest m;
  try {
    m = parallax::detail::Manifest::parse(text, "fuzz/manifest");
  } catch (const parallax::error&) {
    return 0;  // refused, with a message: fine
  }
  const std::string again = m.serialize();
  const parallax::detail::Manifest back = parallax::detail::Manifest::parse(again, "fuzz/manifest");
  if (back.serialize() != again) std::abort();  // a round trip must be stable
  return 0;
}
