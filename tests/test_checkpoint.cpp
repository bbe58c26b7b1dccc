// Checkpoint layer: JSON, CRC32C, safetensors reader, save/load round trips,
// crash and corruption handling, retention, slice re-assembly, and saves by
// several ranks (threads sharing an in-process store).
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>

#include "tests/build_paths.h"
#include <cmath>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <iostream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checksum.h"
#include "checkpoint/fault_injection.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/strict_json.h"
#include "comm/store.h"

using namespace trainer;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// A fresh directory per test, removed afterwards.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("ckpt_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
  std::string operator/(const std::string& s) const { return (path / s).string(); }
};

// Collects what the code under test prints on std::cerr.
struct CaptureStderr {
  std::ostringstream buf;
  std::streambuf* old;
  CaptureStderr() : old(std::cerr.rdbuf(buf.rdbuf())) {}
  ~CaptureStderr() { std::cerr.rdbuf(old); }
  std::string text() const { return buf.str(); }
};

std::vector<char> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<char> v(n);
  for (auto& c : v) c = char(rng() & 0xFF);
  return v;
}

ShardTensor whole(const std::string& name, DType dt, std::vector<int64_t> shape, uint32_t seed) {
  ShardTensor t;
  t.name = name;
  t.dtype = dt;
  t.slice = SliceSpec::whole(shape);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  t.data = random_bytes(size_t(n) * dtype_size(dt), seed);
  return t;
}

// A snapshot whose bytes depend on `variant`, so checkpoints of different
// steps (or re-saves of one step) are distinguishable.
Snapshot make_snapshot(int64_t step, uint32_t variant = 0) {
  Snapshot s;
  s.meta.step = step;
  s.meta.tokens = step * 4096 + 7;
  s.meta.seed = 0xDEADBEEFCAFEBABEull;  // above INT64_MAX: must survive JSON exactly
  s.meta.optimizer_step = step;
  s.meta.world_size = 1;
  s.meta.layout = "tp1.pp1.dp1.cp1.ep1.zero0";
  s.meta.config_yaml = "model:\n  name: \"tiny\"  # quote \" backslash \\ tab\t\n  note: h\xC3\xA9llo\n";
  s.rank = 0;
  const uint32_t b = uint32_t(step) * 100 + variant * 7919;
  s.tensors.push_back(whole("model/embed", DType::F32, {16, 8}, b + 1));
  s.tensors.push_back(whole("model/layers.0.norm", DType::F32, {8}, b + 2));
  s.tensors.push_back(whole("model/layers.0.attn.wq", DType::BF16, {3, 5, 2}, b + 3));
  s.tensors.push_back(whole("optim/m/embed", DType::F32, {16, 8}, b + 4));
  s.tensors.push_back(whole("optim/v/embed", DType::F32, {16, 8}, b + 5));
  s.tensors.push_back(whole("optim/scale", DType::F64, {}, b + 6));
  s.tensors.push_back(whole("data/empty", DType::I32, {0, 4}, b + 7));
  return s;
}

void require_same(const LoadedCheckpoint& got, const Snapshot& want) {
  CHECK(got.meta.step == want.meta.step);
  CHECK(got.meta.tokens == want.meta.tokens);
  CHECK(got.meta.seed == want.meta.seed);
  CHECK(got.meta.optimizer_step == want.meta.optimizer_step);
  CHECK(got.meta.world_size == want.meta.world_size);
  CHECK(got.meta.layout == want.meta.layout);
  CHECK(got.meta.config_yaml == want.meta.config_yaml);
  REQUIRE(got.tensors.size() == want.tensors.size());
  for (size_t i = 0; i < want.tensors.size(); ++i) {
    const ShardTensor& a = got.tensors[i];
    const ShardTensor& b = want.tensors[i];
    INFO(b.name);
    CHECK(a.name == b.name);
    CHECK(a.dtype == b.dtype);
    CHECK(a.slice == b.slice);
    CHECK(a.data == b.data);  // bitwise
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

void flip_byte(const std::string& path, uint64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(std::streamoff(at));
  char c;
  f.read(&c, 1);
  c = char(c ^ 0x01);
  f.seekp(std::streamoff(at));
  f.write(&c, 1);
}

// Recomputes the manifest's own checksum after a deliberate edit, so a test
// reaches the checks behind it. Written from the format's description
// (checkpoint/manifest_checksum.h): the CRC32C of every byte before the 8
// digits of the last member "manifest_crc32c".
void reseal_manifest(const std::string& path) {
  std::string text = read_text(path);
  const std::string key = "\"manifest_crc32c\": \"";
  const size_t at = text.rfind(key);
  REQUIRE(at != std::string::npos);
  const size_t digits = at + key.size();
  text.replace(digits, 8, crc32c_hex(crc32c(text.data(), digits)));
  write_text(path, text);
}

std::set<std::string> entries(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

const std::string kRank0 = "rank_00000.safetensors";

}  // namespace

// ---------------------------------------------------------------------------
// JSON (nlohmann/json with duplicate keys refused and checked typed reads)

TEST_CASE("json: values round-trip exactly through dump and parse", "[checkpoint][json]") {
  json::Value v = json::Value::object();
  v["null"] = nullptr;
  v["t"] = true;
  v["zero"] = 0;
  v["int_min"] = INT64_MIN;
  v["int_max"] = INT64_MAX;
  v["uint_max"] = UINT64_MAX;
  v["text"] = std::string("quote\" backslash\\ slash/ \b\f\n\r\t ctrl\x01\x1f h\xC3\xA9 \xF0\x9F\x98\x80");
  v["empty_a"] = json::Value::array();
  v["empty_o"] = json::Value::object();
  v["nested"] = json::Value::array({1, "two", json::Value::array({3, json::Value::object({{"four", 4}})})});
  for (int indent : {-1, 0, 2}) {
    INFO("indent " << indent);
    const std::string text = json::dump(v, indent);
    const json::Value back = json::parse(text);
    CHECK(back == v);
    CHECK(json::dump(back, indent) == text);
  }
  const json::Value back = json::parse(json::dump(v));
  CHECK(json::as_int64(json::at(back, "int_min")) == INT64_MIN);
  CHECK(json::as_int64(json::at(back, "int_max")) == INT64_MAX);
  CHECK(json::as_uint64(json::at(back, "uint_max")) == UINT64_MAX);
  CHECK(json::as_uint64(json::at(v, "zero")) == 0);  // built, not parsed: a signed zero
  // Insertion order is kept.
  CHECK(back.begin().key() == "null");
  CHECK((--back.end()).key() == "nested");
  CHECK(json::parse(R"("\u00e9\ud83d\ude00\/")").get<std::string>() == "\xC3\xA9\xF0\x9F\x98\x80/");
  // Invalid UTF-8 is replaced, so the output always parses.
  const std::string bad_utf8 = json::dump(json::Value(std::string("a\xFF" "b")));
  CHECK(json::parse(bad_utf8).get<std::string>() == "a\xEF\xBF\xBD" "b");

  // Typed reads refuse what get<>() would convert silently.
  CHECK_THROWS_WITH(json::as_int64(json::parse("1.5")), Contains("fractional"));
  CHECK_THROWS_WITH(json::as_int64(json::parse("2.0")), Contains("expected an integer"));
  CHECK_THROWS_WITH(json::as_uint64(json::parse("-1")), Contains("non-negative"));
  CHECK_THROWS_WITH(json::as_int64(json::parse("18446744073709551615")), Contains("does not fit"));
  CHECK_THROWS_WITH(json::at(json::parse("{}"), "step"), Contains("missing key \"step\""));
  CHECK_THROWS_WITH(json::at(json::parse("[]"), "step"), Contains("expected an object, got array"));
  CHECK_THROWS_WITH(json::as_string(json::parse("[]")), Contains("expected a string, got array"));
  CHECK_THROWS_WITH(json::as_int64_list(json::parse("[1, \"2\"]")), Contains("expected an integer, got string"));
  CHECK(json::find(json::parse("{}"), "x") == nullptr);
}

TEST_CASE("json: malformed input and duplicate keys are refused", "[checkpoint][json]") {
  struct Case {
    std::string text, fragment;
    std::optional<size_t> offset;
  };
  const std::vector<Case> cases = {
      {"", "unexpected end of input", 0},
      {"{", "unexpected end of input", 1},
      {"[1,]", "unexpected ']'", 3},
      {"{\"a\":1,}", "expected string literal", 7},
      {"01", "expected end of input", 1},
      {"1.", "expected digit after '.'", 2},
      {"+1", "invalid literal", 0},
      {"\"abc", "missing closing quote", 4},
      {"\"a\x01\"", "control character", 2},
      {"NaN", "invalid literal", 0},
      {"[1 2]", "expected ']'", 3},
      {"{\"a\" 1}", "expected ':'", 5},
      {"{\"a\":1} x", "expected end of input", 8},
      {"{\"a\":1}//c", "expected end of input", 7},
      {"\"\\ud800\"", "surrogate", 7},
      {"\"\xFF\"", "ill-formed UTF-8", 1},
      {"\"\xC0\xAF\"", "ill-formed UTF-8", 1},  // overlong '/'
      {"1e400", "number overflow", std::nullopt},
      {std::string(300, '['), "nesting deeper than 256", std::nullopt},
      // nlohmann keeps the last of two equal keys; a manifest must not.
      {"{\"a\":1,\"a\":2}", "duplicate key \"a\"", std::nullopt},
      {R"({"t":[{"x":1},{"y":{"x":1,"x":2}}]})", "duplicate key \"x\" in t/1/y", std::nullopt},
  };
  for (const Case& c : cases) {
    INFO("input: " << c.text.substr(0, 40));
    try {
      json::parse(c.text);
      FAIL("parsed without error");
    } catch (const json::ParseError& e) {
      std::cout << "json error (expected): " << e.what() << "\n";
      CHECK_THAT(e.reason(), Contains(c.fragment));
      CHECK(e.offset() == c.offset);
      if (c.offset) CHECK_THAT(std::string(e.what()), Contains("at byte " + std::to_string(*c.offset)));
    }
  }
  // Equal keys in different objects are fine.
  CHECK(json::parse(R"([{"a":1},{"a":{"a":2}}])").size() == 2);
}

// ---------------------------------------------------------------------------
// CRC32C

TEST_CASE("crc32c: known vectors, chaining and files", "[checkpoint][crc]") {
  CHECK(crc32c("", 0) == 0u);
  CHECK(crc32c("123456789", 9) == 0xE3069283u);
  CHECK(crc32c_hex(0xE3069283u) == "e3069283");
  CHECK(crc32c_hex(0x0000ABCDu) == "0000abcd");
  // RFC 3720 (iSCSI) appendix B.4.
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) inc[size_t(i)] = (unsigned char)i, dec[size_t(i)] = (unsigned char)(31 - i);
  CHECK(crc32c(zeros.data(), 32) == 0x8A9136AAu);
  CHECK(crc32c(ones.data(), 32) == 0x62A8AB43u);
  CHECK(crc32c(inc.data(), 32) == 0x46DD794Eu);
  CHECK(crc32c(dec.data(), 32) == 0x113FDB5Cu);

  // Any split, including unaligned ones, gives the one-shot result.
  const std::vector<char> data = random_bytes(100003, 42);
  const uint32_t whole_crc = crc32c(data.data(), data.size());
  for (size_t split : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(4097), data.size() - 3, data.size()}) {
    const uint32_t c = crc32c(data.data() + split, data.size() - split, crc32c(data.data(), split));
    CHECK(c == whole_crc);
  }
  // The sliced fast path agrees with a bit-at-a-time definition.
  uint32_t ref = 0xFFFFFFFFu;
  for (char ch : data) {
    ref ^= (unsigned char)ch;
    for (int k = 0; k < 8; ++k) ref = (ref & 1) ? (ref >> 1) ^ 0x82F63B78u : ref >> 1;
  }
  CHECK(~ref == whole_crc);

  TempDir dir;
  const std::string p = dir / "blob";
  { std::ofstream(p, std::ios::binary).write(data.data(), std::streamsize(data.size())); }
  uint64_t bytes = 0;
  CHECK(crc32c_file(p, &bytes) == whole_crc);
  CHECK(bytes == data.size());
  CHECK_THROWS_WITH(crc32c_file(dir / "missing"), Contains(dir / "missing"));
}

// ---------------------------------------------------------------------------
// safetensors

TEST_CASE("safetensors: written files read back exactly", "[checkpoint][safetensors]") {
  TempDir dir;
  std::vector<float> a(6);
  for (int i = 0; i < 6; ++i) a[size_t(i)] = float(i) * 0.5f - 1.f;
  std::vector<int32_t> b = {7, -8, 9};
  const std::string p1 = dir / "plain.safetensors";
  write_safetensors(p1, {{"a", Tensor(a.data(), DType::F32, {2, 3})}, {"b", Tensor(b.data(), DType::I32, {3})}});
  auto got = read_safetensors(p1);
  REQUIRE(got.size() == 2);
  CHECK(got[0].name == "a");
  CHECK(got[0].dtype == DType::F32);
  CHECK(got[0].shape == std::vector<int64_t>{2, 3});
  CHECK(std::memcmp(got[0].data.data(), a.data(), 24) == 0);
  CHECK(got[1].name == "b");
  CHECK(got[1].dtype == DType::I32);
  CHECK(std::memcmp(got[1].data.data(), b.data(), 12) == 0);
  // Data starts 8-byte aligned.
  const std::string raw = read_text(p1);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= uint64_t((unsigned char)raw[size_t(i)]) << (8 * i);
  CHECK((8 + hlen) % 8 == 0);

  // The synced writer: any rank, odd names, empty and scalar tensors.
  const std::vector<char> x = random_bytes(2 * 3 * 4 * 5 * 2, 1), s = random_bytes(8, 2);
  const std::string p2 = dir / "views.safetensors";
  const WrittenFile w = write_safetensors_synced(
      p2, {{"five/\"dims\"", DType::BF16, {2, 3, 4, 5, 1}, x.data()},
           {"scalar", DType::F64, {}, s.data()},
           {"empty", DType::U16, {0}, nullptr}});
  CHECK(w.bytes == fs::file_size(p2));
  CHECK(w.crc32c == crc32c_file(p2));
  got = read_safetensors(p2);
  REQUIRE(got.size() == 3);
  CHECK(got[0].name == "five/\"dims\"");
  CHECK(got[0].shape == std::vector<int64_t>{2, 3, 4, 5, 1});
  CHECK(got[0].data == x);
  CHECK(got[1].shape.empty());
  CHECK(got[1].data == s);
  CHECK(got[2].data.empty());
  CHECK(dtype_from_name("BF16") == DType::BF16);
  CHECK(!dtype_from_name("I8"));
}

TEST_CASE("safetensors: corrupt files are refused with the file and the problem", "[checkpoint][safetensors]") {
  TempDir dir;
  // Header text padded like the writer, then `data_bytes` bytes.
  auto craft = [&](const std::string& name, std::string header, size_t data_bytes, int64_t fake_len = -1) {
    const std::string p = dir / name;
    std::string out(8, '\0');
    const uint64_t n = fake_len >= 0 ? uint64_t(fake_len) : header.size();
    for (int i = 0; i < 8; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xFF);
    out += header;
    out += std::string(data_bytes, 'x');
    write_text(p, out);
    return p;
  };
  struct Case {
    std::string file, header;
    size_t data;
    int64_t fake_len;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {"short", "", 0, -2, "too short"},
      {"len_past_end", "{}", 0, 1000, "header length 1000 exceeds"},
      {"len_huge", "{}", 0, int64_t(1) << 60, "exceeds"},
      {"not_json", "{\"a\":{\"dtype\":\"F32\",", 0, -1, "header is not valid JSON"},
      {"not_object", "[1,2]", 0, -1, "not an object"},
      {"unknown_dtype", R"({"a":{"dtype":"Q8","shape":[1],"data_offsets":[0,1]}})", 1, -1, "unknown dtype \"Q8\""},
      {"missing_key", R"({"a":{"dtype":"F32","shape":[1]}})", 4, -1, "missing key \"data_offsets\""},
      {"extra_key", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4, -1, "unexpected key"},
      {"negative_dim", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, -1, "negative dimension"},
      {"past_end", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 12, -1, "run past the end"},
      {"backwards", R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", 4, -1, "run backwards"},
      {"size", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, -1, "needs 12"},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12, -1, "overlaps tensor \"a\""},
      {"gap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
       20, -1, "gap of 4 bytes"},
      {"trailing", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12, -1, "4 bytes after the last"},
      {"overflow", R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", 0, -1, "overflows"},
  };
  for (const Case& c : cases) {
    INFO(c.file);
    std::string p;
    if (c.fake_len == -2) {
      p = dir / c.file;
      write_text(p, "abc");
    } else {
      p = craft(c.file, c.header, c.data, c.fake_len);
    }
    CHECK_THROWS_WITH(read_safetensors(p), Contains(p) && Contains(c.fragment));
  }
  // The JSON error offset is given in file bytes.
  const std::string bad = craft("bad_json_offset", "{\"a\" 1}", 0);
  CHECK_THROWS_WITH(read_safetensors(bad), Contains("at byte 13 of the file"));

  // A real file cut short.
  std::vector<float> v(100, 1.f);
  const std::string p = dir / "truncated.safetensors";
  write_safetensors(p, {{"v", Tensor(v.data(), DType::F32, {100})}});
  fs::resize_file(p, fs::file_size(p) - 10);
  CHECK_THROWS_WITH(read_safetensors(p), Contains(p) && Contains("run past the end"));
  fs::resize_file(p, 20);
  CHECK_THROWS_WITH(read_safetensors(p), Contains(p) && Contains("exceeds"));
  CHECK_THROWS_WITH(read_safetensors(dir / "nope"), Contains(dir / "nope") && Contains("cannot open"));
}

// ---------------------------------------------------------------------------
// Save and load

TEST_CASE("checkpoint: sync and async saves load back bitwise identical", "[checkpoint]") {
  TempDir root;
  CHECK(checkpoint_dir_name(1000) == "step_00001000");
  CHECK(checkpoint_dir_name(123456789) == "step_123456789");

  for (bool async : {false, true}) {
    INFO("async " << async);
    TempDir dir;
    CheckpointWriter w(dir.str(), 0, async);
    CHECK(w.last_completed().empty());
    const Snapshot s1 = make_snapshot(10), s2 = make_snapshot(20);
    w.save(s1);
    w.save(s2);  // waits for the first
    w.wait();
    CHECK(!w.busy());
    CHECK(w.last_completed() == dir / "step_00000020");
    CHECK(read_text(dir / "latest") == "step_00000020\n");
    CHECK(!fs::exists(dir / "latest.tmp"));
    CHECK(entries(dir.path) == std::set<std::string>{"latest", "step_00000010", "step_00000020"});
    CHECK(entries(dir.path / "step_00000020") == std::set<std::string>{"manifest.json", kRank0});

    require_same(load_checkpoint(dir / "step_00000010"), s1);
    require_same(load_checkpoint(dir / "step_00000020/"), s2);
    auto r = resolve_resume(dir.str(), "auto");
    REQUIRE(r);
    CHECK(r->dir == dir / "step_00000020");
    require_same(*r, s2);
  }
}

TEST_CASE("checkpoint: manifest records everything needed to resume and verify", "[checkpoint]") {
  TempDir dir;
  Snapshot s = make_snapshot(5);
  CheckpointWriter(dir.str(), 3, false).save(s);
  const std::string step_dir = dir / "step_00000005";
  const json::Value m = json::parse(read_text(step_dir + "/manifest.json"));
  CHECK(m.at("format_version").get<int64_t>() == 3);
  CHECK(m.at("step").get<int64_t>() == 5);
  CHECK(m.at("tokens").get<int64_t>() == 5 * 4096 + 7);
  CHECK(m.at("seed").get<uint64_t>() == 0xDEADBEEFCAFEBABEull);
  CHECK(m.at("optimizer_step").get<int64_t>() == 5);
  CHECK(m.at("world_size").get<int64_t>() == 1);
  CHECK(m.at("layout").get<std::string>() == "tp1.pp1.dp1.cp1.ep1.zero0");
  CHECK(m.at("config_yaml").get<std::string>() == s.meta.config_yaml);
  CHECK(m.at("created").get<std::string>().size() == 20);  // 2024-01-02T03:04:05Z
  CHECK(m.at("manifest_crc32c").get<std::string>().size() == 8);  // the manifest's own checksum, last

  const json::Value& f = m.at("files").at(kRank0);
  CHECK(f.at("bytes").get<uint64_t>() == fs::file_size(step_dir + "/" + kRank0));
  CHECK(f.at("crc32c").get<std::string>() == crc32c_hex(crc32c_file(step_dir + "/" + kRank0)));

  const auto& tensors = m.at("tensors");
  REQUIRE(tensors.size() == s.tensors.size());
  const json::Value& wq = tensors[2];
  CHECK(wq.at("name").get<std::string>() == "model/layers.0.attn.wq");
  CHECK(wq.at("dtype").get<std::string>() == "BF16");
  CHECK(json::dump(wq.at("global_shape")) == "[3,5,2]");
  const auto& pieces = wq.at("pieces");
  REQUIRE(pieces.size() == 1);
  CHECK(pieces[0].at("rank").get<int64_t>() == 0);
  CHECK(pieces[0].at("file").get<std::string>() == kRank0);
  CHECK(json::dump(pieces[0].at("box_offset")) == "[0,0,0]");
  CHECK(json::dump(pieces[0].at("box_shape")) == "[3,5,2]");
  CHECK(!pieces[0].contains("flat_range"));  // the whole box

  // The rank file is plain safetensors with the tensor names as given.
  const auto st = read_safetensors(step_dir + "/" + kRank0);
  REQUIRE(st.size() == s.tensors.size());
  for (size_t i = 0; i < st.size(); ++i) CHECK(st[i].name == s.tensors[i].name);

  const std::string text = describe_checkpoint(step_dir);
  CHECK_THAT(text, Contains("step 5, tokens 20487"));
  CHECK_THAT(text, Contains("layout tp1.pp1.dp1.cp1.ep1.zero0, world size 1"));
  CHECK_THAT(text, Contains(kRank0));
  CHECK_THAT(text, Contains("model/layers.0.attn.wq"));
  CHECK_THAT(text, Contains("[3, 5, 2]"));
  CHECK_THAT(text, Contains("rank 0 whole"));
  CHECK_THAT(text, Contains("every file matches the manifest"));
  CHECK_THAT(text, Contains("manifest checksum crc32c " + m.at("manifest_crc32c").get<std::string>() + " ok"));
}

TEST_CASE("checkpoint: the node count round-trips and one outside the world is refused", "[checkpoint]") {
  TempDir dir;
  CheckpointWriter w(dir.str(), 0, false);
  Snapshot s = make_snapshot(3);
  w.save(s);  // nodes 0: not recorded
  s = make_snapshot(4);
  s.meta.nodes = 1;
  w.save(s);
  w.wait();
  CHECK(read_text(dir / "step_00000003/manifest.json").find("\"nodes\"") == std::string::npos);
  CHECK(read_checkpoint_meta(dir / "step_00000003").nodes == 0);
  CHECK(read_checkpoint_meta(dir / "step_00000004").nodes == 1);
  // More nodes than ranks is no manifest a run writes.
  std::string text = read_text(dir / "step_00000004/manifest.json");
  text.replace(text.find("\"nodes\": 1"), 10, "\"nodes\": 2");
  write_text(dir / "step_00000004/manifest.json", text);
  reseal_manifest(dir / "step_00000004/manifest.json");
  CHECK_THROWS_WITH(load_checkpoint(dir / "step_00000004"), Contains("nodes 2 is outside 1..world_size"));
}

TEST_CASE("checkpoint: async save returns before the write completes", "[checkpoint]") {
  TempDir dir;
  Snapshot s = make_snapshot(1);
  ShardTensor big;
  big.name = "model/big";
  big.slice = SliceSpec::whole({4096, 4096});
  big.data.assign(size_t(4096) * 4096 * 4, 0);  // 64 MiB: write, CRC and fsync take far longer than save()
  big.data[12345] = 7;
  s.tensors.push_back(std::move(big));
  const Snapshot copy = s;

  CheckpointWriter w(dir.str(), 0, true);
  w.save(std::move(s));
  CHECK(w.busy());
  CHECK(!fs::exists(dir / "step_00000001"));
  w.wait();
  CHECK(!w.busy());
  CHECK(w.last_completed() == dir / "step_00000001");
  require_same(load_checkpoint(dir / "step_00000001"), copy);
}

TEST_CASE("checkpoint: keep_last keeps exactly the newest K", "[checkpoint]") {
  TempDir dir;
  {
    CheckpointWriter w(dir.str(), 2, true);
    for (int step = 1; step <= 5; ++step) w.save(make_snapshot(step));
  }  // the destructor waits
  CHECK(entries(dir.path) == std::set<std::string>{"latest", "step_00000004", "step_00000005"});

  TempDir all;
  CheckpointWriter w(all.str(), 0, false);
  for (int step = 1; step <= 4; ++step) w.save(make_snapshot(step));
  CHECK(entries(all.path).size() == 5);

  // Saving an older step (a resume from further back) never deletes itself.
  TempDir back;
  CheckpointWriter wb(back.str(), 1, false);
  wb.save(make_snapshot(9));
  wb.save(make_snapshot(3));
  CHECK(entries(back.path) == std::set<std::string>{"latest", "step_00000003"});
  CHECK(read_text(back / "latest") == "step_00000003\n");
}

TEST_CASE("checkpoint: crashed saves and incomplete directories are never resumed", "[checkpoint]") {
  TempDir dir;
  CheckpointWriter w(dir.str(), 0, false);
  const Snapshot s2 = make_snapshot(2);
  w.save(make_snapshot(1));
  w.save(s2);

  // A crash mid-save leaves step_3.partial (here even with a manifest), and a
  // directory whose manifest never made it.
  fs::copy(dir / "step_00000002", dir / "step_00000003.partial");
  fs::create_directory(dir / "step_00000004");
  fs::copy(dir / ("step_00000002/" + kRank0), dir / ("step_00000004/" + kRank0));
  write_text(dir / "latest", "step_00000004\n");  // even if `latest` names it

  CHECK_THROWS_WITH(load_checkpoint(dir / "step_00000004"),
                    Contains("incomplete or corrupt checkpoint") && Contains("manifest.json is missing"));
  {
    CaptureStderr err;
    auto r = resolve_resume(dir.str(), "auto");
    REQUIRE(r);
    CHECK(r->dir == dir / "step_00000002");
    require_same(*r, s2);
    CHECK_THAT(err.text(), Contains("checkpoint: skipping " + (dir / "step_00000004") + ": "));
    CHECK_THAT(err.text(), Contains("incomplete or corrupt checkpoint"));
    CHECK_THAT(err.text(), !Contains(".partial"));
  }
  CHECK_THROWS_WITH(resolve_resume("", dir / "step_00000003.partial"), Contains("unfinished"));

  // An unparsable manifest is as bad as a missing one.
  fs::copy(dir / "step_00000002", dir / "step_00000007", fs::copy_options::recursive);
  write_text(dir / "step_00000007/manifest.json", "{\"format\": \"trainer-checkpoint\", \"step\": 7,");
  CHECK_THROWS_WITH(load_checkpoint(dir / "step_00000007"),
                    Contains("step_00000007/manifest.json") && Contains("incomplete or corrupt checkpoint") &&
                        Contains("not valid JSON"));
  // So is a manifest that lost a key, or whose step disagrees with its
  // directory. The edit breaks the manifest's checksum first; resealed, the
  // parser's own checks still refuse it.
  fs::copy(dir / "step_00000002", dir / "step_00000008", fs::copy_options::recursive);
  {
    std::string text = read_text(dir / "step_00000008/manifest.json");
    text.replace(text.find("\"tokens\""), 8, "\"tokenz\"");
    write_text(dir / "step_00000008/manifest.json", text);
  }
  CHECK_THROWS_WITH(load_checkpoint(dir / "step_00000008"),
                    Contains("step_00000008/manifest.json") && Contains("manifest checksum mismatch"));
  reseal_manifest(dir / "step_00000008/manifest.json");
  CHECK_THROWS_WITH(load_checkpoint(dir / "step_00000008"), Contains("missing key \"tokens\""));
  fs::copy(dir / "step_00000002", dir / "step_00000009", fs::copy_options::recursive);
  CHECK_THROWS_WITH(load_checkpoint(dir / "step_00000009"), Contains("records step 2"));
  // A key given twice is refused, not read as the last value (the JSON
  // library's default), and the error names the key and the file.
  fs::copy(dir / "step_00000002", dir / "step_00000011", fs::copy_options::recursive);
  {
    std::string text = read_text(dir / "step_00000011/manifest.json");
    text.replace(text.find("\"step\": 2,"), 10, "\"step\": 11, \"step\": 2,");
    write_text(dir / "step_00000011/manifest.json", text);
    CHECK_THROWS_WITH(load_checkpoint(dir / "step_00000011"), Contains("manifest checksum mismatch"));
    reseal_manifest(dir / "step_00000011/manifest.json");
    try {
      load_checkpoint(dir / "step_00000011");
      FAIL("a manifest with a duplicate key loaded");
    } catch (const std::exception& e) {
      std::cout << "duplicate key (expected): " << e.what() << "\n";
      CHECK_THAT(std::string(e.what()), Contains("step_00000011/manifest.json") && Contains("not valid JSON") &&
                                            Contains("duplicate key \"step\""));
    }
  }
  {
    CaptureStderr err;
    auto r = resolve_resume(dir.str(), "auto");
    REQUIRE(r);
    CHECK(r->meta.step == 2);
    CHECK_THAT(err.text(), Contains("skipping " + (dir / "step_00000011")));
    CHECK_THAT(err.text(), Contains("skipping " + (dir / "step_00000009")));
    CHECK_THAT(err.text(), Contains("skipping " + (dir / "step_00000008")));
    CHECK_THAT(err.text(), Contains("skipping " + (dir / "step_00000007")));
  }

  // The next save clears the stale .partial; the manifest-less directory is left for a human.
  w.save(make_snapshot(10));
  CHECK(!fs::exists(dir / "step_00000003.partial"));
  CHECK(fs::exists(dir / "step_00000004"));
}

TEST_CASE("checkpoint: corrupt or truncated files are refused and resume falls back", "[checkpoint]") {
  TempDir dir;
  CheckpointWriter w(dir.str(), 0, false);
  const Snapshot s1 = make_snapshot(1), s2 = make_snapshot(2);
  w.save(s1);
  w.save(s2);
  w.save(make_snapshot(3));

  const std::string f3 = dir / ("step_00000003/" + kRank0);
  flip_byte(f3, fs::file_size(f3) - 100);
  CHECK_THROWS_WITH(load_checkpoint(dir / "step_00000003"),
                    Contains(f3) && Contains("CRC32C mismatch") && Contains("manifest says"));
  const std::string desc = describe_checkpoint(dir / "step_00000003");
  CHECK_THAT(desc, Contains("CRC32C mismatch"));
  CHECK_THAT(desc, Contains("CORRUPT"));
  {
    CaptureStderr err;
    auto r = resolve_resume(dir.str(), "auto");  // `latest` names step 3
    REQUIRE(r);
    require_same(*r, s2);
    CHECK_THAT(err.text(), Contains("checkpoint: skipping " + (dir / "step_00000003")) && Contains(f3));
  }
  // An explicit path must load or fail.
  CHECK_THROWS_WITH(resolve_resume("", dir / "step_00000003"), Contains("CRC32C mismatch"));
  CHECK_THROWS_WITH(resolve_resume("unused", dir.str()), Contains("CRC32C mismatch"));  // root -> `latest`

  const std::string f2 = dir / ("step_00000002/" + kRank0);
  fs::resize_file(f2, fs::file_size(f2) - 1);
  CHECK_THROWS_WITH(load_checkpoint(dir / "step_00000002"), Contains(f2) && Contains("truncated"));
  {
    CaptureStderr err;
    auto r = resolve_resume(dir.str(), "auto");
    REQUIRE(r);
    require_same(*r, s1);
  }
  // A missing rank file.
  fs::remove(dir / ("step_00000001/" + kRank0));
  CHECK_THROWS_WITH(load_checkpoint(dir / "step_00000001"), Contains("missing"));
  {
    // Checkpoints exist, none loads: never an implicit fresh start; the error
    // names each one and why.
    CaptureStderr err;
    CHECK_THROWS_WITH(resolve_resume(dir.str(), "auto"),
                      Contains("3 checkpoint(s) under " + dir.str() + ", none loadable") &&
                          Contains(dir / "step_00000003") && Contains("CRC32C mismatch") &&
                          Contains(dir / "step_00000002") && Contains("truncated") &&
                          Contains(dir / "step_00000001") && Contains("missing") &&
                          Contains("checkpoint.resume=none"));
  }
}

TEST_CASE("checkpoint: resume modes", "[checkpoint]") {
  TempDir dir;
  CHECK(!resolve_resume(dir / "does/not/exist", "auto"));
  CHECK(!resolve_resume(dir.str(), "auto"));  // empty root
  CHECK(!resolve_resume(dir.str(), "none"));
  CHECK_THROWS_WITH(resolve_resume(dir.str(), dir / "nowhere"), Contains("checkpoint.resume: ") && Contains("does not exist"));
  CHECK_THROWS_WITH(resolve_resume(dir.str(), dir.str()), Contains("neither a checkpoint directory"));
  // Other commands name their own flag, never a key the user did not set.
  CHECK_THROWS_WITH(checkpoint_directory((dir / "nowhere"), "--checkpoint"),
                    Contains("--checkpoint: " + (dir / "nowhere") + " does not exist"));
  {
    std::string out;
    const std::string cmd = std::string(TRAINER_BIN) + " export --checkpoint " + (dir / "nowhere") + " --out " +
                            (dir / "hf") + " 2>&1";
    FILE* pipe = ::popen(cmd.c_str(), "r");
    REQUIRE(pipe);
    char buf[512];
    while (std::fgets(buf, sizeof buf, pipe)) out += buf;
    const int status = ::pclose(pipe);
    INFO(out);
    CHECK(WEXITSTATUS(status) == 1);
    CHECK(out.find("error: --checkpoint: " + (dir / "nowhere") + " does not exist") != std::string::npos);
    CHECK(out.find("checkpoint.resume") == std::string::npos);
    CHECK(!fs::exists(dir / "hf"));
  }

  CheckpointWriter w(dir.str(), 0, false);
  const Snapshot s4 = make_snapshot(4), s9 = make_snapshot(9);
  w.save(s9);
  w.save(s4);  // `latest` says step 4 although step 9 exists (a kill between publishing 9 and `latest`)
  CHECK(!resolve_resume(dir.str(), "none"));
  CHECK(latest_step(dir.str()) == 4);
  require_same(*resolve_resume(dir.str(), "auto"), s9);  // the newest complete one, never the older `latest`
  require_same(*resolve_resume("ignored", dir / "step_00000009"), s9);
  require_same(*resolve_resume("ignored", dir.str() + "/"), s4);  // a root given as a path: follows `latest`

  // A run that resumed from step 4 sets the newer timeline aside: kept, never loaded or pruned.
  CHECK(set_aside_newer(dir.str(), 4) == std::vector<std::string>{(dir / "step_00000009.superseded")});
  require_same(*resolve_resume(dir.str(), "auto"), s4);
  w.save(s9);
  CHECK(set_aside_newer(dir.str(), 4) == std::vector<std::string>{(dir / "step_00000009.superseded-2")});
  CHECK(step_directories(dir.str()).size() == 1);
  fs::rename(dir / "step_00000009.superseded", dir / "step_00000009");
  fs::remove_all(dir / "step_00000009.superseded-2");
  write_text(dir / "latest", "step_00000009\n");

  // `latest` is only a hint: garbage or a missing target falls back to the newest step.
  write_text(dir / "latest", "../../etc\n");
  require_same(*resolve_resume(dir.str(), "auto"), s9);
  CHECK_THROWS_WITH(resolve_resume("", dir.str()), Contains("does not name a step directory"));
  fs::remove(dir / "latest");
  require_same(*resolve_resume(dir.str(), "auto"), s9);

  // A regular file where the root should be.
  write_text(dir / "file", "x");
  CHECK_THROWS_WITH(resolve_resume(dir / "file", "auto"), Contains("not a directory"));
}

TEST_CASE("checkpoint: a failed save leaves latest and existing checkpoints untouched", "[checkpoint]") {
  for (const std::string stage : {"rank_file", "manifest", "publish", "latest"}) {
    for (bool async : {false, true}) {
      INFO("stage " << stage << ", async " << async);
      TempDir dir;
      CheckpointWriter w(dir.str(), 1, async);
      const Snapshot s1 = make_snapshot(1);
      w.save(s1);
      w.wait();
      checkpoint_fail_next_save_at(stage);
      const Snapshot s2 = make_snapshot(2);
      if (async) {
        w.save(s2);  // the error surfaces on wait()
        CHECK_THROWS_WITH(w.wait(), Contains("injected failure at stage '" + stage + "'"));
        w.wait();  // reported once
      } else {
        CHECK_THROWS_WITH(w.save(make_snapshot(2)), Contains("injected failure"));
      }
      CHECK(read_text(dir / "latest") == "step_00000001\n");
      CHECK(!fs::exists(dir / "step_00000002.partial"));
      // Only a failure after the rename can leave step 2, and then it is complete.
      CHECK(fs::exists(dir / "step_00000002") == (stage == "latest"));
      require_same(load_checkpoint(dir / "step_00000001"), s1);
      {
        // A failure at `latest` left step 2 complete: resume takes the newest.
        CaptureStderr err;
        require_same(*resolve_resume(dir.str(), "auto"), stage == "latest" ? s2 : s1);
      }
      // The writer keeps working.
      w.save(make_snapshot(3));
      w.wait();
      CHECK(read_text(dir / "latest") == "step_00000003\n");
      CHECK(entries(dir.path) == std::set<std::string>{"latest", "step_00000003"});
    }
  }
}

TEST_CASE("checkpoint: re-saving an existing step replaces it only when complete", "[checkpoint]") {
  TempDir dir;
  CheckpointWriter w(dir.str(), 0, false);
  const Snapshot a = make_snapshot(6, 0), b = make_snapshot(6, 1);
  REQUIRE(a.tensors[0].data != b.tensors[0].data);
  w.save(a);
  checkpoint_fail_next_save_at("publish");  // after the old one was moved aside
  CHECK_THROWS(w.save(b));
  require_same(load_checkpoint(dir / "step_00000006"), a);
  CHECK(entries(dir.path) == std::set<std::string>{"latest", "step_00000006"});

  w.save(b);
  require_same(load_checkpoint(dir / "step_00000006"), b);
  CHECK(entries(dir.path) == std::set<std::string>{"latest", "step_00000006"});
}

TEST_CASE("checkpoint: background errors are rethrown by the next save or wait", "[checkpoint]") {
  TempDir dir;
  const std::string not_a_dir = dir / "plain_file";
  write_text(not_a_dir, "x");
  CheckpointWriter w(not_a_dir, 0, true);
  w.save(make_snapshot(1));  // returns; the failure happens on the writer thread
  CHECK_THROWS_WITH(w.save(make_snapshot(2)), Contains(not_a_dir));
  w.wait();  // nothing left to report

  // A bad snapshot is reported the same way, naming the tensor.
  TempDir ok;
  CheckpointWriter w2(ok.str(), 0, true);
  Snapshot bad = make_snapshot(1);
  bad.tensors[1].data.pop_back();
  w2.save(bad);
  CHECK_THROWS_WITH(w2.wait(), Contains("model/layers.0.norm") && Contains("bytes"));
  CHECK(!fs::exists(ok / "latest"));
  CHECK(entries(ok.path).empty());

  CheckpointWriter w3(ok.str(), 0, false);
  Snapshot dup = make_snapshot(1);
  dup.tensors.push_back(dup.tensors[0]);
  CHECK_THROWS_WITH(w3.save(dup), Contains("appears twice"));
  Snapshot outside = make_snapshot(1);
  outside.tensors[0].slice.box_offset = {1, 0};
  CHECK_THROWS_WITH(w3.save(outside), Contains("does not fit"));
}

// ---------------------------------------------------------------------------
// Re-slicing

TEST_CASE("copy_overlap: four 2-D quarters assemble the full tensor", "[checkpoint][reslice]") {
  const int64_t R = 6, C = 10;
  std::vector<float> full(size_t(R * C));
  for (int64_t i = 0; i < R * C; ++i) full[size_t(i)] = float(i) + 0.25f;
  auto quarter = [&](int64_t r0, int64_t c0) {
    ShardTensor t;
    t.name = "w";
    t.slice = SliceSpec::box({R, C}, {r0, c0}, {R / 2, C / 2});
    for (int64_t r = r0; r < r0 + R / 2; ++r)
      for (int64_t c = c0; c < c0 + C / 2; ++c) {
        const char* p = reinterpret_cast<const char*>(&full[size_t(r * C + c)]);
        t.data.insert(t.data.end(), p, p + 4);
      }
    return t;
  };
  std::vector<float> out(size_t(R * C), -1.f);
  int64_t copied = 0;
  for (int64_t r0 : {int64_t(0), R / 2})
    for (int64_t c0 : {int64_t(0), C / 2}) copied += copy_overlap(quarter(r0, c0), SliceSpec::whole({R, C}), out.data());
  CHECK(copied == R * C);
  CHECK(out == full);

  // And back: a centred 4x6 window drawn from all four quarters.
  std::vector<float> win(24, -1.f);
  copied = 0;
  for (int64_t r0 : {int64_t(0), R / 2})
    for (int64_t c0 : {int64_t(0), C / 2}) copied += copy_overlap(quarter(r0, c0), SliceSpec::box({R, C}, {1, 2}, {4, 6}), win.data());
  CHECK(copied == 24);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < 6; ++c) CHECK(win[size_t(r * 6 + c)] == full[size_t((r + 1) * C + c + 2)]);

  // No overlap copies nothing and touches nothing.
  std::vector<float> none(4, -1.f);
  CHECK(copy_overlap(quarter(0, 0), SliceSpec::box({R, C}, {3, 5}, {2, 2}), none.data()) == 0);
  CHECK(none == std::vector<float>(4, -1.f));
}

TEST_CASE("copy_overlap: 1-D resplit from 2 pieces to 3", "[checkpoint][reslice]") {
  std::vector<int32_t> global(12);
  for (int i = 0; i < 12; ++i) global[size_t(i)] = 100 + i;
  std::vector<ShardTensor> saved;
  for (int64_t off : {0, 6}) {
    ShardTensor t;
    t.name = "b";
    t.dtype = DType::I32;
    t.slice = SliceSpec::box({12}, {off}, {6});
    const char* p = reinterpret_cast<const char*>(global.data() + off);
    t.data.assign(p, p + 24);
    saved.push_back(t);
  }
  const int64_t expect_from[3][2] = {{4, 0}, {2, 2}, {0, 4}};
  for (int64_t piece = 0; piece < 3; ++piece) {
    std::vector<int32_t> out(4, -1);
    for (int k = 0; k < 2; ++k)
      CHECK(copy_overlap(saved[size_t(k)], SliceSpec::box({12}, {piece * 4}, {4}), out.data()) == expect_from[piece][k]);
    CHECK(out == std::vector<int32_t>(global.begin() + piece * 4, global.begin() + piece * 4 + 4));
  }
}

TEST_CASE("copy_overlap: random boxes in 0 to 4 dimensions match a naive copy", "[checkpoint][reslice]") {
  std::mt19937 rng(7);
  auto uni = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  for (int trial = 0; trial < 300; ++trial) {
    const size_t nd = size_t(trial % 5);
    const DType dt = trial % 3 == 0 ? DType::BF16 : (trial % 3 == 1 ? DType::F32 : DType::F64);
    const size_t es = dtype_size(dt);
    std::vector<int64_t> g(nd), so(nd), ss(nd), dof(nd), ds(nd);
    for (size_t d = 0; d < nd; ++d) {
      g[d] = uni(1, 6);
      so[d] = uni(0, g[d] - 1);
      ss[d] = uni(1, g[d] - so[d]);
      dof[d] = uni(0, g[d] - 1);
      ds[d] = uni(1, g[d] - dof[d]);
    }
    // Element value = its global flat index, written in es bytes.
    auto global_index = [&](const std::vector<int64_t>& idx) {
      int64_t f = 0;
      for (size_t d = 0; d < nd; ++d) f = f * g[d] + idx[d];
      return f;
    };
    auto for_each = [&](const std::vector<int64_t>& shape, auto&& fn) {
      std::vector<int64_t> idx(nd, 0);
      int64_t n = 1;
      for (int64_t s : shape) n *= s;
      for (int64_t k = 0; k < n; ++k) {
        int64_t rem = k;
        for (size_t d = nd; d-- > 0;) idx[d] = rem % shape[d], rem /= shape[d];
        fn(idx, k);
      }
    };
    ShardTensor src;
    src.name = "r";
    src.dtype = dt;
    src.slice = SliceSpec::box(g, so, ss);
    int64_t sn = 1, dn = 1;
    for (size_t d = 0; d < nd; ++d) sn *= ss[d], dn *= ds[d];
    src.data.assign(size_t(sn) * es, 0);
    for_each(ss, [&](const std::vector<int64_t>& idx, int64_t k) {
      std::vector<int64_t> gi(nd);
      for (size_t d = 0; d < nd; ++d) gi[d] = idx[d] + so[d];
      const int64_t v = global_index(gi) + 1;
      std::memcpy(src.data.data() + k * int64_t(es), &v, es);  // low bytes, little-endian
    });
    std::vector<char> got(size_t(dn) * es, 0), want(size_t(dn) * es, 0);
    int64_t expect = 0;
    for_each(ds, [&](const std::vector<int64_t>& idx, int64_t k) {
      std::vector<int64_t> gi(nd);
      bool inside = true;
      for (size_t d = 0; d < nd; ++d) {
        gi[d] = idx[d] + dof[d];
        inside = inside && gi[d] >= so[d] && gi[d] < so[d] + ss[d];
      }
      if (!inside) return;
      const int64_t v = global_index(gi) + 1;
      std::memcpy(want.data() + k * int64_t(es), &v, es);
      ++expect;
    });
    INFO("trial " << trial << " dims " << nd);
    CHECK(copy_overlap(src, SliceSpec::box(g, dof, ds), got.data()) == expect);
    CHECK(got == want);
  }

  ShardTensor bad;
  bad.name = "bad";
  bad.slice = SliceSpec::whole({4});
  bad.data.resize(3);
  float sink[4];
  CHECK_THROWS_WITH(copy_overlap(bad, SliceSpec::whole({4}), sink), Contains("bad"));
  bad.data.resize(16);
  CHECK_THROWS_WITH(copy_overlap(bad, SliceSpec::box({4}, {0, 0}, {4, 1}), sink), Contains("dimensions"));
}

// ---------------------------------------------------------------------------
// Several ranks: one thread per rank, each with its own writer and store client.

namespace {

constexpr int kWorld = 4;
constexpr int64_t kPerRank = 6;                          // "model/a": an even split
constexpr int64_t kSplitB[kWorld + 1] = {0, 5, 5, 12, 17};  // "optim/m/b": uneven, rank 1 holds nothing
const std::string kMultiLayout = "tp1.pp1.dp4.cp1.ep1.zero1";

// The full tensor the ranks hold slices of; differs per step and variant.
std::vector<char> global_bytes(const std::string& name, DType dt, int64_t numel, int64_t step, uint32_t variant) {
  const uint32_t seed = uint32_t(std::hash<std::string>{}(name)) + uint32_t(step) * 31 + variant * 7919;
  return random_bytes(size_t(numel) * dtype_size(dt), seed);
}

ShardTensor slice_1d(const std::string& name, DType dt, const std::vector<char>& all, int64_t begin, int64_t end) {
  const size_t es = dtype_size(dt);
  ShardTensor t;
  t.name = name;
  t.dtype = dt;
  t.slice = SliceSpec::box({int64_t(all.size() / es)}, {begin}, {end - begin});
  t.data.assign(all.begin() + begin * int64_t(es), all.begin() + end * int64_t(es));
  return t;
}

Snapshot rank_snapshot(int64_t step, int rank, uint32_t variant = 0) {
  Snapshot s;
  s.meta.step = step;
  s.meta.tokens = step * 1000;
  s.meta.seed = 42;
  s.meta.optimizer_step = step;
  s.meta.world_size = kWorld;
  s.meta.layout = kMultiLayout;
  s.meta.config_yaml = "train:\n  steps: 10\n";
  s.rank = rank;
  const auto a = global_bytes("model/a", DType::F32, kWorld * kPerRank, step, variant);
  const auto b = global_bytes("optim/m/b", DType::BF16, kSplitB[kWorld], step, variant);
  s.tensors.push_back(slice_1d("model/a", DType::F32, a, rank * kPerRank, (rank + 1) * kPerRank));
  s.tensors.push_back(slice_1d("optim/m/b", DType::BF16, b, kSplitB[rank], kSplitB[rank + 1]));
  return s;
}

// Assembles the global 1-D tensor `name` from every loaded slice of it.
std::vector<char> assemble(const LoadedCheckpoint& ck, const std::string& name, DType dt, int64_t numel,
                           int64_t* copied) {
  std::vector<char> out(size_t(numel) * dtype_size(dt), 0);
  *copied = 0;
  for (const ShardTensor& t : ck.tensors)
    if (t.name == name) *copied += copy_overlap(t, SliceSpec::whole({numel}), out.data());
  return out;
}

void require_assembles(const std::string& dir, int64_t step, uint32_t variant) {
  const LoadedCheckpoint ck = load_checkpoint(dir);
  CHECK(ck.meta.step == step);
  CHECK(ck.meta.world_size == kWorld);
  CHECK(ck.meta.layout == kMultiLayout);
  REQUIRE(ck.tensors.size() == 2 * kWorld);  // every slice, the empty one included
  std::set<std::vector<int64_t>> a_offsets;
  for (const ShardTensor& t : ck.tensors)
    if (t.name == "model/a") a_offsets.insert(t.slice.box_offset);
  CHECK(a_offsets == std::set<std::vector<int64_t>>{{0}, {kPerRank}, {2 * kPerRank}, {3 * kPerRank}});
  int64_t copied = 0;
  CHECK(assemble(ck, "model/a", DType::F32, kWorld * kPerRank, &copied) ==
        global_bytes("model/a", DType::F32, kWorld * kPerRank, step, variant));
  CHECK(copied == kWorld * kPerRank);
  CHECK(assemble(ck, "optim/m/b", DType::BF16, kSplitB[kWorld], &copied) ==
        global_bytes("optim/m/b", DType::BF16, kSplitB[kWorld], step, variant));
  CHECK(copied == kSplitB[kWorld]);
}

// An in-process store server and one client and writer per simulated rank.
struct Ranks {
  StoreServer server;
  std::vector<std::unique_ptr<StoreClient>> clients;
  std::vector<std::unique_ptr<CheckpointWriter>> writers;

  static StoreServerOptions quiet() {
    StoreServerOptions o;
    o.log = [](const std::string&) {};
    return o;
  }

  Ranks(const std::string& root, bool async, double timeout_s, int keep_last = 0, PeerLiveness gone = {})
      : server("127.0.0.1", 0, "ckpt-test", quiet()) {
    for (int r = 0; r < kWorld; ++r) {
      clients.push_back(std::make_unique<StoreClient>("127.0.0.1", server.port(), "ckpt-test", 10));
      writers.push_back(std::make_unique<CheckpointWriter>(
          root, keep_last, async, CheckpointGroup{clients.back().get(), r, kWorld, timeout_s, gone}));
    }
  }

  // Runs fn(rank, writer) on one thread per rank; returns each rank's error
  // ("" when it succeeded). Assertions stay on the test's own thread.
  std::vector<std::string> run(const std::function<void(int, CheckpointWriter&)>& fn) {
    std::vector<std::string> errors(kWorld);
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r)
      threads.emplace_back([&, r] {
        try {
          fn(r, *writers[size_t(r)]);
        } catch (const std::exception& e) {
          errors[size_t(r)] = std::string("threw: ") + e.what();
        }
      });
    for (auto& t : threads) t.join();
    return errors;
  }

  // Every rank saves rank_snapshot(step) and waits for it.
  std::vector<std::string> save_all(int64_t step, uint32_t variant = 0) {
    return run([&](int r, CheckpointWriter& w) {
      w.save(rank_snapshot(step, r, variant));
      w.wait();
    });
  }
};

const std::vector<std::string> kNoErrors(kWorld);

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

TEST_CASE("checkpoint: four ranks save one checkpoint together, sync and async", "[checkpoint][multirank]") {
  for (bool async : {false, true}) {
    INFO("async " << async);
    TempDir dir;
    Ranks ranks(dir.str(), async, 30);
    CHECK(ranks.save_all(3) == kNoErrors);
    CHECK(ranks.save_all(5) == kNoErrors);
    for (const auto& w : ranks.writers) CHECK(w->last_completed() == dir / "step_00000005");
    CHECK(read_text(dir / "latest") == "step_00000005\n");
    CHECK(entries(dir.path) == std::set<std::string>{"latest", "step_00000003", "step_00000005"});
    CHECK(entries(dir.path / "step_00000005") ==
          std::set<std::string>{"manifest.json", "rank_00000.safetensors", "rank_00001.safetensors",
                                "rank_00002.safetensors", "rank_00003.safetensors"});

    const json::Value m = json::parse(read_text(dir / "step_00000005/manifest.json"));
    CHECK(m.at("files").size() == kWorld);
    CHECK(m.at("world_size").get<int64_t>() == kWorld);
    const json::Value& f3 = m.at("files").at("rank_00003.safetensors");
    CHECK(f3.at("bytes").get<uint64_t>() == fs::file_size(dir / "step_00000005/rank_00003.safetensors"));
    CHECK(f3.at("crc32c").get<std::string>() == crc32c_hex(crc32c_file(dir / "step_00000005/rank_00003.safetensors")));
    const auto& b_pieces = m.at("tensors")[1].at("pieces");
    REQUIRE(b_pieces.size() == kWorld);
    CHECK(b_pieces[1].at("rank").get<int64_t>() == 1);
    CHECK(json::dump(b_pieces[1].at("box_shape")) == "[0]");

    require_assembles(dir / "step_00000003", 3, 0);
    require_assembles(dir / "step_00000005", 5, 0);

    // Saving a step again meets on fresh store keys and replaces it.
    CHECK(ranks.save_all(5, 1) == kNoErrors);
    require_assembles(dir / "step_00000005", 5, 1);
    auto r = resolve_resume(dir.str(), "auto");
    REQUIRE(r);
    CHECK(r->dir == dir / "step_00000005");
    // Rank 0 deletes the reports it read and the keys of finished saves.
    CHECK(ranks.server.stats().keys <= 2);
  }
}

TEST_CASE("checkpoint: a wait on a rank that is gone ends at once naming it, not at the timeout",
          "[checkpoint][multirank]") {
  // The liveness answer stands for the watchdog's heartbeats: `dead` has none.
  for (const int dead : {3, 0}) {
    INFO("dead rank " << dead);
    TempDir dir;
    std::atomic<int> asked{0};
    Ranks ranks(dir.str(), false, 60, 0, [&](const std::vector<int>& waiting_on) -> std::string {
      ++asked;
      for (int r : waiting_on)
        if (r == dead) return "rank " + std::to_string(r) + ": no heartbeat (test)";
      return "";
    });
    const auto t0 = std::chrono::steady_clock::now();
    const auto errors = ranks.run([&](int r, CheckpointWriter& w) {
      if (r != dead) w.save(rank_snapshot(2, r));
    });
    const double took = seconds_since(t0);
    std::printf("[checkpoint] rank %d gone: the others' save failed after %.2f s (timeout 60 s)\n", dead, took);
    CHECK(took < 10);
    CHECK(asked > 0);
    for (int r = 0; r < kWorld; ++r) {
      if (r == dead) continue;
      INFO("rank " << r << ": " << errors[size_t(r)]);
      CHECK_THAT(errors[size_t(r)], Contains("rank " + std::to_string(dead) + " is gone (rank " +
                                             std::to_string(dead) + ": no heartbeat (test))"));
    }
    CHECK(!fs::exists(dir / "step_00000002"));
    CHECK(!fs::exists(dir / "step_00000002.partial"));
  }
}

TEST_CASE("checkpoint: a rank that fails its write fails the save on every rank", "[checkpoint][multirank]") {
  for (bool async : {false, true}) {
    INFO("async " << async);
    TempDir dir;
    Ranks ranks(dir.str(), async, 30);
    REQUIRE(ranks.save_all(1) == kNoErrors);

    // Rank 2 hands over a snapshot it cannot write.
    const auto errors = ranks.run([](int r, CheckpointWriter& w) {
      Snapshot s = rank_snapshot(2, r);
      if (r == 2) s.tensors[0].data.pop_back();
      w.save(std::move(s));
      w.wait();
    });
    for (int r = 0; r < kWorld; ++r) {
      INFO("rank " << r << ": " << errors[size_t(r)]);
      CHECK_THAT(errors[size_t(r)], Contains("threw: checkpoint save of " + (dir / "step_00000002") + " failed: "));
      CHECK_THAT(errors[size_t(r)], Contains("rank 2 failed: ") && Contains("\"model/a\"") && Contains("bytes"));
      CHECK(!ranks.writers[size_t(r)]->busy());
      CHECK(ranks.writers[size_t(r)]->last_completed() == dir / "step_00000001");
    }
    CHECK(read_text(dir / "latest") == "step_00000001\n");
    CHECK(entries(dir.path) == std::set<std::string>{"latest", "step_00000001"});

    // Rank 0 failing after every file was written fails the others too.
    checkpoint_fail_next_save_at("manifest");
    const auto rank0_errors = ranks.save_all(3);
    for (int r = 0; r < kWorld; ++r) {
      INFO("rank " << r << ": " << rank0_errors[size_t(r)]);
      CHECK_THAT(rank0_errors[size_t(r)], Contains("rank 0 failed: " + (dir / "step_00000003.partial/manifest.json") +
                                                   ": injected failure at stage 'manifest'"));
      CHECK(ranks.writers[size_t(r)]->last_completed() == dir / "step_00000001");
    }
    CHECK(entries(dir.path) == std::set<std::string>{"latest", "step_00000001"});

    // The writers keep working.
    CHECK(ranks.save_all(4) == kNoErrors);
    CHECK(read_text(dir / "latest") == "step_00000004\n");
    require_assembles(dir / "step_00000004", 4, 0);
  }
}

TEST_CASE("checkpoint: a rank that never saves is named by the timeout", "[checkpoint][multirank]") {
  TempDir dir;
  Ranks ranks(dir.str(), true, 1);
  REQUIRE(ranks.save_all(1) == kNoErrors);

  auto t0 = std::chrono::steady_clock::now();
  const auto errors = ranks.run([](int r, CheckpointWriter& w) {
    if (r == 3) return;
    w.save(rank_snapshot(2, r));
    w.wait();
  });
  CHECK(seconds_since(t0) < 3);
  const std::string partial = dir / "step_00000002.partial";
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << errors[size_t(r)]);
    CHECK_THAT(errors[size_t(r)], Contains("rank 0 waited 1 s for the reports of rank 3 (of 4) on " + partial) &&
                                      Contains("never came"));
    CHECK(ranks.writers[size_t(r)]->last_completed() == dir / "step_00000001");
  }
  CHECK(errors[3].empty());
  CHECK(read_text(dir / "latest") == "step_00000001\n");
  CHECK(entries(dir.path) == std::set<std::string>{"latest", "step_00000001"});

  // Without rank 0 the others give up on the directory it never created.
  t0 = std::chrono::steady_clock::now();
  const auto no_rank0 = ranks.run([](int r, CheckpointWriter& w) {
    if (r == 0) return;
    w.save(rank_snapshot(5, r));
    w.wait();
  });
  CHECK(seconds_since(t0) < 3);
  for (int r = 1; r < kWorld; ++r) {
    INFO("rank " << r << ": " << no_rank0[size_t(r)]);
    CHECK_THAT(no_rank0[size_t(r)], Contains("rank " + std::to_string(r) + " failed: waited 1 s for rank 0 to create " +
                                             (dir / "step_00000005.partial")));
  }
  CHECK(entries(dir.path) == std::set<std::string>{"latest", "step_00000001"});
}

TEST_CASE("checkpoint: group writers refuse inconsistent ranks and snapshots", "[checkpoint][multirank]") {
  TempDir dir;
  CHECK_THROWS_WITH(CheckpointWriter(dir.str(), 0, false, CheckpointGroup{nullptr, 0, 4, 1, {}}),
                    Contains("several ranks need a store"));
  Ranks ranks(dir.str(), false, 30);
  CHECK_THROWS_WITH(CheckpointWriter(dir.str(), 0, false, CheckpointGroup{ranks.clients[0].get(), 4, 4, 1, {}}),
                    Contains("rank outside the world"));
  // Rank 0 handed rank 1's snapshot: fails at once, before touching the disk.
  CHECK_THROWS_WITH(ranks.writers[0]->save(rank_snapshot(1, 1)),
                    Contains("rank 0 failed") && Contains("snapshot of rank 1 of world size 4 handed to the writer of rank 0"));
  CHECK(entries(dir.path).empty());
  // A single-process writer cannot save one rank of several.
  CHECK_THROWS_WITH(CheckpointWriter(dir.str(), 0, false).save(rank_snapshot(1, 0)),
                    Contains("world_size 4 needs a writer constructed with a CheckpointGroup"));
  CHECK(entries(dir.path).empty());
}

TEST_CASE("checkpoint: a rank loads only the pieces it wants and checksums only the files it reads",
          "[checkpoint][multirank]") {
  TempDir dir;
  {
    Ranks ranks(dir.str(), false, 30);
    REQUIRE(ranks.save_all(4) == kNoErrors);
  }
  const std::string step = (dir / "step_00000004");
  // Elements [8, 14) of "model/a" live in the files of ranks 1 and 2 only.
  const SliceFilter want = overlapping({{"model/a", SliceSpec::box({kWorld * kPerRank}, {8}, {6})}});
  LoadedCheckpoint ck = load_checkpoint(step, want);
  REQUIRE(ck.tensors.size() == 2);
  std::set<std::vector<int64_t>> offsets;
  for (const ShardTensor& t : ck.tensors) offsets.insert(t.slice.box_offset);
  CHECK(offsets == std::set<std::vector<int64_t>>{{kPerRank}, {2 * kPerRank}});
  std::vector<char> part(size_t(kWorld * kPerRank) * 4, 0);
  int64_t copied = 0;
  for (const ShardTensor& t : ck.tensors) copied += copy_overlap(t, SliceSpec::whole({kWorld * kPerRank}), part.data());
  const auto all = global_bytes("model/a", DType::F32, kWorld * kPerRank, 4, 0);
  CHECK(copied == 2 * kPerRank);
  CHECK(std::equal(all.begin() + kPerRank * 4, all.begin() + 3 * kPerRank * 4, part.begin() + kPerRank * 4));

  // A damaged file nobody here reads does not stop this rank, but it must
  // still be there with its size; one it reads is refused, naming it.
  flip_byte((dir / "step_00000004/rank_00003.safetensors"), 40);
  CHECK_NOTHROW(load_checkpoint(step, want));
  CHECK_THROWS_WITH(load_checkpoint(step), Catch::Contains("rank_00003.safetensors") && Catch::Contains("CRC32C"));
  flip_byte((dir / "step_00000004/rank_00002.safetensors"), 40);
  CHECK_THROWS_WITH(load_checkpoint(step, want), Catch::Contains("rank_00002.safetensors"));
  fs::resize_file(fs::path(dir / "step_00000004/rank_00000.safetensors"), 10);
  CHECK_THROWS_WITH(load_checkpoint(step, [](auto&&...) { return false; }),
                    Catch::Contains("rank_00000.safetensors") && Catch::Contains("size"));
}
