// Token datasets: each published layout written byte by byte here and read
// back exactly, a corrupted variant of each rejected with the file and byte
// offset named, format detection, globs, weighted blending, determinism and
// the prefetch thread.
#include <catch2/catch.hpp>

#include "tests/error_of.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "data/batch_sampler.h"
#include "config/config.h"
#include "data/dataset_blend.h"
#include "data/dataset_formats.h"
#include "data/prefetch.h"
#include "data/token_file.h"

using namespace trainer;
namespace fs = std::filesystem;

namespace {

// The directory of one test case (tests/temp_dir.h).
struct TempDir : test::TempDir {
  explicit TempDir(const std::string& name) : test::TempDir("data", name) {}
};

class Bytes {
 public:
  template <class T>
  Bytes& put(T v) {
    const size_t at = b_.size();
    b_.resize(at + sizeof(T));
    std::memcpy(b_.data() + at, &v, sizeof(T));
    return *this;
  }
  Bytes& raw(const void* p, size_t n) {
    b_.insert(b_.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
    return *this;
  }
  std::vector<char>& vec() { return b_; }
  void write(const std::string& path) const {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(b_.data(), std::streamsize(b_.size()));
  }

 private:
  std::vector<char> b_;
};

template <class T>
void write_raw(const std::string& path, const std::vector<T>& toks) {
  Bytes b;
  for (T t : toks) b.put(t);
  b.write(path);
}

// llm.c: dev/data/data_common.py write_datafile.
Bytes llmc_bytes(const std::vector<uint16_t>& toks, int32_t magic = 20240520, int32_t version = 1) {
  Bytes b;
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = int32_t(toks.size());
  b.raw(header.data(), header.size() * 4);
  for (uint16_t t : toks) b.put(t);
  return b;
}

// Megatron: MMapIndexedDatasetBuilder / _IndexWriter, sequences of int64
// values stored as `code` (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16).
struct Megatron {
  Bytes idx, bin;
};
Megatron megatron_bytes(const std::vector<std::vector<int64_t>>& seqs, uint8_t code) {
  static const std::map<int, int> elem{{1, 1}, {2, 1}, {3, 2}, {4, 4}, {5, 8}, {6, 8}, {7, 4}, {8, 2}};
  Megatron m;
  std::vector<int32_t> sizes;
  std::vector<int64_t> pointers;
  int64_t ptr = 0;
  for (const auto& s : seqs) {
    sizes.push_back(int32_t(s.size()));
    pointers.push_back(ptr);
    ptr += int64_t(s.size()) * elem.at(code);
    for (int64_t v : s) {
      switch (code) {
        case 1: m.bin.put(uint8_t(v)); break;
        case 2: m.bin.put(int8_t(v)); break;
        case 3: m.bin.put(int16_t(v)); break;
        case 4: m.bin.put(int32_t(v)); break;
        case 5: m.bin.put(int64_t(v)); break;
        case 6: m.bin.put(double(v)); break;
        case 7: m.bin.put(float(v)); break;
        default: m.bin.put(uint16_t(v)); break;
      }
    }
  }
  m.idx.raw("MMIDIDX\x00\x00", 9).put(uint64_t(1)).put(code).put(uint64_t(seqs.size()));
  // One document per sequence: doc_idx = 0, 1, ..., S.
  m.idx.put(uint64_t(seqs.size() + 1));
  for (int32_t s : sizes) m.idx.put(s);
  for (int64_t p : pointers) m.idx.put(p);
  for (size_t d = 0; d <= seqs.size(); ++d) m.idx.put(int64_t(d));
  return m;
}

void write_megatron(const std::string& prefix, const Megatron& m) {
  m.idx.write(prefix + ".idx");
  m.bin.write(prefix + ".bin");
}

using trainer::test::error_of;

std::vector<int64_t> read_all(const TokenSource& s) {
  std::vector<int64_t> v(size_t(s.size()));
  s.read(0, s.size(), v.data());
  return v;
}

using Catch::Contains;

}  // namespace

TEST_CASE("raw uint16/uint32 token files read back exactly", "[data]") {
  TempDir d("raw");
  write_raw<uint16_t>(d / "a16.bin", {0, 1, 65535, 300, 7});
  write_raw<uint32_t>(d / "a32.bin", {0, 70000, 4000000000u, 5});
  auto a = open_token_source(d / "a16.bin", "raw", "uint16");
  CHECK(a->size() == 5);
  CHECK(read_all(*a) == std::vector<int64_t>{0, 1, 65535, 300, 7});
  CHECK(a->at(2) == 65535);
  CHECK(a->byte_offset(3) == 6);
  CHECK(a->format() == "raw uint16");
  auto b = open_token_source(d / "a32.bin", "auto", "uint32");
  CHECK(read_all(*b) == std::vector<int64_t>{0, 70000, 4000000000ll, 5});
  CHECK(b->byte_offset(2) == 8);

  // Truncated: 5 bytes of uint16 leaves half a token at byte offset 4.
  Bytes t;
  t.put(uint16_t(1)).put(uint16_t(2)).put(uint8_t(3));
  t.write(d / "trunc.bin");
  CHECK_THAT(error_of([&] { open_token_source(d / "trunc.bin", "raw", "uint16"); }),
             Contains(d / "trunc.bin") && Contains("byte offset 4") && Contains("not a multiple"));
  CHECK_THAT(error_of([&] { open_token_source(d / "a16.bin", "raw", "int8"); }), Contains("data.dtype"));
  CHECK_THAT(error_of([&] { open_token_source(d / "a16.bin", "parquet", "uint16"); }),
             Contains("data.format") && Contains("parquet"));
  CHECK_THAT(error_of([&] { open_token_source(d / "missing.bin", "auto", "uint16"); }),
             Contains(d / "missing.bin") && Contains("cannot open"));
}

TEST_CASE("llm.c shards: header checked, tokens read back exactly", "[data]") {
  TempDir d("llmc");
  const std::vector<uint16_t> toks{5, 6, 7, 50256, 0, 1};
  llmc_bytes(toks).write(d / "shard_000.bin");
  auto s = open_token_source(d / "shard_000.bin", "llmc", "uint16");
  CHECK(s->size() == 6);
  CHECK(read_all(*s) == std::vector<int64_t>{5, 6, 7, 50256, 0, 1});
  CHECK(s->byte_offset(0) == 1024);
  CHECK(s->byte_offset(3) == 1030);
  CHECK(s->format() == "llm.c uint16");

  // The Llama-3 variant: magic 20240801, version 7, uint32 tokens.
  {
    Bytes b;
    std::vector<int32_t> h(256, 0);
    h[0] = 20240801;
    h[1] = 7;
    h[2] = 3;
    b.raw(h.data(), 1024).put(uint32_t(128000)).put(uint32_t(9)).put(uint32_t(128255));
    b.write(d / "llama3.bin");
    auto l = open_token_source(d / "llama3.bin", "auto", "uint16");
    CHECK(l->format() == "llm.c uint32");
    CHECK(read_all(*l) == std::vector<int64_t>{128000, 9, 128255});
  }

  SECTION("bad magic") {
    llmc_bytes(toks, 12345).write(d / "bad.bin");
    CHECK_THAT(error_of([&] { open_token_source(d / "bad.bin", "llmc", "uint16"); }),
               Contains(d / "bad.bin") && Contains("bad magic") && Contains("byte offset 0"));
  }
  SECTION("bad version") {
    llmc_bytes(toks, 20240520, 2).write(d / "bad.bin");
    const std::string e = error_of([&] { open_token_source(d / "bad.bin", "auto", "uint16"); });
    CHECK_THAT(e, Contains(d / "bad.bin") && Contains("bad version 2") && Contains("byte offset 4"));
    CHECK_THAT(e, Contains("data.format: raw"));  // auto detection says how to override it
  }
  SECTION("truncated tokens") {
    Bytes b = llmc_bytes(toks);
    b.vec().resize(b.vec().size() - 3);
    b.write(d / "bad.bin");
    CHECK_THAT(error_of([&] { open_token_source(d / "bad.bin", "llmc", "uint16"); }),
               Contains(d / "bad.bin") && Contains("truncated") && Contains("byte offset 1033"));
  }
  SECTION("truncated header") {
    Bytes b = llmc_bytes(toks);
    b.vec().resize(100);
    b.write(d / "bad.bin");
    CHECK_THAT(error_of([&] { open_token_source(d / "bad.bin", "llmc", "uint16"); }),
               Contains(d / "bad.bin") && Contains("truncated") && Contains("byte offset 100"));
  }
  SECTION("trailing bytes") {
    Bytes b = llmc_bytes(toks);
    b.put(uint16_t(1));
    b.write(d / "bad.bin");
    CHECK_THAT(error_of([&] { open_token_source(d / "bad.bin", "llmc", "uint16"); }),
               Contains(d / "bad.bin") && Contains("2 trailing bytes") && Contains("byte offset 1036"));
  }
}

TEST_CASE("Megatron indexed datasets: every integer dtype, one stream", "[data]") {
  TempDir d("megatron");
  // An empty sequence in the middle: the stream skips it.
  const std::vector<std::vector<int64_t>> seqs{{1, 2, 3}, {}, {4}, {5, 6, 7, 8, 9}, {10, 11}};
  const std::vector<int64_t> flat{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  for (uint8_t code : {uint8_t(1), uint8_t(2), uint8_t(3), uint8_t(4), uint8_t(5), uint8_t(8)}) {
    INFO("dtype code " << int(code));
    const std::string prefix = d / ("ds" + std::to_string(code));
    write_megatron(prefix, megatron_bytes(seqs, code));
    for (const std::string& p : {prefix, prefix + ".bin", prefix + ".idx"}) {
      for (const char* fmt : {"auto", "megatron"}) {
        auto s = open_token_source(p, fmt, "uint16");
        REQUIRE(s->size() == 11);
        CHECK(read_all(*s) == flat);
        for (int64_t i = 0; i < 11; ++i) CHECK(s->at(i) == flat[size_t(i)]);
        // A read starting mid-sequence and crossing the empty one.
        std::vector<int64_t> part(5);
        s->read(2, 5, part.data());
        CHECK(part == std::vector<int64_t>{3, 4, 5, 6, 7});
        CHECK(s->data_path() == prefix + ".bin");
        CHECK(s->path() == p);
      }
    }
  }
  auto s = open_token_source(d / "ds4", "auto", "uint16");
  CHECK(s->format() == "megatron int32");
  CHECK(s->byte_offset(3) == 12);  // sequence {4} starts at byte 12 (3 int32 before it)
  CHECK(s->byte_offset(5) == 20);  // second token of {5, ...}
}

TEST_CASE("Megatron corruptions are named with file and byte offset", "[data]") {
  TempDir d("megatron_bad");
  const std::vector<std::vector<int64_t>> seqs{{1, 2, 3}, {4, 5}};
  const std::string p = d / "ds";
  const std::string idx = p + ".idx";
  Megatron good = megatron_bytes(seqs, 8);
  write_megatron(p, good);
  REQUIRE(open_token_source(p, "megatron", "uint16")->size() == 5);

  SECTION("bad magic") {
    Megatron m = good;
    m.idx.vec()[0] = 'X';
    write_megatron(p, m);
    CHECK_THAT(error_of([&] { open_token_source(p, "auto", "uint16"); }),
               Contains(idx) && Contains("bad magic") && Contains("byte offset 0"));
  }
  SECTION("bad version") {
    Megatron m = good;
    m.idx.vec()[9] = 2;
    write_megatron(p, m);
    CHECK_THAT(error_of([&] { open_token_source(p, "auto", "uint16"); }),
               Contains(idx) && Contains("bad version 2") && Contains("byte offset 9"));
  }
  SECTION("float dtype") {
    write_megatron(p, megatron_bytes(seqs, 7));
    CHECK_THAT(error_of([&] { open_token_source(p, "auto", "uint16"); }),
               Contains(idx) && Contains("float32") && Contains("byte offset 17"));
  }
  SECTION("truncated index") {
    Megatron m = good;
    m.idx.vec().resize(m.idx.vec().size() - 4);
    write_megatron(p, m);
    // 34 header + 2*4 sizes + 2*8 pointers + 3*8 doc_idx = 82 bytes expected.
    CHECK_THAT(error_of([&] { open_token_source(p, "auto", "uint16"); }),
               Contains(idx) && Contains("truncated") && Contains("82 bytes") && Contains("byte offset 78"));
    m.idx.vec().resize(20);
    write_megatron(p, m);
    CHECK_THAT(error_of([&] { open_token_source(p, "auto", "uint16"); }),
               Contains(idx) && Contains("truncated") && Contains("byte offset 20"));
  }
  SECTION("trailing index bytes") {
    Megatron m = good;
    m.idx.put(uint32_t(0));
    write_megatron(p, m);
    CHECK_THAT(error_of([&] { open_token_source(p, "auto", "uint16"); }),
               Contains(idx) && Contains("trailing") && Contains("byte offset 82"));
  }
  SECTION("index pointing past the .bin") {
    Megatron m = good;
    m.bin.vec().resize(8);  // sequence 1 needs bytes [6, 10)
    write_megatron(p, m);
    CHECK_THAT(error_of([&] { open_token_source(p, "auto", "uint16"); }),
               Contains(idx) && Contains(p + ".bin") && Contains("sequence 1") && Contains("[6, 10)") &&
                   Contains("byte offset 8"));
  }
  SECTION("missing .bin") {
    good.idx.write(d / "lonely.idx");
    CHECK_THAT(error_of([&] { open_token_source(d / "lonely", "auto", "uint16"); }),
               Contains(d / "lonely.bin") && Contains("cannot open"));
  }
}

TEST_CASE("format auto-detection", "[data]") {
  TempDir d("detect");
  write_raw<uint16_t>(d / "raw.bin", {1, 2, 3, 4});
  llmc_bytes({1, 2, 3}).write(d / "shard.bin");
  write_megatron(d / "mega", megatron_bytes({{1, 2}}, 8));
  write_megatron(d / "mega2.bin", megatron_bytes({{1, 2}}, 8));  // a prefix that itself ends in .bin
  CHECK(detect_token_format(d / "raw.bin") == "raw");
  CHECK(detect_token_format(d / "shard.bin") == "llmc");
  CHECK(detect_token_format(d / "mega") == "megatron");
  CHECK(detect_token_format(d / "mega.bin") == "megatron");
  CHECK(detect_token_format(d / "mega.idx") == "megatron");
  CHECK(detect_token_format(d / "mega2.bin") == "megatron");
  CHECK(open_token_source(d / "mega2.bin", "auto", "uint16")->data_path() == d / "mega2.bin.bin");
  CHECK(detect_token_format(d / "missing.bin") == "raw");
  CHECK(megatron_prefix(d / "mega.bin") == d / "mega");
  CHECK(megatron_prefix(d / "raw.bin").empty());
  // A forced format wins over detection: the llm.c shard read as raw tokens.
  CHECK(open_token_source(d / "shard.bin", "raw", "uint16")->size() == (1024 + 6) / 2);
}

TEST_CASE("data entries: weights and globs", "[data]") {
  TempDir d("glob");
  for (const char* f : {"c_002.bin", "c_000.bin", "c_001.bin", "other.bin"})
    write_raw<uint16_t>(d / f, std::vector<uint16_t>(40, 1));
  fs::create_directories(d.path / "c_dir.bin");  // directories never count as files
  write_megatron(d / "m_a", megatron_bytes({{1, 2}}, 8));
  write_megatron(d / "m_b", megatron_bytes({{1, 2}}, 8));
  write_raw<uint16_t>(d / "with space.bin", {1, 2, 3});

  DataEntry e = parse_data_entry(d / "c_000.bin", "data.train[0]");
  CHECK(e.weight == 1.0);
  CHECK(e.pattern == d / "c_000.bin");
  e = parse_data_entry("  2.5   " + d / "c_*.bin ", "data.train[0]");
  CHECK(e.weight == 2.5);
  CHECK(e.pattern == d / "c_*.bin");
  CHECK(expand_data_entry(e, "", "data.train[0]", "auto") ==
        std::vector<std::string>{d / "c_000.bin", d / "c_001.bin", d / "c_002.bin"});
  e = parse_data_entry("1e-3 " + d / "m_*", "data.train[0]");
  CHECK(e.weight == Approx(1e-3));
  // Each Megatron dataset's .bin and .idx match, but the dataset counts once.
  CHECK(expand_data_entry(e, "", "k", "auto") == std::vector<std::string>{d / "m_a", d / "m_b"});
  CHECK(parse_data_entry(d / "with space.bin", "k").pattern == d / "with space.bin");

  CHECK_THAT(error_of([&] { parse_data_entry("0 " + d / "c_000.bin", "data.train[1]"); }),
             Contains("data.train[1]") && Contains("must be > 0"));
  CHECK_THAT(error_of([&] { parse_data_entry("-2 a.bin", "data.valid[0]"); }),
             Contains("data.valid[0]") && Contains("must be > 0"));
  CHECK_THAT(error_of([&] { parse_data_entry("3x a.bin", "data.train[0]"); }),
             Contains("data.train[0]") && Contains("cannot parse the weight '3x'"));
  CHECK_THAT(error_of([&] { parse_data_entry("0.3", "data.train[2]"); }),
             Contains("data.train[2]") && Contains("weight without a path"));
  CHECK_THAT(error_of([&] { parse_data_entry("  ", "data.train[0]"); }), Contains("empty path"));
  const std::string nothing = "2 " + d / "nothing_*.bin";
  CHECK_THAT(error_of([&] { BatchSampler({nothing}, "uint16", 8, 256, 1, "train"); }),
             Contains("data.train[0]") && Contains(d / "nothing_*.bin") && Contains("matches no files"));
  CHECK_THAT(error_of([&] { BatchSampler({d / "c_000.bin", "x2 foo.bin"}, "uint16", 8, 256, 1, "valid"); }),
             Contains("data.valid[1]") && Contains("WEIGHT PATH"));

  // The config rejects a bad weight before any file is opened.
  CHECK_THAT(error_of([&] { load_config_text("data:\n  train: ['0 a.bin']\n", "w.yaml", {}); }),
             Contains("w.yaml") && Contains("data.train[0]") && Contains("> 0"));
  const Config c = load_config_text("data:\n  train: ['3 a/*.bin', b.bin]\n  format: megatron\n", "f.yaml", {});
  CHECK(c.data.format == "megatron");
  CHECK(c.data.train[0] == "3 a/*.bin");
  CHECK(Config().data.format == "auto");
  CHECK_THAT(error_of([&] { load_config_text(std::string("data:\n  train: [a.bin]\n  format: hdf5\n"), "f.yaml", {}); }),
             Contains("data.format") && Contains("megatron"));
}

TEST_CASE("sampler: windows are contiguous tokens of one file", "[data]") {
  TempDir d("window");
  // Token value == its position, so a window's content proves where it came from.
  std::vector<uint16_t> a(3000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = uint16_t(i);
  write_raw(d / "a.bin", a);
  std::vector<std::vector<int64_t>> seqs;
  for (int s = 0; s < 30; ++s) {
    std::vector<int64_t> v;
    for (int k = 0; k < 1 + s % 7; ++k) v.push_back(10000 + int64_t(seqs.size() * 10 + size_t(k)));
    seqs.push_back(v);
  }
  write_megatron(d / "m", megatron_bytes(seqs, 4));
  std::vector<int64_t> mflat;
  for (auto& s : seqs) mflat.insert(mflat.end(), s.begin(), s.end());
  BatchSampler s({d / "a.bin", d / "m"}, "uint16", 16, 20000, 3, "train");
  std::vector<int32_t> in(16), tg(16);
  int from_m = 0;
  for (int64_t i = 0; i < 200; ++i) {
    s.sequence(i / 10, i % 10, in.data(), tg.data());
    for (int t = 0; t + 1 < 16; ++t) REQUIRE(tg[t] == in[t + 1]);
    if (in[0] < 10000) {
      for (int t = 0; t < 16; ++t) REQUIRE(in[t] == in[0] + t);
      REQUIRE(tg[15] == in[0] + 16);
      CHECK(s.entry_of(i / 10, i % 10) == 0);
    } else {
      ++from_m;
      const auto it = std::find(mflat.begin(), mflat.end(), int64_t(in[0]));
      REQUIRE(it != mflat.end());
      REQUIRE(mflat.end() - it >= 17);
      for (int t = 0; t < 16; ++t) REQUIRE(in[t] == it[t]);
      CHECK(s.entry_of(i / 10, i % 10) == 1);
    }
  }
  CHECK(from_m > 50);
  CHECK(from_m < 150);
  CHECK(s.total_tokens() == 3000 + int64_t(mflat.size()));
  CHECK_THAT(s.describe(), Contains("data.train[1]") && Contains("megatron int32") && Contains("50.0%"));
}

TEST_CASE("sampler: weights set the blend, globs share by size", "[data]") {
  TempDir d("blend");
  write_raw(d / "a.bin", std::vector<uint16_t>(1000, 1));
  write_raw(d / "b.bin", std::vector<uint16_t>(1000, 2));
  // Glob of two files with 1000 and 3000 windows (seq_len 8): 1/4 and 3/4.
  write_raw(d / "g_0.bin", std::vector<uint16_t>(1008, 3));
  write_raw(d / "g_1.bin", std::vector<uint16_t>(3008, 4));
  BatchSampler s({"3 " + d / "a.bin", d / "b.bin", "4 " + d / "g_*.bin"}, "uint16", 8, 256, 11, "train");
  REQUIRE(s.entries().size() == 3);
  CHECK(s.entries()[0].share == Approx(3.0 / 8));
  CHECK(s.entries()[2].files.size() == 2);
  std::map<int, int> count;
  std::vector<int32_t> in(8), tg(8);
  const int n = 8000;
  for (int i = 0; i < n; ++i) {
    s.sequence(i % 37, i, in.data(), tg.data());
    ++count[in[0]];
  }
  CHECK(count[1] / double(n) == Approx(3.0 / 8).margin(0.02));
  CHECK(count[2] / double(n) == Approx(1.0 / 8).margin(0.02));
  CHECK(count[3] / double(n) == Approx(0.5 / 4).margin(0.02));
  CHECK(count[4] / double(n) == Approx(0.5 * 3 / 4).margin(0.02));

  // The brief's case: weights 3:1 over 4000 samples.
  BatchSampler s2({"3 " + d / "a.bin", "1 " + d / "b.bin"}, "uint16", 8, 256, 5, "train");
  int a = 0;
  for (int i = 0; i < 4000; ++i) {
    s2.sequence(0, i, in.data(), tg.data());
    a += in[0] == 1;
  }
  CHECK(a / 4000.0 == Approx(0.75).margin(0.03));
}

TEST_CASE("sampler: a pure function of (seed, split, step, index)", "[data]") {
  TempDir d("determinism");
  std::vector<uint16_t> a(5000), b(4000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = uint16_t(i % 250);
  for (size_t i = 0; i < b.size(); ++i) b[i] = uint16_t(250 + i % 6);
  write_raw(d / "a.bin", a);
  write_raw(d / "b.bin", b);
  const std::vector<std::string> entries{"2 " + d / "a.bin", d / "b.bin"};
  auto draw = [&](const BatchSampler& s, int64_t step, int64_t idx) {
    std::vector<int32_t> in(32), tg(32);
    s.sequence(step, idx, in.data(), tg.data());
    in.insert(in.end(), tg.begin(), tg.end());
    return in;
  };
  BatchSampler s1(entries, "uint16", 32, 256, 7, "train");
  BatchSampler s2(entries, "uint16", 32, 256, 7, "train");
  BatchSampler other_seed(entries, "uint16", 32, 256, 8, "train");
  BatchSampler valid(entries, "uint16", 32, 256, 7, "valid");
  int same_seed = 0, same_split = 0;
  // Interleaved and reversed call orders: no hidden state between calls.
  for (int64_t k = 0; k < 50; ++k) {
    const int64_t step = k * 13, idx = 49 - k;
    CHECK(draw(s1, step, idx) == draw(s2, step, idx));
    CHECK(draw(s1, step, idx) == draw(s1, step, idx));
    same_seed += draw(s1, step, idx) == draw(other_seed, step, idx);
    same_split += draw(s1, step, idx) == draw(valid, step, idx);
  }
  CHECK(same_seed < 5);
  CHECK(same_split < 5);
  CHECK(draw(s1, 3, 0) != draw(s1, 4, 0));
  CHECK(draw(s1, 3, 0) != draw(s1, 3, 1));
}

TEST_CASE("sampler: bad token ids and small datasets are named", "[data]") {
  TempDir d("badtok");
  // int64 Megatron tokens: one too large, one negative. The start-up scan
  // finds them when the sampler is built.
  write_megatron(d / "m", megatron_bytes({{1, 2, 3, 4}, {5, 300, 6, 7, 8, 9}}, 5));
  // Token index 5 sits in sequence 1 at offset 1: byte 4*8 + 1*8 = 40.
  CHECK_THAT(error_of([&] { BatchSampler({d / "m"}, "uint16", 9, 256, 1, "train"); }),
             Contains("data.train[0]") && Contains(d / "m.bin") && Contains("token 300") &&
                 Contains("token index 5") && Contains("byte offset 40") && Contains("model.vocab_size 256"));
  write_megatron(d / "neg", megatron_bytes({{1, 2, 3, -1, 5}}, 2));
  CHECK_THAT(error_of([&] { BatchSampler({d / "neg"}, "uint16", 4, 256, 1, "train"); }),
             Contains(d / "neg.bin") && Contains("token -1") && Contains("negative") && Contains("byte offset 3"));
  llmc_bytes({1, 2, 3, 999, 5}).write(d / "l.bin");
  CHECK_THAT(error_of([&] { BatchSampler({d / "l.bin"}, "uint16", 4, 256, 1, "train"); }),
             Contains(d / "l.bin") && Contains("token 999") && Contains("token index 3") &&
                 Contains("byte offset 1030"));
  // Without the scan, the window that holds the id fails when it is read,
  // with the same words.
  ScanOptions no_scan;
  no_scan.enabled = false;
  BatchSampler s({d / "m"}, "uint16", 9, 256, 1, "train", "auto", no_scan);
  std::vector<int32_t> in(9), tg(9);
  CHECK_THAT(error_of([&] { s.sequence(0, 0, in.data(), tg.data()); }),
             Contains(d / "m.bin") && Contains("token 300") && Contains("token index 5") &&
                 Contains("byte offset 40") && Contains("model.vocab_size 256"));

  CHECK_THAT(error_of([&] { BatchSampler({d / "m"}, "uint16", 10, 256, 1, "train"); }),
             Contains(d / "m") && Contains("fewer than one sequence") && Contains("data.train[0]"));
  CHECK_THAT(error_of([&] { BatchSampler({}, "uint16", 10, 256, 1, "valid"); }), Contains("data.valid"));
}

TEST_CASE("prefetch: same batches as direct sampling, in any order", "[data]") {
  TempDir d("prefetch");
  std::vector<uint16_t> a(20000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = uint16_t((i * 7) % 1000);
  write_raw(d / "a.bin", a);
  write_megatron(d / "m", megatron_bytes({{1, 2, 3, 4, 5, 6, 7, 8, 9}, {10, 11, 12, 13, 14, 15, 16, 17}}, 8));
  BatchSampler s({"3 " + d / "a.bin", d / "m"}, "uint16", 8, 1000, 42, "train");
  const int64_t M = 3, B = 2, T = 8;
  auto direct = [&](int64_t step) {
    HostBatch h;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t b = 0; b < B; ++b) {
        std::vector<int32_t> in(T), tg(T);
        s.sequence(step, m * B + b, in.data(), tg.data());  // what engine.cpp's load_micro_batch reads
        h.inputs.insert(h.inputs.end(), in.begin(), in.end());
        h.targets.insert(h.targets.end(), tg.begin(), tg.end());
      }
    return h;
  };
  BatchPrefetcher bg(s, M, B);
  BatchPrefetcher sync(s, M, B, {}, false);
  for (int64_t step : {0, 1, 2, 3, 4, 10, 11, 5, 5, 6}) {
    INFO("step " << step);
    const HostBatch want = direct(step);
    const HostBatch& got = bg.get(step);
    CHECK(got.step == step);
    CHECK(got.micro_steps == M);
    CHECK(got.micro_batch == B);
    CHECK(got.seq_len == T);
    CHECK(got.inputs == want.inputs);
    CHECK(got.targets == want.targets);
    CHECK(std::equal(got.inputs_of(2), got.inputs_of(2) + B * T, want.inputs.begin() + 2 * B * T));
    const HostBatch& got_sync = sync.get(step);
    CHECK(got_sync.inputs == want.inputs);
    CHECK(got_sync.targets == want.targets);
  }
  // Another rank's indices (here: every other sequence of a 2x larger batch).
  std::vector<int64_t> idx{1, 3, 5, 7, 9, 11};
  BatchPrefetcher rank1(s, M, B, idx);
  for (int64_t step = 0; step < 3; ++step) {
    const HostBatch& got = rank1.get(step);
    for (size_t i = 0; i < idx.size(); ++i) {
      std::vector<int32_t> in(T), tg(T);
      s.sequence(step, idx[i], in.data(), tg.data());
      CHECK(std::equal(in.begin(), in.end(), got.inputs.begin() + int64_t(i) * T));
      CHECK(std::equal(tg.begin(), tg.end(), got.targets.begin() + int64_t(i) * T));
    }
  }
  CHECK_THROWS_AS(BatchPrefetcher(s, M, B, {1, 2, 3}), std::invalid_argument);
  // Destroyed while a fill may be running: must join cleanly.
  { BatchPrefetcher quick(s, M, B); quick.get(100); }
}

TEST_CASE("prefetch: an error in the background fill reaches get()", "[data]") {
  TempDir d("prefetch_err");
  // One bad token in 10000: some steps hit it, most do not.
  std::vector<uint16_t> a(10000, 5);
  a[6000] = 999;
  write_raw(d / "a.bin", a);
  // The start-up scan would refuse the file: this checks the read-time path.
  ScanOptions no_scan;
  no_scan.enabled = false;
  BatchSampler s({d / "a.bin"}, "uint16", 16, 500, 9, "train", "auto", no_scan);
  const int64_t M = 2, B = 2;
  const std::vector<int64_t> idx = default_step_indices(M, B);
  auto fails = [&](int64_t step) {
    HostBatch h;
    return error_of([&] { fill_batch(s, idx, step, M, B, h); });
  };
  int64_t bad = -1;
  for (int64_t step = 1; step < 20000 && bad < 0; ++step)
    if (fails(step) != "<no error>" && fails(step - 1) == "<no error>") bad = step;
  REQUIRE(bad > 0);
  const std::string want = fails(bad);
  CHECK_THAT(want, Contains(d / "a.bin") && Contains("token 999") && Contains("token index 6000") &&
                       Contains("byte offset 12000"));

  BatchPrefetcher p(s, M, B);
  p.get(bad - 1);  // starts filling `bad` in the background
  CHECK(error_of([&] { p.get(bad); }) == want);
  // Asking again fails the same way (filled on the spot this time), and the
  // prefetcher still works for good steps afterwards.
  CHECK(error_of([&] { p.get(bad); }) == want);
  HostBatch h;
  fill_batch(s, idx, bad - 1, M, B, h);
  CHECK(p.get(bad - 1).inputs == h.inputs);

  // The synchronous path throws the same message.
  BatchPrefetcher sync(s, M, B, {}, false);
  CHECK(error_of([&] { sync.get(bad); }) == want);
}
