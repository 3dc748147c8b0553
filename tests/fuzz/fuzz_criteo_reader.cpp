// Fuzz target: the Criteo TSV reader of the examples (common/readers.hpp).
// Any bytes must either read or throw examples::ReadError; what reads must
// hold: labels are 0/1, a missing field reads as 0, and every record read
// from a file is the record its line parses to on its own.
#include "common/readers.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::istringstream in(text);
  std::vector<examples::CriteoRecord> records;
  try {
    records = examples::read_criteo(in);
  } catch (const examples::ReadError&) {
    return 0;  // refused, naming the line and field: fine
  }
  std::istringstream again(text);
  std::string line;
  std::size_t n = 0, next = 0;
  while (std::getline(again, line)) {
    ++n;
    if (line.empty() || line == "\r") continue;
    const examples::CriteoRecord r = examples::parse_criteo_line(line, n);
    if (next >= records.size()) std::abort();
    const examples::CriteoRecord& f = records[next++];
    if (f.label != r.label || f.label < 0 || f.label > 1 || f.dense != r.dense || f.categorical != r.categorical)
      std::abort();
    for (std::size_t j = 0; j < f.dense.size(); ++j)
      if (f.dense_missing[j] && f.dense[j] != 0) std::abort();
    for (std::size_t j = 0; j < f.categorical.size(); ++j)
      if (f.categorical_missing[j] && f.categorical[j] != 0) std::abort();
  }
  if (next != records.size()) std::abort();
  return 0;
}
