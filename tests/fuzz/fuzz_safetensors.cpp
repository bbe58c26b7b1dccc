// A safetensors file: checkpoint rank files and Hugging Face shards
// (model.init_from) are read by read_safetensors, which only takes a path, so
// the input is written to a file first; a file it accepts then goes through
// read_hf_tensors too, which converts what the header promises to fp32.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>

#include "checkpoint/safetensors.h"
#include "interop/hf_files.h"

namespace {

// One directory per process, made on the first input and reused (parallel
// jobs must not share files; a directory per input would cost more than the
// parse), removed at a normal exit.
char g_dir[] = "/tmp/fuzz_safetensors.XXXXXX";
const std::string& work_dir() {
  static const std::string dir = [] {
    if (!mkdtemp(g_dir)) std::abort();
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(g_dir, ec);
    });
    return std::string(g_dir);
  }();
  return dir;
}

void write_file(const std::string& path, const uint8_t* data, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n <= 0) std::abort();
    data += n;
    size -= size_t(n);
  }
  ::close(fd);
}

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
