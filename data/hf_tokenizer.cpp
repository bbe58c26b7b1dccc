// A Hugging Face tokenizer.json, read with nlohmann/json: its vocabulary
// size, and decoding for the decoders byte-level BPE (GPT-2 style) and
// SentencePiece conversions (Metaspace, or a Sequence of Replace "▁" -> " ",
// ByteFallback, Fuse, Strip) use. Encoding is not built in: it needs the
// pre-tokenizer's Unicode regex and the merges, so the prompt is token ids.
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "data/tokenizer.h"

namespace trainer {

namespace {

using nlohmann::json;

json read_json(const std::string& file) {
  try {
    std::ifstream in(file);
    if (!in) throw std::runtime_error("cannot open it");
    return json::parse(in);
  } catch (const std::exception& e) {
    throw std::runtime_error(file + ": not a Hugging Face tokenizer.json (" + e.what() + ")");
  }
}

// The largest token id taken. Published vocabularies stay under a million
// ids; the table below is indexed by id, so an id is what it allocates, and
// one mistyped or hostile id of 2^32 would ask for a hundred GiB.
constexpr int64_t kMaxTokenId = (int64_t(1) << 22) - 1;

// id -> token text, from model.vocab (an object piece -> id for BPE and
// WordPiece, a list of [piece, score] for Unigram) and added_tokens.
std::vector<std::string> pieces_of(const json& j, const std::string& file) {
  std::vector<std::string> pieces;
  const char* where = "model.vocab";
  auto put = [&](int64_t id, const std::string& piece) {
    if (id < 0) return;
    if (id > kMaxTokenId)
      throw std::runtime_error(file + ": token id " + std::to_string(id) + " in " + where + " is over " +
                               std::to_string(kMaxTokenId) + ", the largest id this reader takes");
    if (int64_t(pieces.size()) <= id) pieces.resize(size_t(id + 1));
    pieces[size_t(id)] = piece;
  };
  if (j.contains("model") && j["model"].is_object() && j["model"].contains("vocab")) {
    const json& v = j["model"]["vocab"];
    if (v.is_object())
      for (const auto& [piece, id] : v.items())
        if (id.is_number_integer()) put(id.get<int64_t>(), piece);
    if (v.is_array())
      for (size_t i = 0; i < v.size(); ++i)
        put(int64_t(i), v[i].is_array() && !v[i].empty() && v[i][0].is_string() ? v[i][0].get<std::string>() : "");
  }
  where = "added_tokens";
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const json& t : j["added_tokens"])
      if (t.contains("id") && t["id"].is_number_integer() && t.contains("content") && t["content"].is_string())
        put(t["id"].get<int64_t>(), t["content"].get<std::string>());
  return pieces;
}

void append_utf8(std::string& s, uint32_t c) {
  if (c < 0x80) {
    s += char(c);
  } else if (c < 0x800) {
    s += char(0xC0 | (c >> 6));
    s += char(0x80 | (c & 0x3F));
  } else {
    s += char(0xE0 | (c >> 12));
    s += char(0x80 | ((c >> 6) & 0x3F));
    s += char(0x80 | (c & 0x3F));
  }
}

// GPT-2's byte <-> printable character table: printable Latin-1 bytes map
// to themselves, the other 68 to U+0100 onwards. Key: the character's UTF-8.
std::unordered_map<std::string, char> byte_decoder() {
  std::unordered_map<std::string, char> m;
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    std::string ch;
    append_utf8(ch, printable ? b : next++);
    m[ch] = char(b);
  }
  return m;
}

size_t utf8_length(unsigned char lead) { return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; }

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
}

// "<0x0A>" -> '\n' (SentencePiece byte pieces); -1 when it is not one.
int byte_piece(const std::string& p) {
  if (p.size() != 6 || p.compare(0, 3, "<0x") != 0 || p[5] != '>') return -1;
  return std::stoi(p.substr(3, 2), nullptr, 16);
}

class HuggingFaceTokenizer final : public Tokenizer {
 public:
  explicit HuggingFaceTokenizer(const std::string& json_file) {
    file = json_file;
    const json j = read_json(json_file);
    pieces_ = pieces_of(j, json_file);
    if (pieces_.empty()) throw std::runtime_error(json_file + ": no vocabulary found (model.vocab, added_tokens)");
    if (j.contains("added_tokens") && j["added_tokens"].is_array())
      for (const json& t : j["added_tokens"])
        if (t.value("special", false) && t.contains("id") && t["id"].is_number_integer())
          special_.push_back(t["id"].get<int64_t>());
    const json d = j.contains("decoder") ? j["decoder"] : json();
    const std::vector<json> steps = d.is_object() && d.value("type", "") == "Sequence" && d.contains("decoders")
                                        ? d["decoders"].get<std::vector<json>>()
                                        : std::vector<json>{d};
    for (const json& s : steps) {
      const std::string type = s.is_object() ? s.value("type", "") : "";
      if (type == "ByteLevel") {
        byte_level_ = true;
      } else if (type == "Metaspace") {
        replace_.push_back({s.value("replacement", "\u2581"), " "});
        strip_start_ = s.value("prepend_scheme", s.value("add_prefix_space", true) ? "always" : "never") != "never";
      } else if (type == "Replace" && s.contains("pattern") && s["pattern"].contains("String")) {
        replace_.push_back({s["pattern"]["String"].get<std::string>(), s.value("content", "")});
      } else if (type == "ByteFallback") {
        byte_fallback_ = true;
      } else if (type == "Strip") {
        strip_start_ = s.value("start", 0) > 0;
      } else if (type == "WordPiece") {
        wordpiece_prefix_ = s.value("prefix", "##");
      } else if (!type.empty() && type != "Fuse") {
        warning = json_file + ": decoder '" + type + "' is not built in: its tokens are joined as they are";
      }
    }
    if (warning.empty())
      warning = json_file + ": the trainer decodes but does not encode Hugging Face tokenizers: a prompt must be "
                            "token ids (numbers separated by spaces)";
  }
  std::string kind() const override { return "huggingface"; }
  int64_t vocab_size() const override { return int64_t(pieces_.size()); }
  bool encodes_text() const override { return false; }
  std::vector<int32_t> encode(const std::string& text) const override {
    return id_tokenizer(vocab_size())->encode(text);
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    static const std::unordered_map<std::string, char> bytes = byte_decoder();
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      const int32_t id = ids[i];
      if (id < 0 || id >= int32_t(pieces_.size())) {
        out.append(1, '<').append(std::to_string(id)).append(1, '>');
        continue;
      }
      std::string p = pieces_[size_t(id)];
      const bool special = std::find(special_.begin(), special_.end(), id) != special_.end();
      if (special) {
        out += p;
        continue;
      }
      if (byte_level_) {
        std::string raw;
        for (size_t k = 0; k < p.size();) {
          const size_t n = std::min(utf8_length((unsigned char)p[k]), p.size() - k);
          const auto it = bytes.find(p.substr(k, n));
          raw += it != bytes.end() ? std::string(1, it->second) : p.substr(k, n);
          k += n;
        }
        p = raw;
      }
      if (byte_fallback_ && byte_piece(p) >= 0) {
        out += char(byte_piece(p));
        continue;
      }
      if (!wordpiece_prefix_.empty()) {
        if (p.rfind(wordpiece_prefix_, 0) == 0)
          p = p.substr(wordpiece_prefix_.size());
        else if (!out.empty())
          p = " " + p;
      }
      for (const auto& [from, to] : replace_) replace_all(p, from, to);
      out += p;
    }
    if (strip_start_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
  }

 private:
  std::vector<std::string> pieces_;
  std::vector<int64_t> special_;
  bool byte_level_ = false, byte_fallback_ = false, strip_start_ = false;
  std::vector<std::pair<std::string, std::string>> replace_;
  std::string wordpiece_prefix_;
};

}  // namespace

int64_t huggingface_vocab_size(const std::string& json_file) {
  const size_t n = pieces_of(read_json(json_file), json_file).size();
  if (n == 0) throw std::runtime_error(json_file + ": no vocabulary found (model.vocab, added_tokens)");
  return int64_t(n);
}

std::unique_ptr<Tokenizer> huggingface_tokenizer(const std::string& json_file) {
  return std::make_unique<HuggingFaceTokenizer>(json_file);
}

}  // namespace trainer
