// Fuzz target: the text-corpus reader of the examples (common/readers.hpp).
// Any bytes must either read or throw examples::ReadError; what reads must
// be consistent: every token id is inside the vocabulary, the vocabulary is
// no larger than asked, and re-encoding the text gives the same ids.
#include "common/readers.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  // The first byte picks the vocabulary size (1..64), the rest is the text.
  const std::size_t vocab = 1 + data[0] % 64;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  std::istringstream in(text);
  examples::Corpus c;
  try {
    c = examples::read_corpus(in, vocab);
  } catch (const examples::ReadError&) {
    return 0;  // refused, with a message naming the line: fine
  }
  if (c.tokens.empty() || c.vocab.size() == 0 || c.vocab.size() > vocab) std::abort();
  for (const std::int32_t id : c.tokens)
    if (id < 0 || static_cast<std::size_t>(id) >= c.vocab.size()) std::abort();
  if (examples::encode(text, c.vocab) != c.tokens) std::abort();  // deterministic
  return 0;
}
