#include "trainer/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace trainer {

TokenFile::TokenFile(const std::string& path, int token_bytes)
    : path_(path), token_bytes_(token_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error(path + ": cannot open token file: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw std::runtime_error(path + ": cannot stat: " + std::strerror(errno));
  }
  bytes_ = size_t(st.st_size);
  if (bytes_ % size_t(token_bytes) != 0) {
    ::close(fd);
    throw std::runtime_error(path + ": size " + std::to_string(bytes_) +
                             " bytes is not a multiple of " + std::to_string(token_bytes) +
                             " (data.dtype) - truncated file or wrong dtype?");
  }
  count_ = int64_t(bytes_ / size_t(token_bytes));
  if (bytes_ > 0) {
    void* p = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw std::runtime_error(path + ": mmap failed: " + std::strerror(errno));
    }
    base_ = static_cast<const unsigned char*>(p);
  }
  ::close(fd);
}

TokenFile::~TokenFile() {
  if (base_) ::munmap(const_cast<unsigned char*>(base_), bytes_);
}

}  // namespace trainer
