// What the targets whose reader takes a path share: a scratch directory of
// this process (made on the first input and reused: parallel jobs must not
// share files, and a directory per input would cost more than the parse;
// removed at a normal exit), and writing an input there.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace fuzz {

// /tmp/fuzz_NAME.XXXXXX, the same directory on every call.
inline const std::string& work_dir(const char* name) {
  static std::string made;
  if (made.empty()) {
    std::string pattern = std::string("/tmp/fuzz_") + name + ".XXXXXX";
    if (!mkdtemp(pattern.data())) std::abort();
    made = pattern;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(made, ec);
    });
  }
  return made;
}

inline void write_file(const std::string& path, const void* p, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  const char* data = static_cast<const char*>(p);
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n <= 0) std::abort();
    data += n;
    size -= size_t(n);
  }
  ::close(fd);
}

}  // namespace fuzz
