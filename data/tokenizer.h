// The tokenizer of a dataset: what turns the ids of the token files back into
// text and a prompt into ids. scripts/prepare_text.py writes it next to the
// data: tokenizer.model (SentencePiece) and/or tokenizer.json (Hugging Face),
// and tokenizer_info.json (kind, vocab size, bos/eos ids, dtype, hashes).
//
// Kinds the binary reads:
//   bytes          vocabulary 256, one byte per id (no file; tokenizer_info.json
//                  says "bytes")
//   sentencepiece  tokenizer.model through libsentencepiece (encode and
//                  decode). A build without the library reads the vocabulary
//                  size from tokenizer_info.json and falls back to ids.
//   huggingface    tokenizer.json (data/hf_tokenizer.cpp): its vocabulary size
//                  (model.vocab and added_tokens) and decoding (byte-level
//                  BPE, SentencePiece-style Metaspace / byte fallback); no
//                  encoding: a prompt is token ids (a warning says so).
//   ids            no tokenizer at all: ids are printed as numbers and a
//                  prompt must be a list of numbers.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace trainer {

// What a directory holds (paths, not loaded yet).
struct TokenizerFiles {
  std::string dir;
  std::string info;    // tokenizer_info.json ("" if absent)
  std::string kind;    // bytes | sentencepiece | huggingface
  std::string file;    // tokenizer.model or tokenizer.json ("" for bytes)
  std::vector<std::string> all;  // every file to copy with it, info included
  int64_t info_vocab = 0;        // tokenizer_info.json's vocab_size (0 if absent)
  std::string info_dtype;        // tokenizer_info.json's dtype ("" if absent)
};

// The tokenizer in `dir`, if any: tokenizer_info.json decides the kind; without
// it tokenizer.model, then tokenizer.json. Throws std::runtime_error naming the
// file when tokenizer_info.json does not parse, or names a file that is missing.
std::optional<TokenizerFiles> find_tokenizer(const std::string& dir);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string kind() const = 0;
  virtual int64_t vocab_size() const = 0;  // 0: unknown
  virtual bool encodes_text() const { return true; }
  // Throws std::runtime_error when the text cannot be encoded (ids: not numbers).
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  std::string file;    // where it was loaded from ("" for bytes and ids)
  std::string warning; // why text falls back to ids ("" when it does not)
};

// Loads what find_tokenizer found; throws std::runtime_error naming the file
// when it does not load.
std::unique_ptr<Tokenizer> load_tokenizer(const TokenizerFiles& files);
std::unique_ptr<Tokenizer> byte_tokenizer();
std::unique_ptr<Tokenizer> id_tokenizer(int64_t vocab_size, std::string warning = "");
// Whether this binary was built with libsentencepiece.
bool have_sentencepiece();

// SentencePiece (data/sentencepiece_tokenizer.cpp); throws without the library.
std::unique_ptr<Tokenizer> sentencepiece_tokenizer(const std::string& model_file);
// A Hugging Face tokenizer.json and its vocabulary size (data/hf_tokenizer.cpp);
// both throw std::runtime_error naming the file when it does not parse.
std::unique_ptr<Tokenizer> huggingface_tokenizer(const std::string& json_file);
int64_t huggingface_vocab_size(const std::string& json_file);

}  // namespace trainer
