// Fuzz target: reading a rank's checkpoint data file. The input is the file
// rank-0.bin of a one-rank checkpoint whose manifest holds a replicated and a
// sharded variable with one optimizer slot; every row of both is read. Any
// input must either load or throw parallax::error.
#include <parallax/detail/checkpoint_io.hpp>

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace {

const std::string& scratch_dir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/parallax-fuzz-XXXXXX";
    return std::string(mkdtemp(tmpl));
  }();
  return dir;
}

parallax::detail::Manifest manifest() {
  parallax::detail::Manifest m;
  m.step = 7;
  m.ranks = 1;
  m.optimizer = "momentum";
  m.slots = 1;
  m.variables.push_back({"w", false, "f32", 3, 2, 0});
  m.variables.push_back({"emb", true, "f64", 5, 3, 2});
  m.files.push_back({"rank-0.bin", 0, 0});
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = scratch_dir() + "/rank-0.bin";
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    if (size) std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  try {
    parallax::detail::CheckpointReader reader(scratch_dir(), manifest());
    std::vector<float> w(3 * 2);
    std::vector<double> emb(5 * 3);
    for (int what = 0; what <= 1; ++what) {
      reader.read_rows(0, what, 0, 3, w.data());
      reader.read_rows(1, what, 0, 5, emb.data());
      reader.read_rows(1, what, 2, 2, emb.data());
    }
  } catch (const parallax::error&) {
  }
  return 0;
}
