// A token file that is not a Megatron pair: open_token_source with format
// auto (an llm.c magic in the first int32 -> llm.c shard, else a raw nanoGPT
// .bin), then llm.c and raw explicitly (data.format: llmc / raw, with
// data.dtype uint16 and uint32). The readers map a path, so the input is
// written to a file first. Then what the data pipeline does with an opened
// source: the start-up token scan (min_max), sampling windows (read, at),
// error positions (byte_offset).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "data/token_file.h"
#include "fuzz_files.h"
#include "fuzz_token_source.h"

namespace {

const std::string& work_dir() { return fuzz::work_dir("token_file"); }
using fuzz::write_file;

using fuzz::use_token_source;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // No PATH.idx beside it, so auto never takes it for Megatron.
  static const std::string path = work_dir() + "/shard_000.bin";
  write_file(path, data, size);
  for (const auto& [format, dtype] : {std::pair{"auto", "uint16"}, {"llmc", "uint16"}, {"raw", "uint16"},
                                      {"raw", "uint32"}}) {
    try {
      use_token_source(*trainer::open_token_source(path, format, dtype));
    } catch (const std::exception&) {
      // runtime_error naming the file and the byte offset
    }
  }
  return 0;
}
