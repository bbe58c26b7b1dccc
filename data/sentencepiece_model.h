// What a SentencePiece `.model` file says, read from the protocol-buffer
// wire format of sentencepiece_model.proto (ModelProto) by hand: Debian's
// libsentencepiece ships neither protobuf nor the generated header, and
// `trainer export` must read the model in a build without the library too.
// Only the fields that decide how text becomes ids are kept; every other
// field is skipped. Absent fields take the .proto's defaults (proto2).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

struct SentencePieceModel {
  // ModelProto.SentencePiece.Type
  enum PieceType { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };
  // TrainerSpec.ModelType
  enum ModelType { kUnigram = 1, kBpe = 2, kWord = 3, kChar = 4 };

  struct Piece {
    std::string text;
    float score = 0;
    int type = kNormal;
  };
  std::vector<Piece> pieces;  // index = id

  // TrainerSpec
  int model_type = kUnigram;
  bool byte_fallback = false;
  bool treat_whitespace_as_suffix = false;
  int unk_id = 0, bos_id = 1, eos_id = 2, pad_id = -1;
  std::string unk_surface = " \xE2\x81\x87 ";  // " ⁇ ", what decoding shows for <unk>

  // NormalizerSpec
  std::string normalizer_name;
  size_t charsmap_bytes = 0;  // precompiled_charsmap: empty means no character rewriting
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
  // denormalizer_spec's precompiled_charsmap (rules decoding applies)
  size_t denormalizer_charsmap_bytes = 0;
};

const char* piece_type_name(int type);
const char* model_type_name(int type);

// Throws std::runtime_error naming the file when it cannot be read or is not
// a ModelProto (truncated or malformed fields, no pieces).
SentencePieceModel read_sentencepiece_model(const std::string& file);
// The same from the file's bytes; `name` is what errors call it.
SentencePieceModel parse_sentencepiece_model(const std::string& bytes, const std::string& name);

}  // namespace trainer
