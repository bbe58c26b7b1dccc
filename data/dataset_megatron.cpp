// Megatron-LM indexed datasets (megatron/core/datasets/indexed_dataset.py):
//   PREFIX.idx: "MMIDIDX\0\0", u64 version (1), u8 dtype code, u64 sequence
//               count S, u64 document count D, i32 sizes[S], i64 pointers[S]
//               (byte offsets into .bin), i64 doc_idx[D]
//   PREFIX.bin: the sequences' tokens, where the pointers say.
// The sequences are read as one stream, in index order. Document d spans
// sequences [doc_idx[d], doc_idx[d + 1]); where it starts in the stream is
// what data.documents: separate keeps apart (document_starts).
#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "data/dataset_formats.h"
#include "data/loss_mask.h"

namespace trainer {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

struct DType {
  const char* name;
  int bytes;
  bool is_integer;
};

// Megatron's DType enum; 0 is unused.
const DType* dtype_of(uint8_t code) {
  static const DType table[] = {{"", 0, false},        {"uint8", 1, true},   {"int8", 1, true},
                                {"int16", 2, true},    {"int32", 4, true},   {"int64", 8, true},
                                {"float64", 8, false}, {"float32", 4, false}, {"uint16", 2, true}};
  return code >= 1 && code <= 8 ? &table[code] : nullptr;
}

std::string prefix_of(const std::string& path) {
  auto has_ext = [&](const char* ext) { return path.size() > 4 && path.compare(path.size() - 4, 4, ext) == 0; };
  if (has_ext(".idx")) return path.substr(0, path.size() - 4);
  // A prefix may itself end in .bin (its index is then PREFIX.bin.idx);
  // otherwise PREFIX.bin names the data half of the pair.
  if (has_ext(".bin") && megatron_prefix(path) != path) return path.substr(0, path.size() - 4);
  return path;
}

class MegatronTokens final : public TokenSource {
 public:
  explicit MegatronTokens(const std::string& path)
      : TokenSource(path), idx_(prefix_of(path) + ".idx"), bin_(prefix_of(path) + ".bin") {
    const std::string& ip = idx_.path();
    const unsigned char* p = idx_.data();
    const uint64_t n = idx_.size();
    if (n < kHeaderBytes)
      throw std::runtime_error(ip + ": truncated Megatron index: the file ends at byte offset " + std::to_string(n) +
                               ", inside the " + std::to_string(kHeaderBytes) + "-byte header");
    if (std::memcmp(p, kMagic, sizeof kMagic) != 0)
      throw std::runtime_error(ip + ": bad magic at byte offset 0 (a Megatron index starts with \"MMIDIDX\\0\\0\")");
    const uint64_t version = load_le<uint64_t>(p + 9);
    if (version != 1)
      throw std::runtime_error(ip + ": bad version " + std::to_string(version) +
                               " at byte offset 9 (only version 1 is supported)");
    const uint8_t code = p[17];
    const DType* dt = dtype_of(code);
    if (!dt)
      throw std::runtime_error(ip + ": unknown dtype code " + std::to_string(code) + " at byte offset 17 (1..8)");
    if (!dt->is_integer)
      throw std::runtime_error(ip + ": dtype code " + std::to_string(code) + " (" + dt->name +
                               ") at byte offset 17: token ids must be integers");
    code_ = code;
    elem_ = dt->bytes;
    const uint64_t seqs = load_le<uint64_t>(p + 18);
    const uint64_t docs = load_le<uint64_t>(p + 26);
    // Counts beyond this cannot describe a file that fits on a disk; the
    // bound keeps the expected-size arithmetic below from overflowing.
    constexpr uint64_t kMaxCount = uint64_t(1) << 56;
    if (seqs > kMaxCount || docs > kMaxCount)
      throw std::runtime_error(ip + ": implausible sequence/document counts " + std::to_string(seqs) + "/" +
                               std::to_string(docs) + " at byte offset 18 (corrupt header)");
    sizes_off_ = kHeaderBytes;
    pointers_off_ = sizes_off_ + 4 * seqs;
    const uint64_t docs_off = pointers_off_ + 8 * seqs;
    const uint64_t want = docs_off + 8 * docs;
    if (n < want)
      throw std::runtime_error(ip + ": truncated Megatron index: " + std::to_string(seqs) + " sequences and " +
                               std::to_string(docs) + " documents need " + std::to_string(want) +
                               " bytes but the file ends at byte offset " + std::to_string(n));
    if (n > want)
      throw std::runtime_error(ip + ": " + std::to_string(n - want) +
                               " trailing bytes after the index arrays, from byte offset " + std::to_string(want));

    const std::string& bp = bin_.path();
    cum_.resize(seqs + 1);
    cum_[0] = 0;
    for (uint64_t s = 0; s < seqs; ++s) {
      const int32_t len = load_le<int32_t>(p + sizes_off_ + 4 * s);
      if (len < 0)
        throw std::runtime_error(ip + ": sequence " + std::to_string(s) + " has negative size " + std::to_string(len) +
                                 " (byte offset " + std::to_string(sizes_off_ + 4 * s) + ")");
      const int64_t ptr = load_le<int64_t>(p + pointers_off_ + 8 * s);
      const uint64_t end = uint64_t(ptr) + uint64_t(len) * uint64_t(elem_);
      if (ptr < 0 || end > bin_.size())
        throw std::runtime_error(ip + ": sequence " + std::to_string(s) + " (pointer at byte offset " +
                                 std::to_string(pointers_off_ + 8 * s) + ") spans bytes [" + std::to_string(ptr) +
                                 ", " + std::to_string(end) + ") of " + bp + ", which ends at byte offset " +
                                 std::to_string(bin_.size()) + " (truncated .bin or corrupt index)");
      cum_[s + 1] = cum_[s] + len;
    }
    int64_t prev = 0;
    for (uint64_t d = 0; d < docs; ++d) {
      const int64_t v = load_le<int64_t>(p + docs_off + 8 * d);
      if (v < prev || uint64_t(v) > seqs)
        throw std::runtime_error(ip + ": document index " + std::to_string(d) + " = " + std::to_string(v) +
                                 " at byte offset " + std::to_string(docs_off + 8 * d) +
                                 " is not a non-decreasing sequence number <= " + std::to_string(seqs));
      prev = v;
    }
    // doc_idx[0] is the stream's start and the last entry its end (Megatron
    // writes 0, ..., S); the ones between are where documents begin.
    for (uint64_t d = 1; d + 1 < docs; ++d) doc_starts_.push_back(cum_[load_le<int64_t>(p + docs_off + 8 * d)]);
    has_documents_ = docs > 0;
    mask_ = open_loss_mask(prefix_of(path), cum_.back());
  }

  int64_t size() const override { return cum_.back(); }

  int64_t at(int64_t i) const override {
    const uint64_t s = sequence_of(i);
    return load(pointer(s) + uint64_t(i - cum_[s]) * uint64_t(elem_));
  }

  void read(int64_t start, int64_t n, int64_t* out) const override {
    uint64_t s = sequence_of(start);
    int64_t off = start - cum_[s];
    while (n > 0) {
      const int64_t take = std::min(n, cum_[s + 1] - cum_[s] - off);
      uint64_t b = pointer(s) + uint64_t(off) * uint64_t(elem_);
      for (int64_t k = 0; k < take; ++k, b += uint64_t(elem_)) *out++ = load(b);
      n -= take;
      off = 0;
      ++s;
    }
  }

  // Sequence by sequence, each a contiguous run of the .bin: only the bytes
  // the index points at are tokens.
  TokenRange min_max(int64_t start, int64_t n) const override {
    TokenRange r;
    uint64_t s = sequence_of(start);
    int64_t off = start - cum_[s];
    while (n > 0) {
      const int64_t take = std::min(n, cum_[s + 1] - cum_[s] - off);
      const unsigned char* q = bin_.data() + pointer(s) + uint64_t(off) * uint64_t(elem_);
      switch (code_) {
        case 1: r.add(min_max_le<uint8_t>(q, take)); break;
        case 2: r.add(min_max_le<int8_t>(q, take)); break;
        case 3: r.add(min_max_le<int16_t>(q, take)); break;
        case 4: r.add(min_max_le<int32_t>(q, take)); break;
        case 5: r.add(min_max_le<int64_t>(q, take)); break;
        default: r.add(min_max_le<uint16_t>(q, take)); break;  // 8
      }
      n -= take;
      off = 0;
      ++s;
    }
    return r;
  }
  std::vector<FileStamp> stamps() const override { return {stamp_of(bin_), stamp_of(idx_)}; }

  bool loss_mask(int64_t start, int64_t n, uint8_t* out) const override {
    if (!mask_) return false;
    mask_->read(start, n, out);
    return true;
  }
  double target_share() const override { return mask_ ? double(mask_->ones()) / double(std::max<int64_t>(1, cum_.back())) : 1.0; }

  bool document_starts(int64_t start, int64_t n, std::vector<int64_t>& out) const override {
    auto it = std::upper_bound(doc_starts_.begin(), doc_starts_.end(), start);
    for (; it != doc_starts_.end() && *it < start + n; ++it) out.push_back(*it);
    return has_documents_;
  }

  const std::string& data_path() const override { return bin_.path(); }
  uint64_t byte_offset(int64_t i) const override {
    const uint64_t s = sequence_of(i);
    return pointer(s) + uint64_t(i - cum_[s]) * uint64_t(elem_);
  }
  std::string format() const override { return std::string("megatron ") + dtype_of(code_)->name; }

 private:
  // The sequence holding stream position i. upper_bound skips empty
  // sequences, which share their start with the next one.
  uint64_t sequence_of(int64_t i) const {
    return uint64_t(std::upper_bound(cum_.begin(), cum_.end(), i) - cum_.begin() - 1);
  }
  uint64_t pointer(uint64_t s) const { return uint64_t(load_le<int64_t>(idx_.data() + pointers_off_ + 8 * s)); }

  int64_t load(uint64_t byte) const {
    const unsigned char* q = bin_.data() + byte;
    switch (code_) {
      case 1: return q[0];
      case 2: return int8_t(q[0]);
      case 3: return load_le<int16_t>(q);
      case 4: return load_le<int32_t>(q);
      case 5: return load_le<int64_t>(q);
      default: return load_le<uint16_t>(q);  // 8
    }
  }

  MappedFile idx_, bin_;
  uint8_t code_ = 8;
  int elem_ = 2;
  uint64_t sizes_off_ = 0, pointers_off_ = 0;
  std::vector<int64_t> cum_;  // cum_[s]: stream position of sequence s's first token
  std::vector<int64_t> doc_starts_;  // stream positions where documents 1.. begin
  bool has_documents_ = false;
  std::unique_ptr<LossMaskFile> mask_;  // PREFIX.lossmask, when there is one
};

}  // namespace

std::unique_ptr<TokenSource> open_megatron_tokens(const std::string& path) {
  return std::make_unique<MegatronTokens>(path);
}

}  // namespace trainer
