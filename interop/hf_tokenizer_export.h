// The tokenizer files of `trainer export`: what Hugging Face's
// AutoTokenizer reads, made to encode as the run's data was encoded.
//
// SentencePiece (the run's tokenizer.model): a tokenizer.json that the fast
// tokenizer (tokenizers, no protobuf, no sentencepiece) loads directly, plus
// a tokenizer_config.json naming LlamaTokenizer in its legacy mode, whose
// slow path calls SentencePiece itself. The tokenizer.json is a BPE model:
// the model's pieces and ids as its vocabulary, merges made from the pieces
// (every split of a piece into two pieces, ordered by the piece's score:
// SentencePiece merges the adjacent pair whose union scores highest, the
// leftmost on a tie), byte fallback as the model has it, normalizers for the
// whitespace options (dummy prefix, extra whitespace removal, space -> "▁")
// and the matching decoder. The control and unknown pieces are special added
// tokens, so in text they are read as those tokens by both Hugging Face
// paths (as every Llama tokenizer does), where SentencePiece reads their
// characters; nothing adds <s> or </s> (the data has none).
//
// What cannot be written exactly is refused (sentencepiece_refusal says why)
// and only tokenizer.model and tokenizer_config.json go: Unigram, word and
// character models, character-rewriting normalization (nmt_nfkc, nfkc,
// custom rules), denormalization, whitespace not escaped or as a suffix,
// user-defined or unused pieces, BPE pieces sharing a score.
//
// Bytes (the quickstart's default): a tokenizer.json whose 256 byte tokens
// <0x00>..<0xFF> are ids 0..255, with PreTrainedTokenizerFast.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "checkpoint/strict_json.h"
#include "data/sentencepiece_model.h"
#include "data/tokenizer.h"

namespace trainer {

// "" when sentencepiece_tokenizer_json(m) encodes exactly as SentencePiece
// (control-token text aside, above); otherwise why not, in one sentence.
std::string sentencepiece_refusal(const SentencePieceModel& m);
// Requires sentencepiece_refusal(m) == "".
json::Value sentencepiece_tokenizer_json(const SentencePieceModel& m);
json::Value sentencepiece_tokenizer_config(const SentencePieceModel& m);

json::Value byte_tokenizer_json();
json::Value byte_tokenizer_config();

// What an export writes for its tokenizer: files copied from the run's
// tokenizer directory, files made here, and the report's lines. Planned
// before the model is written, so a tokenizer that does not read stops the
// export before anything is on disk.
struct TokenizerExport {
  std::vector<std::string> copy;
  std::vector<std::pair<std::string, json::Value>> write;  // file name, content
  std::string report;
};
// Throws std::runtime_error naming a tokenizer file that does not read.
TokenizerExport plan_tokenizer_export(const TokenizerFiles& t);
// Throws std::runtime_error naming a file that cannot be copied or written.
void write_tokenizer_export(const TokenizerExport& e, const std::string& out_dir);

}  // namespace trainer
