#include "interop/hf_tokenizer_export.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "interop/hf_files.h"

namespace trainer {

namespace fs = std::filesystem;

namespace {

const char* const kSpaceSymbol = "\xE2\x96\x81";  // "▁", U+2581: SentencePiece's escaped space

// Strip's count for "every leading space".
constexpr int kAllLeading = 1 << 30;

using Model = SentencePieceModel;

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// Byte offsets where a UTF-8 code point starts, past the first one: the
// places a piece can be cut into two.
std::vector<size_t> cuts_of(const std::string& s) {
  std::vector<size_t> cuts;
  for (size_t i = 1; i < s.size(); ++i)
    if ((uint8_t(s[i]) & 0xC0) != 0x80) cuts.push_back(i);
  return cuts;
}

std::string byte_piece(int b) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "<0x%02X>", unsigned(b) & 0xFFu);
  return buf;
}

json::Value replace(json::Value pattern, const std::string& content) {
  return {{"type", "Replace"}, {"pattern", std::move(pattern)}, {"content", content}};
}

json::Value special_token(int id, const std::string& content) {
  return {{"id", id},         {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},  {"normalized", false}, {"special", true}};
}

// The piece at `id` when it is a control piece (bos, eos, pad), else null.
json::Value control_piece(const Model& m, int id) {
  if (id < 0 || id >= int(m.pieces.size()) || m.pieces[size_t(id)].type != Model::kControl) return nullptr;
  return m.pieces[size_t(id)].text;
}

// What the BPE merges are made of: normal pieces of two or more characters
// (the ones a merge can produce), best score first.
std::vector<int> merge_results(const Model& m) {
  std::vector<int> ids;
  for (size_t i = 0; i < m.pieces.size(); ++i)
    if (m.pieces[i].type == Model::kNormal && !cuts_of(m.pieces[i].text).empty()) ids.push_back(int(i));
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int a, int b) { return m.pieces[size_t(a)].score > m.pieces[size_t(b)].score; });
  return ids;
}

}  // namespace

std::string sentencepiece_refusal(const Model& m) {
  if (m.model_type != Model::kBpe)
    return std::string("it is a ") + model_type_name(m.model_type) +
           " model; only BPE models are written (Hugging Face's Unigram also matches byte and control pieces "
           "inside text and sums scores in another precision, so its ids can differ)";
  if (m.charsmap_bytes > 0)
    return "its normalization '" + m.normalizer_name +
           "' rewrites characters (a precompiled character map); only identity normalization is written";
  if (m.denormalizer_charsmap_bytes > 0) return "it has denormalization rules, which decoding would need";
  if (!m.escape_whitespaces) return "it does not escape whitespace as " + std::string(kSpaceSymbol);
  if (m.treat_whitespace_as_suffix) return "it treats whitespace as a suffix";
  std::unordered_set<std::string> seen;
  int unknown = 0, bytes = 0;
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const Model::Piece& p = m.pieces[i];
    const std::string which = "piece " + std::to_string(i) + " " + quoted(p.text);
    switch (p.type) {
      case Model::kNormal:
        if (p.text.empty()) return which + " is empty";
        if (m.remove_extra_whitespaces && p.text.rfind(std::string(kSpaceSymbol) + kSpaceSymbol, 0) == 0)
          return which + " starts with two " + kSpaceSymbol +
                 " and the model removes extra whitespace (SentencePiece's decoding then keeps one of them)";
        if (p.text.find(' ') != std::string::npos)
          return which + " holds a space, which tokenizer.json's merges cannot spell";
        break;
      case Model::kUnknown: ++unknown; break;
      case Model::kControl: break;
      case Model::kByte:
        if (p.text != byte_piece(bytes))
          return which + " is a byte piece out of order (expected " + byte_piece(bytes) + ")";
        ++bytes;
        break;
      case Model::kUserDefined:
        return which + " is user-defined (SentencePiece matches it inside the text before merging)";
      case Model::kUnused:
        return which + " is unused (SentencePiece merges through it and splits it again)";
      default: return which + " has piece type " + std::to_string(p.type);
    }
    if (!seen.insert(p.text).second) return which + " appears twice";
  }
  if (unknown != 1) return "it has " + std::to_string(unknown) + " unknown pieces (SentencePiece models have one)";
  if (m.byte_fallback && bytes != 256)
    return "it has byte fallback but " + std::to_string(bytes) + " byte pieces instead of 256";
  const std::vector<int> results = merge_results(m);
  for (size_t k = 1; k < results.size(); ++k) {
    const Model::Piece& a = m.pieces[size_t(results[k - 1])];
    const Model::Piece& b = m.pieces[size_t(results[k])];
    if (a.score == b.score)
      return "pieces " + quoted(a.text) + " and " + quoted(b.text) + " share the score " + std::to_string(a.score) +
             " (SentencePiece then merges the leftmost pair; Hugging Face's BPE ranks every merge apart)";
  }
  return "";
}

json::Value sentencepiece_tokenizer_json(const Model& m) {
  json::Value vocab = json::Value::object();
  json::Value added = json::Value::array();
  std::unordered_map<std::string, int> normal;
  std::string unk;
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const Model::Piece& p = m.pieces[i];
    vocab[p.text] = int(i);
    if (p.type == Model::kNormal) normal.emplace(p.text, int(i));
    if (p.type == Model::kUnknown) unk = p.text;
    if (p.type == Model::kControl || p.type == Model::kUnknown) added.push_back(special_token(int(i), p.text));
  }
  // SentencePiece merges the adjacent pair whose union is the best-scoring
  // piece; every split of that piece into two pieces is such a pair. Among
  // the splits of one piece the longest left part comes first: the order
  // only matters when two splits of one piece are adjacent pairs at once.
  json::Value merges = json::Value::array();
  for (int id : merge_results(m)) {
    const std::string& s = m.pieces[size_t(id)].text;
    const std::vector<size_t> cuts = cuts_of(s);
    for (auto c = cuts.rbegin(); c != cuts.rend(); ++c)
      if (normal.count(s.substr(0, *c)) && normal.count(s.substr(*c)))
        merges.push_back(s.substr(0, *c) + " " + s.substr(*c));
  }
  // SentencePiece's normalizer with identity rules, remove_extra_whitespaces
  // as it does it: leading spaces dropped and runs of spaces squeezed in the
  // input (spaces only: not tabs, newlines or a literal "▁"); then the dummy
  // "▁" in front of a non-empty text, every space written as "▁"; then
  // trailing "▁" dropped from that result, literal ones and the dummy prefix
  // included (a text of one "▁" encodes to nothing).
  json::Value normalizers = json::Value::array();
  if (m.remove_extra_whitespaces) {
    normalizers.push_back(replace({{"Regex", "\\A +"}}, ""));
    normalizers.push_back(replace({{"Regex", " {2,}"}}, " "));
  }
  if (m.add_dummy_prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", kSpaceSymbol}});
  normalizers.push_back(replace({{"String", " "}}, kSpaceSymbol));
  if (m.remove_extra_whitespaces) normalizers.push_back(replace({{"Regex", std::string(kSpaceSymbol) + "+\\z"}}, ""));
  json::Value decoders = json::Value::array();
  decoders.push_back(replace({{"String", kSpaceSymbol}}, " "));
  if (m.byte_fallback) decoders.push_back({{"type", "ByteFallback"}});
  decoders.push_back({{"type", "Fuse"}});
  // SentencePiece's decoding drops the "▁" a text starts with (the dummy
  // prefix); with remove_extra_whitespaces the one of every piece until some
  // text comes out: all leading spaces, as no piece starts with two "▁"
  // (sentencepiece_refusal checks it).
  if (m.add_dummy_prefix || m.remove_extra_whitespaces)
    decoders.push_back({{"type", "Strip"},
                        {"content", " "},
                        {"start", m.remove_extra_whitespaces ? kAllLeading : 1},
                        {"stop", 0}});

  json::Value model = {{"type", "BPE"},
                       {"dropout", nullptr},
                       {"unk_token", unk},
                       {"continuing_subword_prefix", nullptr},
                       {"end_of_word_suffix", nullptr},
                       {"fuse_unk", true},  // SentencePiece gives a run of unknown characters one <unk>
                       {"byte_fallback", m.byte_fallback},
                       {"vocab", std::move(vocab)},
                       {"merges", std::move(merges)}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", std::move(added)},
          {"normalizer", {{"type", "Sequence"}, {"normalizers", std::move(normalizers)}}},
          {"pre_tokenizer", nullptr},
          {"post_processor", nullptr},
          {"decoder", {{"type", "Sequence"}, {"decoders", std::move(decoders)}}},
          {"model", std::move(model)}};
}

// LlamaTokenizer in legacy mode encodes each stretch of text between special
// tokens with SentencePiece itself (no protobuf needed); LlamaTokenizerFast
// reads tokenizer.json. Every special token is named, with null for the ones
// the model lacks: a missing key would bring LlamaTokenizer's defaults
// (<unk>, <s>, </s>), which the model may not have.
json::Value sentencepiece_tokenizer_config(const Model& m) {
  json::Value decoder = json::Value::object();
  json::Value extra = json::Value::array();
  std::string unk;
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const Model::Piece& p = m.pieces[i];
    if (p.type != Model::kControl && p.type != Model::kUnknown) continue;
    json::Value t = special_token(int(i), p.text);
    t.erase("id");
    decoder[std::to_string(i)] = std::move(t);
    if (p.type == Model::kUnknown) unk = p.text;
    else if (int(i) != m.bos_id && int(i) != m.eos_id && int(i) != m.pad_id) extra.push_back(p.text);
  }
  json::Value j = {{"tokenizer_class", "LlamaTokenizer"},
                   {"legacy", true},
                   {"add_bos_token", false},
                   {"add_eos_token", false},
                   {"clean_up_tokenization_spaces", false},
                   {"unk_token", unk},
                   {"bos_token", control_piece(m, m.bos_id)},
                   {"eos_token", control_piece(m, m.eos_id)},
                   {"pad_token", control_piece(m, m.pad_id)}};
  if (!extra.empty()) j["additional_special_tokens"] = std::move(extra);
  j["added_tokens_decoder"] = std::move(decoder);
  return j;
}

// Every character is no piece of this vocabulary, so byte fallback spells
// each of its UTF-8 bytes as the token <0xNN>, id NN; decoding joins them.
json::Value byte_tokenizer_json() {
  json::Value vocab = json::Value::object();
  for (int b = 0; b < 256; ++b) vocab[byte_piece(b)] = b;
  json::Value decoders = json::Value::array({{{"type", "ByteFallback"}}, {{"type", "Fuse"}}});
  json::Value model = {{"type", "BPE"},          {"dropout", nullptr},
                       {"unk_token", nullptr},    {"continuing_subword_prefix", nullptr},
                       {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
                       {"byte_fallback", true},   {"vocab", std::move(vocab)},
                       {"merges", json::Value::array()}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", json::Value::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", nullptr},
          {"post_processor", nullptr},
          {"decoder", {{"type", "Sequence"}, {"decoders", std::move(decoders)}}},
          {"model", std::move(model)}};
}

// transformers cleans up spaces before punctuation when decoding unless
// told not to; the run's text had them.
json::Value byte_tokenizer_config() {
  return {{"tokenizer_class", "PreTrainedTokenizerFast"}, {"clean_up_tokenization_spaces", false}};
}

TokenizerExport plan_tokenizer_export(const TokenizerFiles& t) {
  TokenizerExport e;
  if (t.kind == "bytes") {
    e.write = {{"tokenizer.json", byte_tokenizer_json()}, {"tokenizer_config.json", byte_tokenizer_config()}};
    e.report = "  tokenizer: bytes -> tokenizer.json (256 byte tokens, ids = byte values), tokenizer_config.json "
               "(PreTrainedTokenizerFast)\n";
    return e;
  }
  e.report = "  tokenizer: " + t.kind + " from " + t.dir + " -> ";
  if (t.kind != "sentencepiece") {
    e.copy = t.all;
    e.write = {{"tokenizer_config.json", byte_tokenizer_config()}};
    e.report += "tokenizer.json as given, tokenizer_config.json (PreTrainedTokenizerFast)\n";
    return e;
  }
  const SentencePieceModel m = read_sentencepiece_model(t.file);
  const std::string refused = sentencepiece_refusal(m);
  bool data_json = false;
  for (const std::string& f : t.all) {
    const bool is_json = fs::path(f).filename() == "tokenizer.json";
    data_json = data_json || is_json;
    if (!is_json || !refused.empty()) e.copy.push_back(f);  // a written tokenizer.json follows the model the run used
  }
  e.write = {{"tokenizer_config.json", sentencepiece_tokenizer_config(m)}};
  if (refused.empty()) {
    e.write.emplace_back("tokenizer.json", sentencepiece_tokenizer_json(m));
    e.report += "tokenizer.model, tokenizer.json (" + std::string(model_type_name(m.model_type)) +
                (m.byte_fallback ? ", byte fallback" : "") + ", written from the model" +
                (data_json ? " instead of the data's" : "") +
                "), tokenizer_config.json (LlamaTokenizer): both AutoTokenizer paths encode as SentencePiece\n";
    return e;
  }
  e.report += "tokenizer.model, tokenizer_config.json (LlamaTokenizer)" +
              std::string(data_json ? ", the data's tokenizer.json as given (not checked against the model)" : "") +
              "\n  note: no tokenizer.json written from " + t.file + ": " + refused +
              ". AutoTokenizer.from_pretrained(DIR, use_fast=False) encodes as SentencePiece" +
              (data_json ? "" : "; the default fast tokenizer would be converted by transformers (needs protobuf) "
                                "and may encode differently") +
              "\n";
  return e;
}

void write_tokenizer_export(const TokenizerExport& e, const std::string& out_dir) {
  const fs::path out(out_dir);
  for (const std::string& f : e.copy) {
    std::error_code ec;
    fs::copy_file(f, out / fs::path(f).filename(), fs::copy_options::overwrite_existing, ec);
    if (ec) throw std::runtime_error(f + ": cannot copy it into " + out_dir + ": " + ec.message());
  }
  for (const auto& [name, j] : e.write) write_text(out / name, json::dump(j, 2) + "\n");
}

}  // namespace trainer
