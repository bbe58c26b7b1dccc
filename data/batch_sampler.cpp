#include "data/batch_sampler.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "data/dataset_blend.h"

namespace trainer {

namespace {

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t split_salt(const std::string& split) {
  // train/valid keep the salts of the single-file sampler so existing runs
  // draw the same windows; any other split name gets its own stream.
  if (split == "train") return 0;
  if (split == "valid") return 0x5eed;
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : split) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// "; ids 0..255, scanned in 0.012 s" (or "from the scan cache", or both
// counted): the scan's time shows what a big corpus costs at start-up.
std::string scan_note(const BatchSampler::Entry& e) {
  if (e.scanned + e.cached == 0) return "";
  char buf[160];
  std::snprintf(buf, sizeof buf, "; ids %lld..%lld", (long long)e.ids.min, (long long)e.ids.max);
  std::string out = buf;
  if (e.cached == 0) {
    std::snprintf(buf, sizeof buf, ", scanned in %.3f s", e.scan_seconds);
  } else if (e.scanned == 0) {
    std::snprintf(buf, sizeof buf, ", from the scan cache");
  } else {
    std::snprintf(buf, sizeof buf, ", %d file%s scanned in %.3f s, %d from the scan cache", e.scanned,
                  e.scanned == 1 ? "" : "s", e.scan_seconds, e.cached);
  }
  return out + buf;
}

// "; loss on 38.2% of tokens (loss mask)" when the entry's files carry one.
std::string mask_note(const BatchSampler::Entry& e) {
  double targets = 0, tokens = 0;
  bool any = false;
  for (const auto& f : e.files) {
    uint8_t one;
    any = any || f->loss_mask(0, 1, &one);
    targets += f->target_share() * double(f->size());
    tokens += double(f->size());
  }
  if (!any) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, "; loss on %.1f%% of tokens (loss mask)", 100.0 * targets / tokens);
  return buf;
}

}  // namespace

BatchSampler::BatchSampler(const std::vector<std::string>& entries, const std::string& dtype, int64_t seq_len,
                           int64_t vocab_size, uint64_t seed, const std::string& split_name,
                           const std::string& format, const ScanOptions& scan, bool separate_documents)
    : split_(split_name),
      seq_len_(seq_len),
      vocab_(vocab_size),
      seed_(seed ^ split_salt(split_name)),
      documents_(separate_documents) {
  const std::string base = "data." + split_name;
  if (entries.empty()) throw std::runtime_error(base + ": no token files given");
  if (seq_len < 1) throw std::runtime_error(base + ": train.seq_len must be >= 1");
  double weight_sum = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string key = base + "[" + std::to_string(i) + "]";
    const DataEntry de = parse_data_entry(entries[i], key);
    Entry e;
    e.text = entries[i];
    e.weight = de.weight;
    int64_t acc = 0;
    for (const auto& path : expand_data_entry(de, entries[i], key, format)) {
      auto src = open_token_source(path, format, dtype);
      if (src->size() < seq_len + 1)
        throw std::runtime_error(path + ": holds " + std::to_string(src->size()) +
                                 " tokens, fewer than one sequence (train.seq_len + 1 = " +
                                 std::to_string(seq_len + 1) + "), in " + key);
      std::vector<int64_t> probe;
      if (documents_ && !src->document_starts(0, 1, probe))
        throw std::runtime_error("data.documents: separate needs to know where documents start, but " + path +
                                 " (" + key + ", " + src->format() +
                                 ") records no documents: prepare the corpus as a Megatron dataset with its "
                                 "document index (scripts/prepare_corpus.py), or set data.documents: packed");
      uint8_t one;
      masks_ = masks_ || documents_ || src->loss_mask(0, 1, &one);
      // Every id now, not when its window is first drawn (maybe never).
      const TokenScan ts = check_token_ids(*src, vocab_size, key, scan);
      e.ids.add(ts.range);
      (ts.from_cache ? e.cached : e.scanned) += scan.enabled ? 1 : 0;
      e.scan_seconds += ts.seconds;
      acc += src->size() - seq_len;
      e.tokens += src->size();
      e.windows.push_back(acc);
      e.files.push_back(std::move(src));
    }
    weight_sum += e.weight;
    total_ += e.tokens;
    entries_.push_back(std::move(e));
  }
  double acc = 0;
  for (auto& e : entries_) {
    e.share = e.weight / weight_sum;
    acc += e.weight;
    cumulative_share_.push_back(acc / weight_sum);
  }
}

uint64_t BatchSampler::hash(int64_t step, int64_t index) const {
  return mix(seed_ ^ mix(uint64_t(step) * 0x9E3779B97F4A7C15ull ^ mix(uint64_t(index) + 1)));
}

size_t BatchSampler::entry_of(int64_t step, int64_t index) const {
  if (entries_.size() == 1) return 0;
  // A second, independent draw from the same hash: 53 bits as a double in [0, 1).
  const double u = double(mix(hash(step, index) ^ 0xD1B54A32D192ED03ull) >> 11) * 0x1.0p-53;
  const size_t e = size_t(std::upper_bound(cumulative_share_.begin(), cumulative_share_.end(), u) -
                          cumulative_share_.begin());
  return std::min(e, entries_.size() - 1);  // rounding may leave the last bound just under 1
}

std::pair<const TokenSource*, int64_t> BatchSampler::locate(int64_t step, int64_t index) const {
  const Entry& e = entries_[entry_of(step, index)];
  const int64_t pos = int64_t(hash(step, index) % uint64_t(e.windows.back()));
  const size_t fi = size_t(std::upper_bound(e.windows.begin(), e.windows.end(), pos) - e.windows.begin());
  return {e.files[fi].get(), pos - (fi == 0 ? 0 : e.windows[fi - 1])};
}

std::pair<std::string, int64_t> BatchSampler::where(int64_t step, int64_t index) const {
  const auto [f, start] = locate(step, index);
  return {f->data_path(), start};
}

void BatchSampler::sequence(int64_t step, int64_t index, int32_t* inputs, int32_t* targets,
                            int32_t* doc_start) const {
  const auto [source, start] = locate(step, index);
  const TokenSource& f = *source;

  // Chunks keep the buffer on the stack: no allocation, no shared state.
  constexpr int64_t kChunk = 512;
  int64_t buf[kChunk];
  for (int64_t t0 = 0; t0 <= seq_len_; t0 += kChunk) {
    const int64_t n = std::min(kChunk, seq_len_ + 1 - t0);
    f.read(start + t0, n, buf);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t tok = buf[k];
      const int64_t t = t0 + k;
      // The start-up scan saw every id already; this catches a file
      // changed under a running job (or a sampler built without the scan).
      if (tok < 0 || tok >= vocab_) throw std::runtime_error(bad_token_message(f, start + t, tok, vocab_));
      if (t < seq_len_) inputs[t] = int32_t(tok);
      if (t > 0) targets[t - 1] = int32_t(tok);
    }
  }
  if (doc_start) mark_documents(f, start, targets, doc_start);
  if (!masks_) return;  // no mask beside any file: nothing to read per sequence
  std::vector<uint8_t> mask(static_cast<size_t>(seq_len_));
  if (f.loss_mask(start + 1, seq_len_, mask.data()))
    for (int64_t t = 0; t < seq_len_; ++t)
      if (mask[size_t(t)] == 0) targets[t] = -1;
}

void BatchSampler::mark_documents(const TokenSource& f, int64_t start, int32_t* targets, int32_t* doc_start) const {
  std::vector<int64_t> starts;
  f.document_starts(start, seq_len_ + 1, starts);
  size_t k = 0;
  int32_t current = 0;
  for (int64_t t = 0; t < seq_len_; ++t) {
    for (; k < starts.size() && starts[k] - start <= t; ++k) current = int32_t(starts[k] - start);
    doc_start[t] = current;
  }
  // The last token of a document would predict the next one's first.
  for (int64_t p : starts) targets[p - start - 1] = -1;
}

std::string BatchSampler::describe() const {
  std::string out;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    char buf[128];
    std::snprintf(buf, sizeof buf, ": %.1f%% of sequences, %zu file%s, %lld tokens (", 100.0 * e.share,
                  e.files.size(), e.files.size() == 1 ? "" : "s", (long long)e.tokens);
    out += "data." + split_ + "[" + std::to_string(i) + "] '" + e.text + "'" + buf + e.files[0]->format() +
           scan_note(e) + (documents_ ? "; documents kept apart" : "") + mask_note(e) + ")\n";
  }
  return out;
}

}  // namespace trainer
