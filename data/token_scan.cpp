#include "data/token_scan.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "data/scan_cache.h"

namespace trainer {

namespace {

std::atomic<int64_t> g_scans{0};

// 1M tokens (2-4 MB): big enough that a chunk costs far more than taking
// it, small enough that the threads finish together and that the search
// for the first bad token re-reads little.
constexpr int64_t kChunkTokens = int64_t(1) << 20;

// The cores this process may run on (Slurm and taskset narrow the affinity
// mask; hardware_concurrency would count the whole machine), at most 16.
int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int n = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : int(std::thread::hardware_concurrency());
  return std::clamp(n, 1, 16);
}

int thread_count(int requested, int64_t chunks) {
  const int t = requested > 0 ? requested : usable_cores();
  return int(std::max<int64_t>(1, std::min<int64_t>(t, chunks)));
}

// Min/max of every chunk of kChunkTokens, threads taking chunks in turn.
std::vector<TokenRange> chunk_ranges(const TokenSource& src, int threads) {
  ++g_scans;
  const int64_t n = src.size();
  const int64_t chunks = (n + kChunkTokens - 1) / kChunkTokens;
  std::vector<TokenRange> out(static_cast<size_t>(chunks));
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t c = next++; c < chunks; c = next++) {
      const int64_t start = c * kChunkTokens;
      out[size_t(c)] = src.min_max(start, std::min(kChunkTokens, n - start));
    }
  };
  const int t = thread_count(threads, chunks);
  std::vector<std::thread> pool;
  for (int i = 1; i < t; ++i) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  return out;
}

bool in_range(const TokenRange& r, int64_t vocab) { return r.min > r.max || (r.min >= 0 && r.max < vocab); }

// The first bad token of the first chunk whose range is out of bounds.
std::optional<BadToken> find_bad(const TokenSource& src, const std::vector<TokenRange>& chunks, int64_t vocab) {
  for (size_t c = 0; c < chunks.size(); ++c) {
    if (in_range(chunks[c], vocab)) continue;
    const int64_t start = int64_t(c) * kChunkTokens, end = std::min(src.size(), start + kChunkTokens);
    constexpr int64_t kBlock = 4096;
    int64_t buf[kBlock];
    for (int64_t b = start; b < end; b += kBlock) {
      const int64_t k = std::min(kBlock, end - b);
      src.read(b, k, buf);
      for (int64_t i = 0; i < k; ++i)
        if (buf[i] < 0 || buf[i] >= vocab) return BadToken{b + i, buf[i]};
    }
  }
  return std::nullopt;
}

TokenRange combine(const std::vector<TokenRange>& chunks) {
  TokenRange r;
  for (const TokenRange& c : chunks) r.add(c);
  return r;
}

}  // namespace

TokenRange scan_token_range(const TokenSource& src, int threads) { return combine(chunk_ranges(src, threads)); }

std::optional<BadToken> first_bad_token(const TokenSource& src, int64_t vocab, int threads) {
  return find_bad(src, chunk_ranges(src, threads), vocab);
}

std::string bad_token_message(const TokenSource& src, int64_t index, int64_t value, int64_t vocab) {
  return src.data_path() + ": token " + std::to_string(value) + " at token index " + std::to_string(index) +
         " (byte offset " + std::to_string(src.byte_offset(index)) + ") " +
         (value < 0 ? "is negative" : "is >= model.vocab_size " + std::to_string(vocab)) + " (" + src.format() + ")";
}

TokenScan check_token_ids(const TokenSource& src, int64_t vocab, const std::string& key, const ScanOptions& opt) {
  TokenScan res;
  res.tokens = src.size();
  if (!opt.enabled) return res;
  auto fail = [&](const std::vector<TokenRange>& chunks) {
    const auto bad = find_bad(src, chunks, vocab);
    if (!bad) throw std::logic_error(src.data_path() + ": token scan found a bad range but no bad token");
    throw std::runtime_error(key + ": " + bad_token_message(src, bad->index, bad->value, vocab) +
                             ", found by the start-up scan of all " + std::to_string(src.size()) + " tokens");
  };
  if (opt.use_cache) {
    std::string from;
    if (auto rec = load_scan_record(src, &from)) {
      res.range = rec->range;
      res.from_cache = true;
      res.cache = from;
      // A remembered bad file: scan it again, only to say where.
      if (!in_range(res.range, vocab)) fail(chunk_ranges(src, opt.threads));
      return res;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<TokenRange> chunks = chunk_ranges(src, opt.threads);
  res.range = combine(chunks);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Remembered whatever the verdict: the ids do not depend on vocab_size,
  // so another model size (or a fixed config) can reuse it.
  if (opt.use_cache) res.cache = save_scan_record(src, ScanRecord{src.format(), src.size(), res.range, src.stamps()});
  if (!in_range(res.range, vocab)) fail(chunks);
  return res;
}

int64_t token_scans_run() { return g_scans.load(); }

}  // namespace trainer
