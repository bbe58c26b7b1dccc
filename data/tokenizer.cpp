#include "data/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace trainer {

namespace fs = std::filesystem;

namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::string kind() const override { return "bytes"; }
  int64_t vocab_size() const override { return 256; }
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  // Control characters other than newline and tab would move the terminal's
  // cursor: shown as '?'. Other bytes pass, so UTF-8 text reads as text.
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    for (int32_t t : ids) {
      const unsigned char c = (unsigned char)t;
      s += (c == '\n' || c == '\t' || (c >= 32 && c != 127)) ? char(c) : '?';
    }
    return s;
  }
};

class IdTokenizer final : public Tokenizer {
 public:
  explicit IdTokenizer(int64_t v) : vocab_(v) {}
  std::string kind() const override { return "ids"; }
  int64_t vocab_size() const override { return vocab_; }
  bool encodes_text() const override { return false; }
  std::vector<int32_t> encode(const std::string& text) const override {
    std::istringstream in(text);
    std::vector<int32_t> ids;
    std::string word;
    while (in >> word) {
      size_t used = 0;
      long long v = -1;
      try {
        v = std::stoll(word, &used);
      } catch (const std::exception&) {
      }
      if (used != word.size() || v < 0 || (vocab_ > 0 && v >= vocab_))
        throw std::runtime_error("without a tokenizer the prompt must be token ids (numbers below " +
                                 std::to_string(vocab_) + " separated by spaces); '" + word + "' is not one");
      ids.push_back(int32_t(v));
    }
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    for (size_t i = 0; i < ids.size(); ++i) s.append(i ? " " : "").append(std::to_string(ids[i]));
    return s;
  }

 private:
  int64_t vocab_;
};

}  // namespace

std::optional<TokenizerFiles> find_tokenizer(const std::string& dir) {
  TokenizerFiles f;
  f.dir = dir.empty() ? "." : dir;
  const fs::path d(f.dir);
  const fs::path info = d / "tokenizer_info.json";
  std::error_code ec;
  if (fs::is_regular_file(info, ec)) {
    f.info = info.string();
    nlohmann::json j;
    try {
      std::ifstream in(info);
      j = nlohmann::json::parse(in);
      f.kind = j.at("kind").get<std::string>();
      f.info_vocab = j.value("vocab_size", int64_t(0));
      f.info_dtype = j.value("dtype", std::string());
    } catch (const std::exception& e) {
      throw std::runtime_error(f.info + ": not a tokenizer_info.json (" + e.what() + ")");
    }
    f.all.push_back(f.info);
    if (f.kind == "sentencepiece" || f.kind == "huggingface") {
      f.file = (d / (f.kind == "sentencepiece" ? "tokenizer.model" : "tokenizer.json")).string();
      if (!fs::is_regular_file(f.file, ec))
        throw std::runtime_error(f.info + " names a " + f.kind + " tokenizer, but " + f.file + " is missing");
    } else if (f.kind != "bytes") {
      throw std::runtime_error(f.info + ": unknown tokenizer kind '" + f.kind +
                               "' (bytes, sentencepiece or huggingface)");
    }
    // A SentencePiece dataset may carry a tokenizer.json too: both travel.
    for (const char* other : {"tokenizer.model", "tokenizer.json"})
      if (fs::is_regular_file(d / other, ec)) f.all.push_back((d / other).string());
    return f;
  }
  for (const auto& [name, kind] : {std::pair{"tokenizer.model", "sentencepiece"}, {"tokenizer.json", "huggingface"}})
    if (fs::is_regular_file(d / name, ec)) {
      f.kind = kind;
      f.file = (d / name).string();
      for (const char* other : {"tokenizer.model", "tokenizer.json"})
        if (fs::is_regular_file(d / other, ec)) f.all.push_back((d / other).string());
      return f;
    }
  return std::nullopt;
}

std::unique_ptr<Tokenizer> byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> id_tokenizer(int64_t vocab_size, std::string warning) {
  auto t = std::make_unique<IdTokenizer>(vocab_size);
  t->warning = std::move(warning);
  return t;
}

std::unique_ptr<Tokenizer> load_tokenizer(const TokenizerFiles& f) {
  if (f.kind == "bytes") return byte_tokenizer();
  if (f.kind == "sentencepiece") {
    if (have_sentencepiece()) return sentencepiece_tokenizer(f.file);
    auto t = id_tokenizer(f.info_vocab, f.file + ": this trainer was built without libsentencepiece "
                                                 "(apt-get install libsentencepiece-dev and rebuild): showing token ids");
    t->file = f.file;
    return t;
  }
  return huggingface_tokenizer(f.file);
}

}  // namespace trainer
