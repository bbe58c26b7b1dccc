// A Megatron-LM index (PREFIX.idx): open_token_source with format auto on the
// prefix, which finds PREFIX.idx and maps PREFIX.bin. The input is the
// index; the .bin is a fixed 4 KiB file, so the index's sizes and pointers
// are judged against a real one. Then what the data pipeline does with an
// opened source: the start-up token scan (min_max), sampling windows
// (read, at), error positions (byte_offset).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "data/token_file.h"
#include "fuzz_files.h"
#include "fuzz_token_source.h"

namespace {

const std::string& work_dir() { return fuzz::work_dir("megatron_idx"); }
using fuzz::write_file;

// tests/fuzz/corpus/megatron_idx/ points into these bytes: token k of a
// uint16 .bin is k, of an int32 one k too (byte i = the low or high byte).
std::string write_bin() {
  const std::string prefix = work_dir() + "/data";
  std::vector<uint16_t> tokens(2048);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint16_t(i);
  write_file(prefix + ".bin", tokens.data(), tokens.size() * 2);
  return prefix;
}

using fuzz::use_token_source;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string prefix = write_bin();
  write_file(prefix + ".idx", data, size);
  try {
    use_token_source(*trainer::open_token_source(prefix, "auto", "uint16"));
  } catch (const std::exception&) {
    // runtime_error naming the .idx and the byte offset
  }
  return 0;
}
