// A SentencePiece tokenizer.model, read by hand from the protocol-buffer
// wire format (parse_sentencepiece_model takes the bytes), then what
// `trainer export` makes of it: the refusal check and, for a model it
// accepts, the tokenizer.json and tokenizer_config.json.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include "checkpoint/strict_json.h"
#include "data/sentencepiece_model.h"
#include "interop/hf_tokenizer_export.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  trainer::SentencePieceModel m;
  try {
    m = trainer::parse_sentencepiece_model(bytes, "tokenizer.model");
  } catch (const std::exception&) {
    return 0;  // runtime_error: "tokenizer.model: not a SentencePiece model (...)"
  }
  try {
    for (const auto& p : m.pieces) trainer::piece_type_name(p.type);
    trainer::model_type_name(m.model_type);
    if (trainer::sentencepiece_refusal(m).empty()) {
      trainer::json::dump(trainer::sentencepiece_tokenizer_json(m), 2);
      trainer::json::dump(trainer::sentencepiece_tokenizer_config(m), 2);
    }
  } catch (const std::exception&) {
  }
  return 0;
}
