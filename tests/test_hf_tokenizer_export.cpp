// `trainer export`'s tokenizer files (interop/hf_tokenizer_export.h) from
// SentencePiece models written here in the protocol-buffer wire format
// (data/sentencepiece_model.h reads them): the fields read and the proto2
// defaults, the BPE merges and their order, the normalizers and decoders per
// whitespace option, the tokenizer_config, and every refusal with its
// reason. tests/hf/tokenizer_export_test.py checks the files against
// transformers and SentencePiece on real models.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "data/sentencepiece_model.h"
#include "temp_dir.h"
#include "interop/hf_tokenizer_export.h"
#include "observe/proto_wire.h"

using namespace trainer;
using Catch::Contains;

namespace {

const std::string kSpace = "\xE2\x96\x81";  // ▁

struct P {
  std::string text;
  float score;
  int type;
};

std::string piece_bytes(const P& p) {
  std::string m;
  proto::bytes_field(m, 1, p.text);
  proto::float_field(m, 2, p.score);
  if (p.type != SentencePieceModel::kNormal) proto::int64_field(m, 3, p.type);  // absent: NORMAL
  return m;
}

// A BPE model: <unk> <s> </s>, the 256 byte pieces, then `normal`.
struct Spec {
  std::vector<P> normal = {{"a", -10, 1},     {"b", -11, 1},        {kSpace, -12, 1}, {"ab", -1, 1},
                           {kSpace + "a", -2, 1}, {"ba", -3, 1}, {"aba", -4, 1}};
  std::vector<P> extra;  // after the normal pieces
  int64_t model_type = SentencePieceModel::kBpe;  // < 0: field absent
  bool byte_fallback = true;
  int bytes = 256;
  int64_t bos_id = 1, pad_id = -1;
  bool add_dummy_prefix = false, remove_extra_whitespaces = false;
  std::string charsmap, name = "identity";
  bool escape_whitespaces = true, suffix = false;
};

std::string model_bytes(const Spec& s) {
  std::string out;
  std::vector<P> pieces = {{"<unk>", 0, 2}, {"<s>", 0, 3}, {"</s>", 0, 3}};
  char buf[16];
  for (int b = 0; b < s.bytes; ++b) {
    std::snprintf(buf, sizeof buf, "<0x%02X>", unsigned(b));
    pieces.push_back({buf, 0, SentencePieceModel::kByte});
  }
  pieces.insert(pieces.end(), s.normal.begin(), s.normal.end());
  pieces.insert(pieces.end(), s.extra.begin(), s.extra.end());
  for (const P& p : pieces) proto::bytes_field(out, 1, piece_bytes(p));
  std::string trainer;
  if (s.model_type >= 0) proto::int64_field(trainer, 3, s.model_type);
  proto::int64_field(trainer, 4, int64_t(pieces.size()));  // vocab_size: read past, not kept
  if (s.byte_fallback) proto::int64_field(trainer, 35, 1);
  if (s.suffix) proto::int64_field(trainer, 24, 1);
  proto::int64_field(trainer, 41, s.bos_id);
  proto::int64_field(trainer, 43, s.pad_id);  // -1: a ten-byte varint
  proto::bytes_field(out, 2, trainer);
  std::string norm;
  proto::bytes_field(norm, 1, s.name);
  if (!s.charsmap.empty()) proto::bytes_field(norm, 2, s.charsmap);
  proto::int64_field(norm, 3, s.add_dummy_prefix);
  proto::int64_field(norm, 4, s.remove_extra_whitespaces);
  if (!s.escape_whitespaces) proto::int64_field(norm, 5, 0);
  proto::bytes_field(out, 3, norm);
  return out;
}

SentencePieceModel parsed(const Spec& s) { return parse_sentencepiece_model(model_bytes(s), "test.model"); }

std::vector<std::string> merges_of(const json::Value& j) {
  std::vector<std::string> m;
  for (const auto& x : j["model"]["merges"]) m.push_back(x.get<std::string>());
  return m;
}

}  // namespace

TEST_CASE("sentencepiece model: the wire format's fields and proto2 defaults", "[hf_tokenizer]") {
  const SentencePieceModel m = parsed(Spec{});
  REQUIRE(m.pieces.size() == 3 + 256 + 7);
  CHECK(m.pieces[0].text == "<unk>");
  CHECK(m.pieces[0].type == SentencePieceModel::kUnknown);
  CHECK(m.pieces[3].text == "<0x00>");
  CHECK(m.pieces[3].type == SentencePieceModel::kByte);
  CHECK(m.pieces[259].text == "a");
  CHECK(m.pieces[259].type == SentencePieceModel::kNormal);
  CHECK(m.pieces[262].score == -1.0f);
  CHECK(m.model_type == SentencePieceModel::kBpe);
  CHECK(m.byte_fallback);
  CHECK(m.bos_id == 1);
  CHECK(m.eos_id == 2);   // absent: the default
  CHECK(m.pad_id == -1);  // negative int32 as a sign-extended varint
  CHECK(m.normalizer_name == "identity");
  CHECK(m.charsmap_bytes == 0);
  CHECK_FALSE(m.add_dummy_prefix);
  CHECK(m.escape_whitespaces);  // absent: the default

  Spec no_type;
  no_type.model_type = -1;
  CHECK(parsed(no_type).model_type == SentencePieceModel::kUnigram);  // the .proto's default

  const std::string whole = model_bytes(Spec{});
  CHECK_THROWS_WITH(parse_sentencepiece_model(whole.substr(0, whole.size() - 3), "cut.model"),
                    Contains("cut.model: not a SentencePiece model"));
  CHECK_THROWS_WITH(parse_sentencepiece_model("", "empty.model"),
                    Contains("empty.model: not a SentencePiece model (no pieces)"));
  CHECK_THROWS_WITH(parse_sentencepiece_model("\x0b", "group.model"), Contains("wire type 3"));
  CHECK_THROWS_WITH(read_sentencepiece_model("/nonexistent/tokenizer.model"),
                    Contains("/nonexistent/tokenizer.model: cannot open it"));
}

TEST_CASE("tokenizer.json from a BPE model: vocabulary, merges by score, specials", "[hf_tokenizer]") {
  const SentencePieceModel m = parsed(Spec{});
  REQUIRE(sentencepiece_refusal(m) == "");
  const json::Value j = sentencepiece_tokenizer_json(m);
  CHECK(j["model"]["type"] == "BPE");
  CHECK(j["model"]["byte_fallback"] == true);
  CHECK(j["model"]["unk_token"] == "<unk>");
  CHECK(j["model"]["vocab"].size() == m.pieces.size());
  CHECK(j["model"]["vocab"]["<0x41>"] == 3 + 0x41);
  CHECK(j["model"]["vocab"]["aba"] == 265);
  // Best score first; a piece's splits into two pieces, longest left part first.
  CHECK(merges_of(j) == std::vector<std::string>{"a b", kSpace + " a", "b a", "ab a", "a ba"});
  REQUIRE(j["added_tokens"].size() == 3);
  CHECK(j["added_tokens"][1]["content"] == "<s>");
  CHECK(j["added_tokens"][1]["id"] == 1);
  CHECK(j["added_tokens"][1]["special"] == true);
  CHECK(j["added_tokens"][1]["normalized"] == false);
  CHECK(j["post_processor"].is_null());
  CHECK(j["pre_tokenizer"].is_null());
  // No dummy prefix, no whitespace removal: spaces become ▁ and back.
  const json::Value& norms = j["normalizer"]["normalizers"];
  REQUIRE(norms.size() == 1);
  CHECK(norms[0]["pattern"]["String"] == " ");
  CHECK(norms[0]["content"] == kSpace);
  const json::Value& decs = j["decoder"]["decoders"];
  REQUIRE(decs.size() == 3);
  CHECK(decs[0]["type"] == "Replace");
  CHECK(decs[1]["type"] == "ByteFallback");
  CHECK(decs[2]["type"] == "Fuse");
}

TEST_CASE("tokenizer.json: dummy prefix and whitespace removal", "[hf_tokenizer]") {
  Spec s;
  s.add_dummy_prefix = true;
  s.byte_fallback = false;
  s.bytes = 0;
  json::Value j = sentencepiece_tokenizer_json(parsed(s));
  CHECK(j["normalizer"]["normalizers"][0]["type"] == "Prepend");
  CHECK(j["normalizer"]["normalizers"][0]["prepend"] == kSpace);
  CHECK(j["decoder"]["decoders"].size() == 3);  // Replace, Fuse, Strip: no ByteFallback
  CHECK(j["decoder"]["decoders"][2]["type"] == "Strip");
  CHECK(j["decoder"]["decoders"][2]["start"] == 1);
  CHECK(j["model"]["byte_fallback"] == false);

  s.remove_extra_whitespaces = true;
  j = sentencepiece_tokenizer_json(parsed(s));
  const json::Value& norms = j["normalizer"]["normalizers"];
  REQUIRE(norms.size() == 5);
  CHECK(norms[0]["pattern"]["Regex"] == "\\A +");
  CHECK(norms[1]["pattern"]["Regex"] == " {2,}");
  CHECK(norms[2]["type"] == "Prepend");
  CHECK(norms[4]["pattern"]["Regex"] == kSpace + "+\\z");
  CHECK(j["decoder"]["decoders"][2]["start"].get<int64_t>() > 1000);  // every leading space
}

TEST_CASE("tokenizer_config.json names the model's special pieces, null where absent", "[hf_tokenizer]") {
  Spec s;
  s.extra = {{"<sep>", 0, SentencePieceModel::kControl}};
  json::Value c = sentencepiece_tokenizer_config(parsed(s));
  CHECK(c["tokenizer_class"] == "LlamaTokenizer");
  CHECK(c["legacy"] == true);
  CHECK(c["add_bos_token"] == false);
  CHECK(c["unk_token"] == "<unk>");
  CHECK(c["bos_token"] == "<s>");
  CHECK(c["eos_token"] == "</s>");
  CHECK(c["pad_token"].is_null());
  CHECK(c["additional_special_tokens"] == json::Value::array({"<sep>"}));
  CHECK(c["added_tokens_decoder"].size() == 4);
  CHECK(c["added_tokens_decoder"]["266"]["content"] == "<sep>");
  s.bos_id = -1;
  c = sentencepiece_tokenizer_config(parsed(s));
  CHECK(c["bos_token"].is_null());
}

TEST_CASE("tokenizer.json refused for what it cannot express, saying why", "[hf_tokenizer]") {
  auto refusal = [](Spec s) { return sentencepiece_refusal(parsed(s)); };
  Spec s;
  s.model_type = SentencePieceModel::kUnigram;
  CHECK_THAT(refusal(s), Contains("it is a Unigram model"));
  s = Spec{};
  s.charsmap = std::string(40, 'x');
  s.name = "nmt_nfkc";
  CHECK_THAT(refusal(s), Contains("normalization 'nmt_nfkc' rewrites characters"));
  s = Spec{};
  s.escape_whitespaces = false;
  CHECK_THAT(refusal(s), Contains("does not escape whitespace"));
  s = Spec{};
  s.suffix = true;
  CHECK_THAT(refusal(s), Contains("treats whitespace as a suffix"));
  s = Spec{};
  s.extra = {{"<sep>", 0, SentencePieceModel::kUserDefined}};
  CHECK_THAT(refusal(s), Contains("piece 266 '<sep>' is user-defined"));
  s = Spec{};
  s.extra = {{"zz", 0, SentencePieceModel::kUnused}};
  CHECK_THAT(refusal(s), Contains("'zz' is unused"));
  s = Spec{};
  s.extra = {{"bb", -4, SentencePieceModel::kNormal}};
  CHECK_THAT(refusal(s), Contains("pieces 'aba' and 'bb' share the score"));
  s = Spec{};
  s.bytes = 200;
  CHECK_THAT(refusal(s), Contains("byte fallback but 200 byte pieces"));
  s = Spec{};
  s.extra = {{"a", -20, SentencePieceModel::kNormal}};
  CHECK_THAT(refusal(s), Contains("'a' appears twice"));
  s = Spec{};
  s.remove_extra_whitespaces = true;
  s.extra = {{kSpace + kSpace, -20, SentencePieceModel::kNormal}};
  CHECK_THAT(refusal(s), Contains("starts with two"));
}

TEST_CASE("byte tokenizer.json: ids are the bytes", "[hf_tokenizer]") {
  const json::Value j = byte_tokenizer_json();
  REQUIRE(j["model"]["vocab"].size() == 256);
  CHECK(j["model"]["vocab"]["<0x00>"] == 0);
  CHECK(j["model"]["vocab"]["<0xFF>"] == 255);
  CHECK(j["model"]["byte_fallback"] == true);
  CHECK(j["model"]["merges"].empty());
  CHECK(byte_tokenizer_config()["clean_up_tokenization_spaces"] == false);
}

TEST_CASE("export plan: tokenizer.json written or refused, the report says which", "[hf_tokenizer]") {
  test::TempDir dir("hf_tokenizer", "plan");
  auto files = [&](const Spec& s, bool with_json) {
    std::ofstream(dir / "tokenizer.model", std::ios::binary) << model_bytes(s);
    TokenizerFiles f;
    f.dir = dir.path.string();
    f.kind = "sentencepiece";
    f.file = dir / "tokenizer.model";
    f.all = {f.file};
    if (with_json) {
      std::ofstream(dir / "tokenizer.json") << "{}";
      f.all.push_back(dir / "tokenizer.json");
    }
    return f;
  };
  auto names = [](const TokenizerExport& e) {
    std::vector<std::string> n;
    for (const auto& [name, j] : e.write) n.push_back(name);
    for (const auto& c : e.copy) n.push_back("copy " + std::filesystem::path(c).filename().string());
    return n;
  };
  TokenizerExport e = plan_tokenizer_export(files(Spec{}, true));
  CHECK(names(e) == std::vector<std::string>{"tokenizer_config.json", "tokenizer.json", "copy tokenizer.model"});
  CHECK_THAT(e.report, Contains("tokenizer.json (BPE, byte fallback, written from the model instead of the data's)"));
  Spec unigram;
  unigram.model_type = SentencePieceModel::kUnigram;
  e = plan_tokenizer_export(files(unigram, false));
  CHECK(names(e) == std::vector<std::string>{"tokenizer_config.json", "copy tokenizer.model"});
  CHECK_THAT(e.report,
             Contains("no tokenizer.json written from " + (dir / "tokenizer.model") + ": it is a Unigram model"));
  CHECK_THAT(e.report, Contains("use_fast=False"));

  const std::string out = dir / "out";
  std::filesystem::create_directories(out);
  write_tokenizer_export(plan_tokenizer_export(files(Spec{}, false)), out);
  CHECK(std::filesystem::exists(out + "/tokenizer.json"));
  CHECK(std::filesystem::exists(out + "/tokenizer.model"));
  CHECK_THROWS_WITH(write_tokenizer_export(plan_tokenizer_export(files(Spec{}, false)), dir / "missing"),
                    Contains("tokenizer.model: cannot copy it into " + (dir / "missing")));
}
