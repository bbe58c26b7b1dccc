// The data's tokenizer (data/tokenizer.h, interop/run_tokenizer.h): finding
// it next to the data, the start-up checks against the configuration, the
// copy into the run directory, the byte and id fallbacks, a Hugging Face
// tokenizer.json's vocabulary; and SentencePiece through libsentencepiece on
// a model scripts/prepare_text.py trains ([sentencepiece]: reported as
// skipped by ctest when the build has no library).
#include <catch2/catch.hpp>

#include "tests/build_paths.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "config/config.h"
#include "data/tokenizer.h"
#include "e2e_util.h"
#include "temp_dir.h"
#include "interop/run_tokenizer.h"

using namespace trainer;
using Catch::Contains;

namespace {

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

Config config_for(const std::string& train, int64_t vocab, const std::string& dtype = "uint16") {
  return load_config_text("model: {vocab_size: " + std::to_string(vocab) + "}\ndata: {train: [" + train +
                              "], dtype: " + dtype + "}\n",
                          "<test>", {});
}

}  // namespace

TEST_CASE("tokenizer: bytes round trip, ids parse numbers and refuse text", "[tokenizer]") {
  const auto b = byte_tokenizer();
  const std::string text = "The cat\n\tsat \xc3\xa9";
  CHECK(b->decode(b->encode(text)) == text);
  CHECK(b->decode({65, 7, 66}) == "A?B");  // a bell would ring the terminal
  const auto ids = id_tokenizer(100);
  CHECK(ids->encode(" 3 17  99") == std::vector<int32_t>{3, 17, 99});
  CHECK(ids->decode({3, 17}) == "3 17");
  CHECK_THROWS_WITH(ids->encode("3 cat"), Contains("'cat' is not one"));
  CHECK_THROWS_WITH(ids->encode("100"), Contains("numbers below 100"));
}

TEST_CASE("tokenizer: found next to the data, checked against model.vocab_size and data.dtype", "[tokenizer]") {
  test::TempDir dir("tokenizer", "check");
  write(dir / "train.bin", std::string(64, '\0'));
  CHECK_FALSE(check_data_tokenizer(config_for(dir / "train.bin", 256)).has_value());

  write(dir / "tokenizer_info.json", R"({"kind": "bytes", "vocab_size": 256, "dtype": "uint16"})");
  const auto f = check_data_tokenizer(config_for(dir / "train.bin", 256));
  REQUIRE(f.has_value());
  CHECK(f->kind == "bytes");
  CHECK_THROWS_AS(check_data_tokenizer(config_for(dir / "train.bin", 200)), ConfigError);
  CHECK_THROWS_WITH(check_data_tokenizer(config_for(dir / "train.bin", 200)),
                    Contains("tokenizer_info.json: the data's tokenizer has a vocabulary of 256 ids, larger than "
                             "model.vocab_size 200"));
  CHECK_THROWS_WITH(check_data_tokenizer(config_for(dir / "train.bin", 256, "uint32")),
                    Contains("the data was written as uint16 tokens, data.dtype is uint32"));

  // Recorded in the run directory with where it came from.
  record_tokenizer(*f, dir / "run");
  std::ifstream in(dir / "run/tokenizer/tokenizer_info.json");
  const std::string info((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK_THAT(info, Contains("\"data_dir\"") && Contains("\"kind\": \"bytes\""));

  // An info that names a tokenizer whose file is gone is an error, not bytes.
  write(dir / "tokenizer_info.json", R"({"kind": "sentencepiece", "vocab_size": 320})");
  CHECK_THROWS_WITH(find_tokenizer(dir.path.string()), Contains("tokenizer.model is missing"));
  write(dir / "tokenizer_info.json", "{not json");
  CHECK_THROWS_WITH(find_tokenizer(dir.path.string()), Contains("not a tokenizer_info.json"));
}

TEST_CASE("tokenizer: a Hugging Face tokenizer.json counts its vocabulary and added tokens", "[tokenizer]") {
  test::TempDir dir("tokenizer", "hf");
  write(dir / "tokenizer.json",
        R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}}, "added_tokens": [{"id": 5, "content": "<s>"}]})");
  CHECK(huggingface_vocab_size(dir / "tokenizer.json") == 6);
  write(dir / "train.bin", std::string(64, '\0'));
  CHECK_THROWS_WITH(check_data_tokenizer(config_for(dir / "train.bin", 4)),
                    Contains("tokenizer.json: the data's tokenizer has a vocabulary of 6 ids"));
  const auto t = load_tokenizer(*find_tokenizer(dir.path.string()));
  CHECK_FALSE(t->encodes_text());
  CHECK_THAT(t->warning, Contains("decodes but does not encode Hugging Face tokenizers"));
  CHECK(t->encode("2 5") == std::vector<int32_t>{2, 5});
  CHECK(t->decode({0, 1, 2, 5}) == "abab<s>");
  write(dir / "tokenizer.json", "[]");
  CHECK_THROWS_WITH(huggingface_vocab_size(dir / "tokenizer.json"), Contains("no vocabulary found"));
  // An id is what the id table allocates: one far past any vocabulary is an
  // error naming it, before anything is allocated (a fuzzing finding).
  write(dir / "tokenizer.json", R"({"model": {"vocab": {"a": 0}}, "added_tokens": [{"id": 4294967296, "content": "x"}]})");
  CHECK_THROWS_WITH(huggingface_vocab_size(dir / "tokenizer.json"),
                    Contains("tokenizer.json: token id 4294967296 in added_tokens is over 4194303"));
  write(dir / "tokenizer.json", R"({"model": {"vocab": {"a": 4194304}}})");
  CHECK_THROWS_WITH(huggingface_tokenizer(dir / "tokenizer.json"), Contains("token id 4194304 in model.vocab is over"));
  write(dir / "tokenizer.json", R"({"model": {"vocab": {"a": 4194303}}})");
  CHECK(huggingface_vocab_size(dir / "tokenizer.json") == 4194304);
}

TEST_CASE("tokenizer: Hugging Face byte-level and Metaspace decoders give the text back", "[tokenizer]") {
  test::TempDir dir("tokenizer", "hf_decode");
  // GPT-2's byte-level pieces: U+0120 is the space byte, U+010A the newline;
  // "c3" and "a9" (as Latin-1 characters) are the two bytes of UTF-8 e-acute.
  write(dir / "bl.json", R"({"model": {"type": "BPE", "vocab": {"Hello": 0, "\u0120world": 1, "\u010a": 2,
      "\u00c3": 3, "\u00a9": 4}}, "added_tokens": [{"id": 5, "content": "<|endoftext|>", "special": true}],
      "decoder": {"type": "ByteLevel"}})");
  const auto bl = huggingface_tokenizer(dir / "bl.json");
  CHECK(bl->vocab_size() == 6);
  CHECK(bl->decode({0, 1, 2, 3, 4, 5, 9}) == "Hello world\n\xc3\xa9<|endoftext|><9>");
  // A SentencePiece conversion (llama): Replace, ByteFallback, Fuse, Strip.
  write(dir / "ms.json", R"({"model": {"type": "BPE", "byte_fallback": true, "vocab": {"<unk>": 0, "<0x0A>": 1,
      "\u2581The": 2, "\u2581cat": 3}}, "decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
      {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}})");
  const auto ms = huggingface_tokenizer(dir / "ms.json");
  CHECK(ms->decode({2, 3, 1, 2}) == "The cat\n The");
  CHECK(ms->warning.find("not built in") == std::string::npos);
  write(dir / "odd.json", R"({"model": {"vocab": {"a": 0}}, "decoder": {"type": "CTC"}})");
  CHECK_THAT(huggingface_tokenizer(dir / "odd.json")->warning, Contains("decoder 'CTC' is not built in"));
}

TEST_CASE("tokenizer: SentencePiece from prepare_text.py encodes and decodes text exactly", "[tokenizer][sentencepiece]") {
  REQUIRE(have_sentencepiece());
  test::TempDir dir("tokenizer", "sp");
  std::string out;
  const int rc = e2e::run("/usr/bin/python3 " + std::string(TRAINER_SOURCE_DIR) +
                              "/scripts/prepare_text.py --tokenizer sentencepiece --vocab-size 400 --out-dir " +
                              dir.path.string() + " '/usr/share/common-licenses/*'",
                          &out);
  INFO(out);
  REQUIRE(rc == 0);
  const auto f = find_tokenizer(dir.path.string());
  REQUIRE(f.has_value());
  CHECK(f->kind == "sentencepiece");
  const auto t = load_tokenizer(*f);
  CHECK(t->kind() == "sentencepiece");
  CHECK(t->vocab_size() == 400);
  const std::string text = "The licensee  may\ncopy it.\t\xc3\xa9";
  const auto ids = t->encode(text);
  std::printf("sentencepiece: %zu bytes -> %zu tokens\n", text.size(), ids.size());
  CHECK(ids.size() < text.size());
  CHECK(t->decode(ids) == text);
  CHECK(t->decode({ids[0], 999}) == t->decode({ids[0]}) + "<999>");
  // The training data was encoded with the same model: its first tokens decode to the text's start.
  std::ifstream bin(dir / "train.bin", std::ios::binary);
  std::vector<uint16_t> head(8);
  bin.read(reinterpret_cast<char*>(head.data()), 16);
  const std::string start = t->decode(std::vector<int32_t>(head.begin(), head.end()));
  std::vector<std::string> sources;
  for (const auto& e : std::filesystem::directory_iterator("/usr/share/common-licenses"))
    if (e.is_regular_file()) sources.push_back(e.path().string());
  std::sort(sources.begin(), sources.end());
  REQUIRE(!sources.empty());
  std::ifstream src(sources[0]);
  const std::string first((std::istreambuf_iterator<char>(src)), std::istreambuf_iterator<char>());
  INFO("decoded start '" << start << "' of " << sources[0]);
  CHECK(start.size() >= 8);
  CHECK(first.rfind(start, 0) == 0);
  CHECK_THROWS_WITH(sentencepiece_tokenizer(dir / "train.bin"), Contains("not a SentencePiece model"));
}
