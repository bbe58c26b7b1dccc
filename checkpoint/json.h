// A small JSON value, writer and strict parser for checkpoint manifests and
// safetensors headers. Integers are kept exact (int64, and uint64 above
// INT64_MAX) because steps, token counts, seeds and byte offsets must survive a
// round trip bit for bit; a double would silently round above 2^53.
// Objects keep insertion order so manifests read in the order they were built.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace trainer::json {

class Value;
using Array = std::vector<Value>;
using Object = std::vector<std::pair<std::string, Value>>;

enum class Type : uint8_t { Null, Bool, Number, String, Array, Object };
const char* type_name(Type t);

// Thrown by parse(); `offset` is the byte offset into the parsed text.
class ParseError : public std::runtime_error {
 public:
  ParseError(std::string reason, size_t offset);
  const std::string& reason() const { return reason_; }
  size_t offset() const { return offset_; }

 private:
  std::string reason_;
  size_t offset_;
};

// Thrown by the typed accessors when a value has the wrong type or range; the
// caller adds which key of which file it was reading.
class TypeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Value {
 public:
  Value() : v_(nullptr) {}
  Value(std::nullptr_t) : v_(nullptr) {}
  Value(bool b) : v_(b) {}
  template <class T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool>)
  Value(T x) {
    if constexpr (std::is_signed_v<T>) {
      v_ = int64_t(x);
    } else if (uint64_t(x) <= uint64_t(INT64_MAX)) {
      v_ = int64_t(x);  // one representation per integer, so == compares values
    } else {
      v_ = uint64_t(x);
    }
  }
  Value(double d) : v_(d) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(std::string_view s) : v_(std::string(s)) {}
  Value(Array a) : v_(std::move(a)) {}
  Value(Object o) : v_(std::move(o)) {}

  static Value array() { return Value(Array{}); }
  static Value object() { return Value(Object{}); }

  Type type() const;
  bool is_null() const { return type() == Type::Null; }
  bool is_bool() const { return type() == Type::Bool; }
  bool is_number() const { return type() == Type::Number; }
  bool is_integer() const;  // a number written without fraction or exponent
  bool is_string() const { return type() == Type::String; }
  bool is_array() const { return type() == Type::Array; }
  bool is_object() const { return type() == Type::Object; }

  bool as_bool() const;
  double as_double() const;     // any number
  int64_t as_int64() const;     // integers only; throws when out of range
  uint64_t as_uint64() const;   // non-negative integers only
  const std::string& as_string() const;
  const Array& as_array() const;
  Array& as_array();
  const Object& as_object() const;
  Object& as_object();

  // Object lookup: nullptr when absent (or when this is not an object).
  const Value* find(std::string_view key) const;
  // Object lookup that throws TypeError naming the key when absent.
  const Value& at(std::string_view key) const;
  // Object member, appended (as null) when absent. Turns a null into an object.
  Value& operator[](std::string_view key);
  // Array append. Turns a null into an array.
  void push_back(Value v);

  friend bool operator==(const Value& a, const Value& b) { return a.v_ == b.v_; }

 private:
  std::variant<std::nullptr_t, bool, int64_t, uint64_t, double, std::string, Array, Object> v_;
};

// indent < 0: compact, one line. indent >= 0: pretty, that many spaces per
// level. Throws TypeError for NaN or infinity (JSON has no spelling for them).
// Invalid UTF-8 in strings is written as U+FFFD: the output must always be
// something parse() accepts, or a manifest could become unreadable.
std::string dump(const Value& v, int indent = -1);

// Strict RFC 8259: one value, surrounded only by whitespace; no comments,
// trailing commas, leading zeros, NaN, single quotes, invalid UTF-8, lone
// surrogates or duplicate object keys. Nesting deeper than max_depth is an
// error rather than a stack overflow.
Value parse(std::string_view text, int max_depth = 256);

}  // namespace trainer::json
