// Which tokens a training sequence holds is a pure function of
// (seed, split, step, global sequence index): resuming needs only the step,
// and a different parallel layout sees the same global batch.
//
// A split is a blend of entries (data.train / data.valid), each
// "PATH_OR_GLOB" or "WEIGHT PATH_OR_GLOB". A sequence first draws its entry
// with probability weight / sum(weights), then a window uniformly among the
// entry's start positions; a glob's files thus share their entry's weight in
// proportion to their windows (token count - seq_len). Windows never cross
// files; inside a Megatron dataset they may cross document boundaries, as
// they do in a raw .bin. With separate documents (data.documents: separate)
// a window also says where each of its tokens' documents starts, and the
// target that would be predicted across a boundary is -1 (no loss). A loss
// mask beside a file (PREFIX.lossmask) makes the targets it masks out -1.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/token_file.h"
#include "data/token_scan.h"

namespace trainer {

class BatchSampler {
 public:
  struct Entry {
    std::string text;                   // the entry as configured
    double weight = 1;                  // as configured
    double share = 1;                   // weight / sum of the split's weights
    std::vector<std::unique_ptr<TokenSource>> files;
    std::vector<int64_t> windows;       // cumulative valid start positions per file
    int64_t tokens = 0;
    // The start-up scan of the entry's files (data/token_scan.h).
    TokenRange ids;                     // smallest and largest token id
    int scanned = 0, cached = 0;        // files scanned now / known from the scan cache
    double scan_seconds = 0;
  };

  // entries: data.train or data.valid. format: data.format (auto | raw | llmc
  // | megatron); dtype: data.dtype, used by raw files. split_name ("train",
  // "valid") names the keys in messages and selects an independent stream.
  // Opens and validates every file, every token id included (the start-up
  // scan, data/token_scan.h, unless scan.enabled is false); throws
  // std::runtime_error naming the entry/file on any problem, and when
  // separate_documents is set and a file records no documents.
  BatchSampler(const std::vector<std::string>& entries, const std::string& dtype, int64_t seq_len,
               int64_t vocab_size, uint64_t seed, const std::string& split_name,
               const std::string& format = "auto", const ScanOptions& scan = {},
               bool separate_documents = false);

  // Writes inputs/targets [seq_len] of global sequence `index` at `step`,
  // and with separate documents doc_start [seq_len]: the position in the
  // window where token t's document starts (0 when it started before the
  // window); targets[t] = -1 where a document starts at t + 1.
  // Const and free of shared mutable state: safe to call from several
  // threads at once. Throws (naming file, token index and byte offset) when
  // a token is outside [0, model.vocab_size).
  void sequence(int64_t step, int64_t index, int32_t* inputs, int32_t* targets, int32_t* doc_start = nullptr) const;
  bool separate_documents() const { return documents_; }
  // Whether some targets may be -1: separate documents, or a loss mask beside
  // a file (data/loss_mask.h: a target is -1 where its token is masked out).
  bool masks_targets() const { return masks_; }

  // Where sequence (step, index) starts: its file and the token offset of its
  // first input there (what sequence() reads from, for a record a user can
  // open the data at).
  std::pair<std::string, int64_t> where(int64_t step, int64_t index) const;
  // Which entry sequence (step, index) draws from; sequence() uses the same.
  size_t entry_of(int64_t step, int64_t index) const;

  int64_t seq_len() const { return seq_len_; }
  int64_t total_tokens() const { return total_; }
  const std::vector<Entry>& entries() const { return entries_; }
  // One line per entry: share, token count, file count, format, and the
  // id range with how the scan got it (its time, or the scan cache).
  std::string describe() const;

 private:
  uint64_t hash(int64_t step, int64_t index) const;
  std::pair<const TokenSource*, int64_t> locate(int64_t step, int64_t index) const;
  void mark_documents(const TokenSource& f, int64_t start, int32_t* targets, int32_t* doc_start) const;

  std::string split_;
  std::vector<Entry> entries_;
  std::vector<double> cumulative_share_;
  int64_t seq_len_, vocab_;
  uint64_t seed_;
  bool documents_ = false;
  bool masks_ = false;
  int64_t total_ = 0;
};

}  // namespace trainer
