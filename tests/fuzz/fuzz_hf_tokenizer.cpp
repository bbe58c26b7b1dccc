// A Hugging Face tokenizer.json next to the data or in a model directory:
// huggingface_vocab_size (the start-up check against model.vocab_size) and
// huggingface_tokenizer, whose decoder then turns ids back into text (the
// end-of-run sample, `trainer generate`). Both take a path, so the input is
// written to a file first.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "fuzz_files.h"

namespace {

const std::string& work_dir() { return fuzz::work_dir("hf_tokenizer"); }
using fuzz::write_file;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = work_dir() + "/tokenizer.json";
  write_file(path, data, size);
  int64_t vocab = 0;
  try {
    vocab = trainer::huggingface_vocab_size(path);
  } catch (const std::exception&) {
    // runtime_error naming the file
  }
  try {
    const auto tok = trainer::huggingface_tokenizer(path);
    if (tok->vocab_size() != vocab) std::abort();  // the two readers must agree
    // Every id of a small vocabulary and a few beyond it, one at a time and
    // as one sequence (pieces interact: byte fallback, prefixes, stripping).
    std::vector<int32_t> ids;
    for (int32_t id = -1; id <= int32_t(std::min<int64_t>(vocab, 300)); ++id) ids.push_back(id);
    for (int32_t id : ids) tok->decode({id});
    tok->decode(ids);
    tok->encode("1 2 3");
  } catch (const std::exception&) {
  }
  return 0;
}
