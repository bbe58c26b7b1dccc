// Token datasets seen as one flat stream of token ids, whatever the layout on
// disk: raw nanoGPT .bin, llm.c shards, Megatron indexed datasets. Every file
// is memory-mapped, so the OS pages it in on demand and corpora far larger
// than RAM cost nothing up front.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace trainer {

// A read-only mapping of a whole file. Empty files map to nothing (mmap of
// length 0 fails), so data() may be null when size() is 0.
class MappedFile {
 public:
  // Throws std::runtime_error naming the file when it cannot be opened.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return base_; }
  uint64_t size() const { return bytes_; }
  const std::string& path() const { return path_; }
  // What fstat said when the file was mapped: the start-up token scan's
  // cache (data/scan_cache.h) is valid only for exactly this file.
  int64_t mtime_ns() const { return mtime_ns_; }
  uint64_t inode() const { return inode_; }

 private:
  std::string path_;
  const unsigned char* base_ = nullptr;
  uint64_t bytes_ = 0;
  int64_t mtime_ns_ = 0;
  uint64_t inode_ = 0;
};

// The identity of one file a token source reads (size, mtime, inode at the
// time it was mapped): a scan result recorded for it holds while all three
// are unchanged.
struct FileStamp {
  std::string path;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t inode = 0;
  uint64_t sample = 0;  // data/content_sample.h: sampled blocks of the bytes
};
FileStamp stamp_of(const MappedFile& f);

// Smallest and largest token id of a range; an empty range has min > max.
struct TokenRange {
  int64_t min = INT64_MAX;
  int64_t max = INT64_MIN;
  void add(const TokenRange& o) {
    if (o.min < min) min = o.min;
    if (o.max > max) max = o.max;
  }
};

class TokenSource {
 public:
  virtual ~TokenSource() = default;

  // Tokens in the stream.
  virtual int64_t size() const = 0;
  // Token i as stored. Signed Megatron dtypes may hold negative values, so
  // this is int64_t: the sampler rejects anything outside [0, vocab_size).
  virtual int64_t at(int64_t i) const = 0;
  // Tokens [start, start + n) into out; bounds are the caller's job.
  virtual void read(int64_t start, int64_t n, int64_t* out) const;
  // Where token i lives, for error messages that point into the file.
  virtual const std::string& data_path() const { return path_; }
  virtual uint64_t byte_offset(int64_t i) const = 0;
  // "raw uint16", "llm.c uint16", "megatron int32": for logs and errors.
  virtual std::string format() const = 0;
  // Min and max of tokens [start, start + n), for the start-up scan
  // (data/token_scan.h). The default goes through read(); the formats
  // override it with a tight loop over the mapping. Thread-safe.
  virtual TokenRange min_max(int64_t start, int64_t n) const;
  // Appends the stream positions in (start, start + n) where a document
  // begins, ascending (a position twice where an empty document sits).
  // False: the layout records no documents (raw, llm.c). Thread-safe.
  virtual bool document_starts(int64_t start, int64_t n, std::vector<int64_t>& out) const {
    (void)start, (void)n, (void)out;
    return false;
  }
  // Loss-mask bytes of stream tokens [start, start + n) into out (1: the
  // token is a target; data/loss_mask.h). False: no mask beside this source.
  virtual bool loss_mask(int64_t start, int64_t n, uint8_t* out) const {
    (void)start, (void)n, (void)out;
    return false;
  }
  // Share of tokens the mask keeps as targets (1 without a mask), for the data line.
  virtual double target_share() const { return 1.0; }
  // Every file the tokens come from (Megatron: .bin and .idx); empty: the
  // source cannot say, and its scan is never cached.
  virtual std::vector<FileStamp> stamps() const { return {}; }

  // The path as the user gave it (a Megatron prefix stays a prefix).
  const std::string& path() const { return path_; }

 protected:
  explicit TokenSource(std::string path) : path_(std::move(path)) {}

 private:
  std::string path_;
};

// format: auto | raw | llmc | megatron. dtype (uint16 | uint32) is used only by
// raw files; the other layouts record their own token type.
//   auto: PATH.idx, or PATH/PATH.bin with a sibling PREFIX.idx -> megatron;
//         first int32 is an llm.c magic -> llmc; otherwise raw.
// Errors name the file, and the byte offset where one applies.
std::unique_ptr<TokenSource> open_token_source(const std::string& path, const std::string& format,
                                               const std::string& dtype);

// The format `auto` resolves to for path ("raw", "llmc" or "megatron"),
// without opening more than the first 4 bytes.
std::string detect_token_format(const std::string& path);

// The Megatron prefix a path names (strips .bin/.idx), or "" when there is
// no PREFIX.idx next to it. Globs over a Megatron directory match both
// halves of each dataset; the prefix lets them be counted once.
std::string megatron_prefix(const std::string& path);

}  // namespace trainer
