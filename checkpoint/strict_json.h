// JSON for checkpoint manifests, the multi-rank save reports and safetensors
// headers, on nlohmann/json, with what its defaults do not give:
//  - a document with a duplicate key is refused: nlohmann keeps the last one
//    silently, so a damaged or hand-edited manifest could change meaning
//    without any error;
//  - typed reads that refuse what get<>() would convert silently (1.5 read as
//    an integer, -1 as a byte count), with errors naming the key.
// Objects keep insertion order (ordered_json), so a manifest reads in the
// order it was built. Integers stay exact (int64 and uint64): steps, token
// counts, seeds and byte offsets must survive a round trip bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace trainer::json {

using Value = nlohmann::ordered_json;

// Thrown by parse(); `offset` is the byte offset into the parsed text of the
// last character read, when the parser knows it.
class ParseError : public std::runtime_error {
 public:
  ParseError(std::string reason, std::optional<size_t> offset);
  const std::string& reason() const { return reason_; }
  std::optional<size_t> offset() const { return offset_; }

 private:
  std::string reason_;
  std::optional<size_t> offset_;
};

// Thrown by the typed reads when a value is absent, of the wrong type or out
// of range; the caller adds which file it was reading.
class TypeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// RFC 8259 (no comments, trailing commas, NaN, invalid UTF-8 or lone
// surrogates), one value surrounded only by whitespace, no duplicate object
// keys (the error names the key and where it is), nesting at most max_depth.
Value parse(std::string_view text, int max_depth = 256);

// indent < 0: compact, one line; otherwise pretty with that many spaces.
// Invalid UTF-8 in strings is written as U+FFFD: the output must always be
// something parse() accepts, or a manifest could become unreadable.
std::string dump(const Value& v, int indent = -1);

// Object member; TypeError "missing key \"k\"" when absent.
const Value& at(const Value& object, std::string_view key);
// Object member or nullptr (also when `object` is not an object).
const Value* find(const Value& object, std::string_view key);

int64_t as_int64(const Value& v);    // integers only (not 2.0), within int64
uint64_t as_uint64(const Value& v);  // non-negative integers only
const std::string& as_string(const Value& v);
// `v` itself, once checked to be an array / object (to iterate over).
const Value& as_array(const Value& v);
const Value& as_object(const Value& v);
std::vector<int64_t> as_int64_list(const Value& v);

Value int_array(const std::vector<int64_t>& v);

}  // namespace trainer::json
