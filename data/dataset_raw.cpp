// nanoGPT-style .bin: nothing but little-endian tokens, so the only thing to
// check is that the size is a whole number of them.
#include <stdexcept>

#include "data/dataset_formats.h"

namespace trainer {

namespace {

class RawTokens final : public TokenSource {
 public:
  RawTokens(const std::string& path, int token_bytes)
      : TokenSource(path), file_(path), bytes_(token_bytes) {
    const uint64_t n = file_.size();
    if (n % uint64_t(bytes_) != 0)
      throw std::runtime_error(
          path + ": size " + std::to_string(n) + " bytes is not a multiple of " + std::to_string(bytes_) +
          " (data.dtype=" + (bytes_ == 2 ? "uint16" : "uint32") + "): a partial token starts at byte offset " +
          std::to_string(n - n % uint64_t(bytes_)) + " - truncated file or wrong dtype?");
    count_ = int64_t(n / uint64_t(bytes_));
  }

  int64_t size() const override { return count_; }
  int64_t at(int64_t i) const override {
    return bytes_ == 2 ? int64_t(reinterpret_cast<const uint16_t*>(file_.data())[i])
                       : int64_t(reinterpret_cast<const uint32_t*>(file_.data())[i]);
  }
  void read(int64_t start, int64_t n, int64_t* out) const override {
    if (bytes_ == 2) {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(file_.data()) + start;
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
    } else {
      const uint32_t* p = reinterpret_cast<const uint32_t*>(file_.data()) + start;
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
    }
  }
  TokenRange min_max(int64_t start, int64_t n) const override {
    const unsigned char* p = file_.data() + uint64_t(start) * uint64_t(bytes_);
    return bytes_ == 2 ? min_max_le<uint16_t>(p, n) : min_max_le<uint32_t>(p, n);
  }
  std::vector<FileStamp> stamps() const override { return {stamp_of(file_)}; }
  uint64_t byte_offset(int64_t i) const override { return uint64_t(i) * uint64_t(bytes_); }
  std::string format() const override { return bytes_ == 2 ? "raw uint16" : "raw uint32"; }

 private:
  MappedFile file_;
  int bytes_;
  int64_t count_ = 0;
};

}  // namespace

std::unique_ptr<TokenSource> open_raw_tokens(const std::string& path, int token_bytes) {
  return std::make_unique<RawTokens>(path, token_bytes);
}

}  // namespace trainer
