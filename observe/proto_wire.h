// The few protocol-buffer encodings TensorBoard's event files need, written
// by hand from the published wire format (no protobuf dependency): a field
// is a varint key (field number << 3 | wire type) followed by a varint
// (type 0), 8 little-endian bytes (type 1), a varint length and the bytes
// (type 2), or 4 little-endian bytes (type 5).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace trainer::proto {

inline void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(uint8_t(v)));
}

inline void key(std::string& out, int field, int wire_type) { varint(out, uint64_t(field) << 3 | uint64_t(wire_type)); }

// int64 fields are varints of the two's-complement value (negative: 10 bytes).
inline void int64_field(std::string& out, int field, int64_t v) {
  key(out, field, 0);
  varint(out, uint64_t(v));
}

inline void double_field(std::string& out, int field, double v) {
  key(out, field, 1);
  char b[8];
  std::memcpy(b, &v, 8);  // little-endian hosts only (data/token_file.cpp asserts it)
  out.append(b, 8);
}

inline void float_field(std::string& out, int field, float v) {
  key(out, field, 5);
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}

// Strings, bytes and embedded messages alike.
inline void bytes_field(std::string& out, int field, std::string_view v) {
  key(out, field, 2);
  varint(out, v.size());
  out.append(v);
}

}  // namespace trainer::proto
