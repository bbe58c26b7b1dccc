// The start-up token scan (data/token_scan.h, data/scan_cache.h): a bad id
// deep inside any format is found when the file is opened, its scan is
// remembered next to the file and reused, a changed file is scanned again,
// and the trainer refuses such a file even when no step would draw it.
#include <catch2/catch.hpp>

#include "tests/error_of.h"

#include "tests/build_paths.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "data/batch_sampler.h"
#include "data/scan_cache.h"
#include "data/token_scan.h"
#include "e2e_util.h"

using namespace trainer;
namespace fs = std::filesystem;
using Catch::Contains;

namespace {

// The directory of one test case (tests/temp_dir.h).
struct TempDir : test::TempDir {
  explicit TempDir(const std::string& name) : test::TempDir("scan", name) {}
};

void write_bytes(const std::string& path, const void* p, size_t n, bool append = false) {
  std::ofstream f(path, std::ios::binary | (append ? std::ios::app : std::ios::trunc));
  f.write(static_cast<const char*>(p), std::streamsize(n));
}

template <class T>
void write_tokens(const std::string& path, const std::vector<T>& t) {
  write_bytes(path, t.data(), t.size() * sizeof(T));
}

// Ids i * 7 % 256: every value below 256 appears.
template <class T>
std::vector<T> ramp(size_t n) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = T((i * 7) % 256);
  return v;
}

using trainer::test::error_of;

// llm.c GPT-2 shard: 256 int32 header {20240520, 1, count}, uint16 tokens.
void write_llmc(const std::string& path, const std::vector<uint16_t>& toks) {
  std::vector<int32_t> h(256, 0);
  h[0] = 20240520;
  h[1] = 1;
  h[2] = int32_t(toks.size());
  write_bytes(path, h.data(), h.size() * 4);
  write_bytes(path, toks.data(), toks.size() * 2, true);
}

// Megatron int32 dataset of the given sequence lengths cut from `toks`.
void write_megatron_i32(const std::string& prefix, const std::vector<int32_t>& toks, const std::vector<int32_t>& sizes) {
  write_tokens(prefix + ".bin", toks);
  std::string idx("MMIDIDX\0\0", 9);
  auto put = [&](const void* p, size_t n) { idx.append(static_cast<const char*>(p), n); };
  const uint64_t version = 1, seqs = sizes.size(), docs = sizes.size() + 1;
  const uint8_t code = 4;
  put(&version, 8);
  put(&code, 1);
  put(&seqs, 8);
  put(&docs, 8);
  for (int32_t s : sizes) put(&s, 4);
  int64_t ptr = 0;
  for (int32_t s : sizes) {
    put(&ptr, 8);
    ptr += int64_t(s) * 4;
  }
  for (int64_t d = 0; d <= int64_t(seqs); ++d) put(&d, 8);
  write_bytes(prefix + ".idx", idx.data(), idx.size());
}

// Sets the file's mtime to `seconds` past the epoch: "modified" without
// waiting for the clock to tick.
void set_mtime(const std::string& path, int64_t seconds) {
  timespec t[2] = {{seconds, 0}, {seconds, 0}};
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), t, 0) == 0);
}

// Restores an environment variable when the test ends.
struct EnvGuard {
  std::string name;
  bool had;
  std::string old;
  explicit EnvGuard(const char* n) : name(n), had(std::getenv(n) != nullptr), old(had ? std::getenv(n) : "") {}
  ~EnvGuard() {
    if (had) ::setenv(name.c_str(), old.c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};

}  // namespace

TEST_CASE("token scan: one bad id deep inside any format is found when the file is opened", "[data][scan]") {
  TempDir d("formats");
  // 3.5M tokens: four chunks, so several threads share the file and the bad
  // id sits in a later chunk.
  const size_t n = 3'500'000, bad_at = 2'900'001;
  {
    auto t = ramp<uint16_t>(n);
    t[bad_at] = 300;
    write_tokens(d / "raw16.bin", t);
    write_llmc(d / "shard.bin", t);
  }
  {
    auto t = ramp<uint32_t>(n);
    t[bad_at] = 70000;
    write_tokens(d / "raw32.bin", t);
  }
  {
    auto t = ramp<int32_t>(n);
    t[bad_at] = -4;
    // Sequences of 1000 tokens; the last one takes the rest.
    std::vector<int32_t> sizes(n / 1000, 1000);
    sizes.back() += int32_t(n % 1000);
    write_megatron_i32(d / "mega", t, sizes);
  }
  struct Case {
    std::string entry, dtype, file, value;
    uint64_t byte_offset;
  };
  const std::vector<Case> cases = {
      {d / "raw16.bin", "uint16", d / "raw16.bin", "token 300", bad_at * 2},
      {d / "raw32.bin", "uint32", d / "raw32.bin", "token 70000", bad_at * 4},
      {d / "shard.bin", "uint16", d / "shard.bin", "token 300", 1024 + bad_at * 2},
      {d / "mega", "uint16", d / "mega.bin", "token -4", bad_at * 4},
  };
  for (const Case& c : cases) {
    const int64_t scans = token_scans_run();
    const auto t0 = std::chrono::steady_clock::now();
    const std::string msg = error_of([&] { BatchSampler({c.entry}, c.dtype, 64, 256, 1, "train"); });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[scan] %s: %.3f s: %s\n", c.entry.c_str(), s, msg.c_str());
    CHECK_THAT(msg, Contains("data.train[0]") && Contains(c.file) && Contains(c.value) &&
                        Contains("token index " + std::to_string(bad_at)) &&
                        Contains("byte offset " + std::to_string(c.byte_offset)) && Contains("start-up scan"));
    if (c.value != "token -4") CHECK_THAT(msg, Contains("model.vocab_size 256"));
    CHECK(token_scans_run() == scans + 1);
  }

  // A blend: the first entry is clean, the second holds the bad id; the
  // error names the second entry.
  write_tokens(d / "clean.bin", ramp<uint16_t>(10000));
  const std::string blend = error_of([&] {
    BatchSampler({"3 " + d / "clean.bin", "1 " + d / "raw16.bin"}, "uint16", 64, 256, 1, "train");
  });
  std::printf("[scan] blend: %s\n", blend.c_str());
  CHECK_THAT(blend, Contains("data.train[1]") && Contains(d / "raw16.bin") && Contains("token 300"));
  // The same files with a vocabulary that holds every id are fine.
  BatchSampler big({d / "raw16.bin"}, "uint16", 64, 301, 1, "train");
  CHECK(big.entries()[0].ids.max == 300);
  CHECK(big.entries()[0].ids.min == 0);
}

TEST_CASE("token scan: the result is cached next to the file, reused, and redone when the file changes", "[data][scan]") {
  TempDir d("cache");
  const std::string f = d / "tokens.bin";
  write_tokens(f, ramp<uint16_t>(50000));
  const int64_t s0 = token_scans_run();
  {
    BatchSampler a({f}, "uint16", 32, 256, 1, "train");
    CHECK(token_scans_run() == s0 + 1);
    CHECK(a.entries()[0].scanned == 1);
    CHECK(a.entries()[0].cached == 0);
    std::printf("[scan cache] first open: %s", a.describe().c_str());
    CHECK_THAT(a.describe(), Contains("ids 0..255") && Contains("scanned in"));
  }
  REQUIRE(fs::exists(f + ".scan"));
  {
    std::ifstream in(f + ".scan");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::printf("[scan cache] %s.scan:\n%s", f.c_str(), text.c_str());
    CHECK_THAT(text, Contains("trainer token scan 1") && Contains("tokens 50000") && Contains("max 255") &&
                         Contains("format raw uint16"));
  }
  {
    BatchSampler b({f}, "uint16", 32, 256, 1, "train");
    CHECK(token_scans_run() == s0 + 1);  // no second scan
    CHECK(b.entries()[0].cached == 1);
    std::printf("[scan cache] second open: %s", b.describe().c_str());
    CHECK_THAT(b.describe(), Contains("from the scan cache"));
    // The cached range serves any vocabulary: too small a one is refused
    // (and rescanned only to say where).
    CHECK_THAT(error_of([&] { BatchSampler({f}, "uint16", 32, 200, 1, "train"); }),
               Contains("is >= model.vocab_size 200") && Contains("token index 29"));
  }
  // Same size, new contents and mtime: scanned again, and the bad id found.
  {
    auto t = ramp<uint16_t>(50000);
    t[40000] = 256;
    write_tokens(f, t);
    set_mtime(f, 1'000'000'000);
    const int64_t s1 = token_scans_run();
    CHECK_THAT(error_of([&] { BatchSampler({f}, "uint16", 32, 256, 1, "train"); }),
               Contains("token 256") && Contains("token index 40000"));
    CHECK(token_scans_run() == s1 + 1);
    // The bad verdict is cached too: the next open does not rescan to
    // decide, only to point at the token (one scan), and says the same.
    CHECK_THAT(error_of([&] { BatchSampler({f}, "uint16", 32, 256, 1, "train"); }),
               Contains("token 256") && Contains("token index 40000"));
    CHECK(token_scans_run() == s1 + 2);
    BatchSampler ok({f}, "uint16", 32, 257, 1, "train");
    CHECK(token_scans_run() == s1 + 2);  // cached: max 256 < 257
    CHECK(ok.entries()[0].cached == 1);
  }
  // A new size (appended tokens): scanned again.
  {
    const auto more = ramp<uint16_t>(100);
    write_bytes(f, more.data(), more.size() * 2, true);
    const int64_t s2 = token_scans_run();
    BatchSampler c({f}, "uint16", 32, 257, 1, "train");
    CHECK(token_scans_run() == s2 + 1);
    CHECK(c.entries()[0].scanned == 1);
    CHECK(c.entries()[0].tokens == 50100);
  }
  // Megatron: the record sits next to the .bin and stamps both halves.
  {
    write_megatron_i32(d / "m", ramp<int32_t>(5000), {2000, 3000});
    const int64_t s3 = token_scans_run();
    BatchSampler m1({d / "m"}, "uint16", 32, 256, 1, "train");
    BatchSampler m2({d / "m.idx"}, "uint16", 32, 256, 1, "train");
    CHECK(token_scans_run() == s3 + 1);
    CHECK(fs::exists(d / "m.bin.scan"));
    // Touching only the index invalidates it.
    set_mtime(d / "m.idx", 1'100'000'000);
    BatchSampler m3({d / "m"}, "uint16", 32, 256, 1, "train");
    CHECK(token_scans_run() == s3 + 2);
  }
  // Corrupt records are ignored, not trusted.
  for (const char* junk : {"", "trainer token scan 1\nformat raw uint16\n", "garbage\n"}) {
    write_bytes(f + ".scan", junk, std::strlen(junk));
    const int64_t s4 = token_scans_run();
    BatchSampler j({f}, "uint16", 32, 257, 1, "train");
    CHECK(token_scans_run() == s4 + 1);
  }
}

TEST_CASE("token scan: an in-place edit with the mtime put back is rescanned, not trusted", "[data][scan]") {
  TempDir d("inplace");
  // A small file (hashed whole) and a large one (sampled blocks): the edit
  // lands in the large file's first block, which every sample includes.
  for (const size_t n : {size_t(50000), size_t(3000000)}) {
    INFO(n << " tokens");
    const std::string f = d / ("tokens" + std::to_string(n) + ".bin");
    auto t = ramp<uint16_t>(n);
    write_tokens(f, t);
    set_mtime(f, 1'200'000'000);
    const int64_t s0 = token_scans_run();
    { BatchSampler a({f}, "uint16", 32, 256, 1, "train"); }
    REQUIRE(token_scans_run() == s0 + 1);
    {
      BatchSampler b({f}, "uint16", 32, 256, 1, "train");  // unchanged: the cache serves it
      CHECK(token_scans_run() == s0 + 1);
      CHECK(b.entries()[0].cached == 1);
    }
    struct stat before {};
    REQUIRE(::stat(f.c_str(), &before) == 0);
    t[100] = 300;  // out of range, written over in place: same size, same inode
    {
      std::fstream io(f, std::ios::binary | std::ios::in | std::ios::out);
      io.seekp(std::streamoff(100 * sizeof(uint16_t)));
      io.write(reinterpret_cast<const char*>(&t[100]), sizeof(uint16_t));
    }
    set_mtime(f, 1'200'000'000);  // as touch -r or rsync -t would leave it
    struct stat after {};
    REQUIRE(::stat(f.c_str(), &after) == 0);
    REQUIRE(after.st_ino == before.st_ino);
    REQUIRE(after.st_size == before.st_size);
    REQUIRE(after.st_mtim.tv_sec == before.st_mtim.tv_sec);
    REQUIRE(after.st_mtim.tv_nsec == before.st_mtim.tv_nsec);
    const std::string e = error_of([&] { BatchSampler({f}, "uint16", 32, 256, 1, "train"); });
    std::printf("[scan cache] in-place edit, mtime restored (%zu tokens): %s\n", n, e.c_str());
    CHECK_THAT(e, Contains("token 300") && Contains("token index 100"));
    CHECK(token_scans_run() > s0 + 1);
  }
}

TEST_CASE("token scan: an unwritable data directory falls back to the cache dir, then to no cache", "[data][scan]") {
  TempDir d("fallback");
  EnvGuard xdg("XDG_CACHE_HOME");
  const std::string f = d / "tokens.bin";
  write_tokens(f, ramp<uint16_t>(20000));
  // A directory where the record would go: writing next to the data fails
  // the way a read-only directory does (this test runs as root, which may
  // write anywhere).
  fs::create_directories(f + ".scan");
  ::setenv("XDG_CACHE_HOME", (d / "cache").c_str(), 1);
  const int64_t s0 = token_scans_run();
  BatchSampler a({f}, "uint16", 32, 256, 1, "train");
  CHECK(token_scans_run() == s0 + 1);
  const auto paths = scan_cache_paths(*a.entries()[0].files[0]);
  REQUIRE(paths.size() == 2);
  std::printf("[scan fallback] record in %s\n", paths[1].c_str());
  CHECK(paths[1].rfind(d / "cache/trainer/token-scans/tokens.bin-", 0) == 0);
  CHECK(fs::exists(paths[1]));
  BatchSampler b({f}, "uint16", 32, 256, 1, "train");
  CHECK(token_scans_run() == s0 + 1);
  CHECK(b.entries()[0].cached == 1);

  // Neither place writable (the cache dir's parent is a file): silently no
  // cache, every open scans.
  write_bytes(d / "not_a_dir", "x", 1);
  ::setenv("XDG_CACHE_HOME", (d / "not_a_dir").c_str(), 1);
  BatchSampler c({f}, "uint16", 32, 256, 1, "train");
  BatchSampler e({f}, "uint16", 32, 256, 1, "train");
  CHECK(token_scans_run() == s0 + 3);
  CHECK(e.entries()[0].scanned == 1);
}

TEST_CASE("token scan: speed on a large file", "[data][scan]") {
  TempDir d("speed");
  const std::string f = d / "big.bin";
  const size_t n = size_t(32) << 20;  // 32M tokens, 64 MiB
  write_tokens(f, ramp<uint16_t>(n));
  auto src = open_token_source(f, "raw", "uint16");
  src->min_max(0, src->size());  // pages in, so the timing is the loop's
  const auto t0 = std::chrono::steady_clock::now();
  const TokenRange r = scan_token_range(*src);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double gbs = double(n) * 2 / s / 1e9;
  std::printf("[scan speed] %zu tokens (%.0f MiB) in %.4f s: %.2f GB/s\n", n, double(n) * 2 / (1 << 20), s, gbs);
  CHECK(r.min == 0);
  CHECK(r.max == 255);
  // Far below what the vectorised loop does (several GB/s on one core):
  // this fails only if the scan fell back to token-by-token reading.
  CHECK(gbs > 0.3);
}

TEST_CASE("trainer: a bad token id that no step draws still stops the run at start-up", "[data][scan][binary]") {
  TempDir d("binary");
  const std::string f = d / "tokens.bin";
  // 200k byte tokens, one id 999 at index 150000.
  auto t = ramp<uint16_t>(200000);
  t[150000] = 999;
  write_tokens(f, t);
  const std::string cfg = d / "cfg.yaml";
  {
    std::ofstream c(cfg);
    c << "run: {name: badtok, dir: " << (d / "run") << "}\n"
      << "model: {vocab_size: 256, d_model: 32, n_layers: 1, n_heads: 2, max_seq_len: 32}\n"
      << "train: {steps: 2, seq_len: 32, micro_batch_size: 2, global_batch_size: 2, device: cpu, threads: 1}\n"
      << "optim: {warmup_steps: 0}\n"
      << "data: {train: [" << f << "]}\n"
      << "log: {progress: lines}\n";
  }
  // The two steps' windows (and the third, which the prefetcher fills
  // ahead) never touch the bad id: without the start-up scan the run
  // trained on this file and exited 0.
  ScanOptions no_scan;
  no_scan.enabled = false;
  BatchSampler s({f}, "uint16", 32, 256, 1234, "train", "auto", no_scan);
  std::vector<int32_t> in(32), tg(32);
  for (int64_t step = 0; step < 3; ++step)
    for (int64_t i = 0; i < 2; ++i) REQUIRE_NOTHROW(s.sequence(step, i, in.data(), tg.data()));

  std::string out;
  const int rc = e2e::run(std::string(TRAINER_BIN) + " --config " + cfg, &out);
  INFO(e2e::tail(out));
  const size_t at = out.find("error:");
  const std::string line = at == std::string::npos ? "<no error line>" : out.substr(at, out.find('\n', at) - at);
  std::printf("[scan binary] exit %d: %s\n", rc, line.c_str());
  CHECK(rc == 1);
  CHECK_THAT(out, Contains("error: data.train[0]: " + f + ": token 999 at token index 150000 (byte offset 300000)") &&
                      Contains("model.vocab_size 256"));
  CHECK_FALSE(fs::exists(d / "run/metrics.jsonl"));  // no step ran

  // A clean file: the scan's line, then a cached one on the second run.
  t[150000] = 7;
  write_tokens(f, t);
  std::string first, second;
  REQUIRE(e2e::run(std::string(TRAINER_BIN) + " --config " + cfg, &first) == 0);
  REQUIRE(e2e::run(std::string(TRAINER_BIN) + " --config " + cfg, &second) == 0);
  CHECK_THAT(first, Contains("ids 0..255, scanned in"));
  CHECK_THAT(second, Contains("ids 0..255, from the scan cache"));
}
