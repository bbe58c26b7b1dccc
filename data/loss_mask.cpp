#include "data/loss_mask.h"

#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace trainer {

namespace {
constexpr char kMagic[8] = {'T', 'R', 'L', 'M', 'A', 'S', 'K', '1'};
constexpr uint64_t kHeader = 16;
}  // namespace

LossMaskFile::LossMaskFile(const std::string& path, int64_t tokens) : file_(path) {
  const unsigned char* p = file_.data();
  if (file_.size() < kHeader || std::memcmp(p, kMagic, sizeof kMagic) != 0)
    throw std::runtime_error(path + ": not a loss mask (a .lossmask file starts with \"TRLMASK1\" and a token count)");
  uint64_t count;
  std::memcpy(&count, p + 8, 8);
  if (count != uint64_t(tokens))
    throw std::runtime_error(path + ": a loss mask of " + std::to_string(count) + " tokens beside a dataset of " +
                             std::to_string(tokens) + " (written for another dataset?)");
  if (file_.size() != kHeader + count)
    throw std::runtime_error(path + ": " + std::to_string(file_.size()) + " bytes, expected " +
                             std::to_string(kHeader + count) + " for " + std::to_string(count) + " tokens");
  for (uint64_t i = 0; i < count; ++i) {
    const unsigned char b = p[kHeader + i];
    if (b > 1)
      throw std::runtime_error(path + ": byte " + std::to_string(b) + " at offset " + std::to_string(kHeader + i) +
                               " (token " + std::to_string(i) + "): a loss mask holds 0 or 1");
    ones_ += b;
  }
}

void LossMaskFile::read(int64_t start, int64_t n, uint8_t* out) const {
  std::memcpy(out, file_.data() + kHeader + uint64_t(start), size_t(n));
}

std::unique_ptr<LossMaskFile> open_loss_mask(const std::string& prefix, int64_t tokens) {
  const std::string path = prefix + ".lossmask";
  if (!std::filesystem::exists(path)) return nullptr;
  return std::make_unique<LossMaskFile>(path, tokens);
}

}  // namespace trainer
