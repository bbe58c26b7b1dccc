#include "data/sentencepiece_model.h"

#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string_view>

namespace trainer {

namespace {

// One message's fields, in order: a varint key (field << 3 | wire type),
// then a varint (0), 8 bytes (1), a varint length and that many bytes (2),
// or 4 bytes (5). Groups (3, 4) are not used by sentencepiece_model.proto.
class WireReader {
 public:
  WireReader(std::string_view bytes, const std::string& what) : in_(bytes), what_(what) {}

  bool next() {
    if (in_.empty()) return false;
    const uint64_t key = varint();
    field_ = int(key >> 3);
    wire_ = int(key & 7);
    if (field_ == 0) fail("field number 0");
    switch (wire_) {
      case 0: value_ = varint(); break;
      case 1: bytes_ = take(8); break;
      case 2: {
        const uint64_t n = varint();
        if (n > in_.size()) fail("a length past the end");
        bytes_ = take(size_t(n));
        break;
      }
      case 5: bytes_ = take(4); break;
      default: fail("wire type " + std::to_string(wire_));
    }
    return true;
  }
  int field() const { return field_; }

  int64_t as_int() {
    expect(0);
    return int64_t(value_);  // int32 fields: negative values are sign-extended to 64 bits
  }
  bool as_bool() { return as_int() != 0; }
  float as_float() {
    expect(5);
    float f;
    std::memcpy(&f, bytes_.data(), 4);  // little-endian hosts only (data/token_file.cpp asserts it)
    return f;
  }
  std::string_view as_bytes() {
    expect(2);
    return bytes_;
  }

  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error(what_ + ": not a SentencePiece model (" + why + ")");
  }

 private:
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (in_.empty()) fail("a varint past the end");
      const uint8_t b = uint8_t(in_.front());
      in_.remove_prefix(1);
      v |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    fail("a varint longer than 10 bytes");
  }
  std::string_view take(size_t n) {
    if (n > in_.size()) fail("a field past the end");
    const std::string_view s = in_.substr(0, n);
    in_.remove_prefix(n);
    return s;
  }
  void expect(int wire) const {
    if (wire_ != wire)
      fail("field " + std::to_string(field_) + " has wire type " + std::to_string(wire_) + ", expected " +
           std::to_string(wire));
  }

  std::string_view in_;
  const std::string& what_;
  int field_ = 0, wire_ = 0;
  uint64_t value_ = 0;
  std::string_view bytes_;
};

int32_t as_int32(WireReader& r) { return int32_t(r.as_int()); }

void read_piece(std::string_view bytes, const std::string& what, SentencePieceModel::Piece& p) {
  WireReader r(bytes, what);
  while (r.next()) {
    if (r.field() == 1) p.text = std::string(r.as_bytes());
    else if (r.field() == 2) p.score = r.as_float();
    else if (r.field() == 3) p.type = as_int32(r);
  }
}

void read_trainer_spec(std::string_view bytes, const std::string& what, SentencePieceModel& m) {
  WireReader r(bytes, what);
  while (r.next()) {
    switch (r.field()) {
      case 3: m.model_type = as_int32(r); break;
      case 24: m.treat_whitespace_as_suffix = r.as_bool(); break;
      case 35: m.byte_fallback = r.as_bool(); break;
      case 40: m.unk_id = as_int32(r); break;
      case 41: m.bos_id = as_int32(r); break;
      case 42: m.eos_id = as_int32(r); break;
      case 43: m.pad_id = as_int32(r); break;
      case 44: m.unk_surface = std::string(r.as_bytes()); break;
      default: break;
    }
  }
}

void read_normalizer_spec(std::string_view bytes, const std::string& what, SentencePieceModel& m) {
  WireReader r(bytes, what);
  while (r.next()) {
    switch (r.field()) {
      case 1: m.normalizer_name = std::string(r.as_bytes()); break;
      case 2: m.charsmap_bytes = r.as_bytes().size(); break;
      case 3: m.add_dummy_prefix = r.as_bool(); break;
      case 4: m.remove_extra_whitespaces = r.as_bool(); break;
      case 5: m.escape_whitespaces = r.as_bool(); break;
      default: break;
    }
  }
}

size_t charsmap_bytes_of(std::string_view bytes, const std::string& what) {
  WireReader r(bytes, what);
  size_t n = 0;
  while (r.next())
    if (r.field() == 2) n = r.as_bytes().size();
  return n;
}

}  // namespace

const char* piece_type_name(int type) {
  switch (type) {
    case SentencePieceModel::kNormal: return "normal";
    case SentencePieceModel::kUnknown: return "unknown";
    case SentencePieceModel::kControl: return "control";
    case SentencePieceModel::kUserDefined: return "user-defined";
    case SentencePieceModel::kUnused: return "unused";
    case SentencePieceModel::kByte: return "byte";
    default: return "of an unknown type";
  }
}

const char* model_type_name(int type) {
  switch (type) {
    case SentencePieceModel::kUnigram: return "Unigram";
    case SentencePieceModel::kBpe: return "BPE";
    case SentencePieceModel::kWord: return "word";
    case SentencePieceModel::kChar: return "character";
    default: return "unknown";
  }
}

SentencePieceModel parse_sentencepiece_model(const std::string& bytes, const std::string& name) {
  SentencePieceModel m;
  WireReader r(bytes, name);
  while (r.next()) {
    switch (r.field()) {
      case 1: read_piece(r.as_bytes(), name, m.pieces.emplace_back()); break;
      case 2: read_trainer_spec(r.as_bytes(), name, m); break;
      case 3: read_normalizer_spec(r.as_bytes(), name, m); break;
      case 5: m.denormalizer_charsmap_bytes = charsmap_bytes_of(r.as_bytes(), name); break;
      default: break;
    }
  }
  if (m.pieces.empty()) r.fail("no pieces");
  return m;
}

SentencePieceModel read_sentencepiece_model(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error(file + ": cannot open it");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (!in.good() && !in.eof()) throw std::runtime_error(file + ": cannot read it");
  return parse_sentencepiece_model(bytes.str(), file);
}

}  // namespace trainer
