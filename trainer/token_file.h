// A memory-mapped file of token ids (raw little-endian uint16 or uint32, the
// nanoGPT .bin layout). The OS pages it in on demand, so corpora far larger
// than RAM cost nothing up front.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace trainer {

class TokenFile {
 public:
  // Throws std::runtime_error naming the file on open/size problems.
  TokenFile(const std::string& path, int token_bytes);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t size() const { return count_; }
  uint32_t at(int64_t i) const {
    return token_bytes_ == 2 ? reinterpret_cast<const uint16_t*>(base_)[i]
                             : reinterpret_cast<const uint32_t*>(base_)[i];
  }
  const std::string& path() const { return path_; }
  int token_bytes() const { return token_bytes_; }

 private:
  std::string path_;
  int token_bytes_;
  const unsigned char* base_ = nullptr;
  size_t bytes_ = 0;
  int64_t count_ = 0;
};

}  // namespace trainer
