// The start-up token scan: every token id of a data file is checked against
// model.vocab_size when the file is opened, so a bad id deep inside a corpus
// fails the run at once (exit 1, naming file, index, byte offset and value)
// instead of weeks later, or never, when its sequence happens to be drawn.
//
// One pass over the memory-mapped tokens, cut into chunks that several
// threads take in turn (min/max per chunk); the first chunk out of range is
// then searched for the exact first bad token. The result (token count, min
// and max id) is remembered in a small cache file next to the data
// (data/scan_cache.h), so the next run, or the next rank, does not read the
// corpus again unless it changed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "data/token_file.h"

namespace trainer {

struct ScanOptions {
  bool enabled = true;   // false: only the per-sequence check when a window is read
  bool use_cache = true; // read and write data/scan_cache.h records
  int threads = 0;       // 0: the cores this process may use (at most 16)
};

// What check_token_ids found (or the cache remembered) for one source.
struct TokenScan {
  int64_t tokens = 0;
  TokenRange range;     // smallest and largest id in the file
  bool from_cache = false;
  double seconds = 0;   // time of the scan (0 when from the cache)
  std::string cache;    // the cache file read or written; "" when none could be
};

struct BadToken {
  int64_t index = 0;  // in the source's token stream
  int64_t value = 0;
};

// Min and max over every token of `src`, in parallel.
TokenRange scan_token_range(const TokenSource& src, int threads = 0);

// The first token outside [0, vocab) in stream order, if any.
std::optional<BadToken> first_bad_token(const TokenSource& src, int64_t vocab, int threads = 0);

// "<file>: token 300 at token index 5 (byte offset 40) is >= model.vocab_size
// 256 (megatron int64)": the one wording of a bad id, for the scan and for
// BatchSampler::sequence.
std::string bad_token_message(const TokenSource& src, int64_t index, int64_t value, int64_t vocab);

// Checks every id of `src` against [0, vocab) (cache first, then a scan,
// whose result is cached). Throws std::runtime_error "KEY: <bad_token_message>"
// for the first bad id. key names the entry ("data.train[1]").
TokenScan check_token_ids(const TokenSource& src, int64_t vocab, const std::string& key,
                          const ScanOptions& opt = {});

// Full scans run by this process so far: lets tests see that a cached
// result was used.
int64_t token_scans_run();

}  // namespace trainer
