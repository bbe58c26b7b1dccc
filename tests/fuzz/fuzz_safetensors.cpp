// A safetensors file: checkpoint rank files and Hugging Face shards
// (model.init_from) are read by read_safetensors, which only takes a path, so
// the input is written to a file first; a file it accepts then goes through
// read_hf_tensors too, which converts what the header promises to fp32.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>

#include "checkpoint/safetensors.h"
#include "interop/hf_files.h"
#include "fuzz_files.h"

namespace {

const std::string& work_dir() { return fuzz::work_dir("safetensors"); }
using fuzz::write_file;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The name read_hf_tensors looks for in a model directory.
  static const std::string path = work_dir() + "/model.safetensors";
  write_file(path, data, size);
  try {
    for (const auto& t : trainer::read_safetensors(path)) {
      // The reader promises numel * dtype size bytes per tensor; the callers
      // copy exactly that many, so a broken promise is a finding.
      uint64_t n = trainer::dtype_size(t.dtype);
      for (int64_t d : t.shape) n *= uint64_t(d);
      if (n != t.data.size()) std::abort();
    }
  } catch (const std::exception&) {
    return 0;  // std::runtime_error naming the file: the expected answer to a bad file
  }
  try {
    trainer::read_hf_tensors(work_dir());
  } catch (const std::exception&) {
    // An integer dtype: refused by name.
  }
  return 0;
}
