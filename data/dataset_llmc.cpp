// llm.c shards (dev/data/data_common.py): a 1024-byte header of 256 int32,
// [0] magic, [1] version, [2] token count, then the tokens. The count makes
// truncation detectable, so the size must match it exactly.
#include <stdexcept>

#include "data/dataset_formats.h"

namespace trainer {

namespace {

class LlmcTokens final : public TokenSource {
 public:
  explicit LlmcTokens(const std::string& path) : TokenSource(path), file_(path) {
    const uint64_t n = file_.size();
    if (n < kLlmcHeaderBytes)
      throw std::runtime_error(path + ": truncated llm.c shard: the file ends at byte offset " + std::to_string(n) +
                               ", inside the " + std::to_string(kLlmcHeaderBytes) + "-byte header");
    const int32_t magic = load_le<int32_t>(file_.data());
    const int32_t version = load_le<int32_t>(file_.data() + 4);
    const int32_t count = load_le<int32_t>(file_.data() + 8);
    int expected_version = 0;
    if (magic == kLlmcMagic) {
      expected_version = 1;
      bytes_ = 2;
    } else if (magic == kLlmcMagicLlama3) {
      expected_version = 7;
      bytes_ = 4;
    } else {
      throw std::runtime_error(path + ": bad magic " + std::to_string(magic) + " at byte offset 0 (an llm.c shard starts with " +
                               std::to_string(kLlmcMagic) + "); wrong data.format?");
    }
    if (version != expected_version)
      throw std::runtime_error(path + ": bad version " + std::to_string(version) + " at byte offset 4 (llm.c magic " +
                               std::to_string(magic) + " expects version " + std::to_string(expected_version) + ")");
    if (count < 0)
      throw std::runtime_error(path + ": negative token count " + std::to_string(count) + " at byte offset 8");
    const uint64_t want = kLlmcHeaderBytes + uint64_t(count) * uint64_t(bytes_);
    if (n < want)
      throw std::runtime_error(path + ": truncated llm.c shard: the header promises " + std::to_string(count) +
                               " tokens (" + std::to_string(want) + " bytes) but the file ends at byte offset " +
                               std::to_string(n));
    if (n > want)
      throw std::runtime_error(path + ": " + std::to_string(n - want) + " trailing bytes after the " +
                               std::to_string(count) + " tokens the header promises, from byte offset " +
                               std::to_string(want));
    count_ = count;
    tokens_ = file_.data() + kLlmcHeaderBytes;
  }

  int64_t size() const override { return count_; }
  int64_t at(int64_t i) const override {
    return bytes_ == 2 ? int64_t(reinterpret_cast<const uint16_t*>(tokens_)[i])
                       : int64_t(reinterpret_cast<const uint32_t*>(tokens_)[i]);
  }
  void read(int64_t start, int64_t n, int64_t* out) const override {
    if (bytes_ == 2) {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(tokens_) + start;
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
    } else {
      const uint32_t* p = reinterpret_cast<const uint32_t*>(tokens_) + start;
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
    }
  }
  TokenRange min_max(int64_t start, int64_t n) const override {
    const unsigned char* p = tokens_ + uint64_t(start) * uint64_t(bytes_);
    return bytes_ == 2 ? min_max_le<uint16_t>(p, n) : min_max_le<uint32_t>(p, n);
  }
  std::vector<FileStamp> stamps() const override { return {stamp_of(file_)}; }
  uint64_t byte_offset(int64_t i) const override { return kLlmcHeaderBytes + uint64_t(i) * uint64_t(bytes_); }
  std::string format() const override { return bytes_ == 2 ? "llm.c uint16" : "llm.c uint32"; }

 private:
  MappedFile file_;
  const unsigned char* tokens_ = nullptr;
  int bytes_ = 2;
  int64_t count_ = 0;
};

}  // namespace

std::unique_ptr<TokenSource> open_llmc_tokens(const std::string& path) {
  return std::make_unique<LlmcTokens>(path);
}

}  // namespace trainer
