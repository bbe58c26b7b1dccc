#include "checkpoint/json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_set>

namespace trainer::json {

const char* type_name(Type t) {
  switch (t) {
    case Type::Null: return "null";
    case Type::Bool: return "bool";
    case Type::Number: return "number";
    case Type::String: return "string";
    case Type::Array: return "array";
    case Type::Object: return "object";
  }
  return "?";
}

ParseError::ParseError(std::string reason, size_t offset)
    : std::runtime_error(reason + " at byte " + std::to_string(offset)),
      reason_(std::move(reason)),
      offset_(offset) {}

// ---------------------------------------------------------------------------
// Value

Type Value::type() const {
  switch (v_.index()) {
    case 0: return Type::Null;
    case 1: return Type::Bool;
    case 2: case 3: case 4: return Type::Number;
    case 5: return Type::String;
    case 6: return Type::Array;
    default: return Type::Object;
  }
}

bool Value::is_integer() const { return v_.index() == 2 || v_.index() == 3; }

static TypeError wrong_type(const char* wanted, Type got) {
  return TypeError(std::string("expected ") + wanted + ", got " + type_name(got));
}

bool Value::as_bool() const {
  if (auto* b = std::get_if<bool>(&v_)) return *b;
  throw wrong_type("a bool", type());
}

double Value::as_double() const {
  if (auto* i = std::get_if<int64_t>(&v_)) return double(*i);
  if (auto* u = std::get_if<uint64_t>(&v_)) return double(*u);
  if (auto* d = std::get_if<double>(&v_)) return *d;
  throw wrong_type("a number", type());
}

int64_t Value::as_int64() const {
  if (auto* i = std::get_if<int64_t>(&v_)) return *i;
  if (auto* u = std::get_if<uint64_t>(&v_))
    throw TypeError("integer " + std::to_string(*u) + " does not fit in int64");
  if (std::holds_alternative<double>(v_)) throw TypeError("expected an integer, got a fractional number");
  throw wrong_type("an integer", type());
}

uint64_t Value::as_uint64() const {
  if (auto* i = std::get_if<int64_t>(&v_)) {
    if (*i < 0) throw TypeError("expected a non-negative integer, got " + std::to_string(*i));
    return uint64_t(*i);
  }
  if (auto* u = std::get_if<uint64_t>(&v_)) return *u;
  if (std::holds_alternative<double>(v_)) throw TypeError("expected an integer, got a fractional number");
  throw wrong_type("an integer", type());
}

const std::string& Value::as_string() const {
  if (auto* s = std::get_if<std::string>(&v_)) return *s;
  throw wrong_type("a string", type());
}

const Array& Value::as_array() const {
  if (auto* a = std::get_if<Array>(&v_)) return *a;
  throw wrong_type("an array", type());
}

Array& Value::as_array() {
  if (auto* a = std::get_if<Array>(&v_)) return *a;
  throw wrong_type("an array", type());
}

const Object& Value::as_object() const {
  if (auto* o = std::get_if<Object>(&v_)) return *o;
  throw wrong_type("an object", type());
}

Object& Value::as_object() {
  if (auto* o = std::get_if<Object>(&v_)) return *o;
  throw wrong_type("an object", type());
}

const Value* Value::find(std::string_view key) const {
  auto* o = std::get_if<Object>(&v_);
  if (!o) return nullptr;
  for (const auto& [k, v] : *o)
    if (k == key) return &v;
  return nullptr;
}

const Value& Value::at(std::string_view key) const {
  if (!is_object()) throw wrong_type("an object", type());
  if (const Value* v = find(key)) return *v;
  throw TypeError("missing key \"" + std::string(key) + "\"");
}

Value& Value::operator[](std::string_view key) {
  if (is_null()) v_ = Object{};
  Object& o = as_object();
  for (auto& [k, v] : o)
    if (k == key) return v;
  o.emplace_back(std::string(key), Value());
  return o.back().second;
}

void Value::push_back(Value v) {
  if (is_null()) v_ = Array{};
  as_array().push_back(std::move(v));
}

// ---------------------------------------------------------------------------
// UTF-8

// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is not
// valid (overlong forms, surrogates and code points above U+10FFFF are not).
static size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return (unsigned char)s[i + k]; };
  const size_t left = s.size() - i;
  const unsigned c = b(0);
  if (c < 0x80) return 1;
  const auto cont = [&](size_t k) { return k < left && (b(k) & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && b(1) < 0xA0) return 0;  // overlong
    if (c == 0xED && b(1) > 0x9F) return 0;  // UTF-16 surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xF0 && b(1) < 0x90) return 0;  // overlong
    if (c == 0xF4 && b(1) > 0x8F) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

static void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// ---------------------------------------------------------------------------
// Writer

static void write_string(std::string& out, std::string_view s) {
  static const char* hex = "0123456789abcdef";
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = (unsigned char)s[i];
    if (c >= 0x80) {
      const size_t n = utf8_sequence_length(s, i);
      if (n == 0) {
        out += "\xEF\xBF\xBD";  // U+FFFD
        ++i;
      } else {
        out.append(s.substr(i, n));
        i += n;
      }
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += char(c);
        }
    }
    ++i;
  }
  out += '"';
}

static void write_double(std::string& out, double d) {
  if (!std::isfinite(d)) throw TypeError("JSON cannot represent " + std::to_string(d));
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d);  // shortest form that round-trips
  std::string_view s(buf, size_t(r.ptr - buf));
  out += s;
  // Keep it a double on re-parse: "2" would come back as an integer.
  if (s.find_first_of(".eE") == std::string_view::npos) out += ".0";
}

namespace {
struct Writer {
  std::string& out;
  int indent;

  void newline(int depth) {
    if (indent < 0) return;
    out += '\n';
    out.append(size_t(depth) * size_t(indent), ' ');
  }

  void value(const Value& v, int depth) {
    switch (v.type()) {
      case Type::Null: out += "null"; return;
      case Type::Bool: out += v.as_bool() ? "true" : "false"; return;
      case Type::String: write_string(out, v.as_string()); return;
      case Type::Number:
        if (!v.is_integer()) write_double(out, v.as_double());
        else if (v.as_double() < 0) out += std::to_string(v.as_int64());
        else out += std::to_string(v.as_uint64());
        return;
      case Type::Array: {
        const Array& a = v.as_array();
        if (a.empty()) { out += "[]"; return; }
        // Arrays of scalars (shapes, offsets) stay on one line even when pretty.
        bool flat = true;
        for (const Value& e : a) flat = flat && !e.is_array() && !e.is_object();
        out += '[';
        for (size_t i = 0; i < a.size(); ++i) {
          if (i) out += flat && indent >= 0 ? ", " : ",";
          if (!flat) newline(depth + 1);
          value(a[i], depth + 1);
        }
        if (!flat) newline(depth);
        out += ']';
        return;
      }
      case Type::Object: {
        const Object& o = v.as_object();
        if (o.empty()) { out += "{}"; return; }
        out += '{';
        for (size_t i = 0; i < o.size(); ++i) {
          if (i) out += ',';
          newline(depth + 1);
          write_string(out, o[i].first);
          out += indent >= 0 ? ": " : ":";
          value(o[i].second, depth + 1);
        }
        newline(depth);
        out += '}';
        return;
      }
    }
  }
};
}  // namespace

std::string dump(const Value& v, int indent) {
  std::string out;
  Writer{out, indent}.value(v, 0);
  return out;
}

// ---------------------------------------------------------------------------
// Parser

namespace {
class Parser {
 public:
  Parser(std::string_view s, int max_depth) : s_(s), max_depth_(max_depth) {}

  Value document() {
    skip_ws();
    Value v = value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected " + describe_here() + " after the JSON value");
    return v;
  }

 private:
  std::string_view s_;
  size_t pos_ = 0;
  int max_depth_;

  [[noreturn]] void fail(const std::string& why) const { throw ParseError(why, pos_); }
  [[noreturn]] void fail_at(const std::string& why, size_t at) const { throw ParseError(why, at); }

  std::string describe_here() const {
    if (pos_ >= s_.size()) return "end of input";
    const unsigned char c = (unsigned char)s_[pos_];
    if (c >= 0x21 && c < 0x7F) return std::string("'") + char(c) + "'";
    char buf[16];
    std::snprintf(buf, sizeof buf, "byte 0x%02x", c);
    return buf;
  }

  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }

  void expect_literal(std::string_view lit) {
    if (s_.substr(pos_, lit.size()) != lit) fail("invalid literal (expected '" + std::string(lit) + "')");
    pos_ += lit.size();
  }

  Value value(int depth) {
    if (pos_ >= s_.size()) fail("unexpected end of input, expected a value");
    switch (s_[pos_]) {
      case '{': return object(depth);
      case '[': return array(depth);
      case '"': return Value(string());
      case 't': expect_literal("true"); return Value(true);
      case 'f': expect_literal("false"); return Value(false);
      case 'n': expect_literal("null"); return Value(nullptr);
      default:
        if (s_[pos_] == '-' || (s_[pos_] >= '0' && s_[pos_] <= '9')) return number();
        fail("unexpected " + describe_here() + ", expected a value");
    }
  }

  void enter(int depth) {
    if (depth >= max_depth_) fail("nesting deeper than " + std::to_string(max_depth_) + " levels");
  }

  Value object(int depth) {
    enter(depth);
    ++pos_;  // '{'
    Object o;
    std::unordered_set<std::string> seen;
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return Value(std::move(o)); }
    while (true) {
      skip_ws();
      if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a string key, got " + describe_here());
      const size_t key_at = pos_;
      std::string key = string();
      if (!seen.insert(key).second) fail_at("duplicate key \"" + key + "\"", key_at);
      skip_ws();
      if (pos_ >= s_.size() || s_[pos_] != ':') fail("expected ':' after key, got " + describe_here());
      ++pos_;
      skip_ws();
      Value v = value(depth + 1);
      o.emplace_back(std::move(key), std::move(v));
      skip_ws();
      if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
      if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return Value(std::move(o)); }
      fail("expected ',' or '}' in object, got " + describe_here());
    }
  }

  Value array(int depth) {
    enter(depth);
    ++pos_;  // '['
    Array a;
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return Value(std::move(a)); }
    while (true) {
      skip_ws();
      a.push_back(value(depth + 1));
      skip_ws();
      if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
      if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return Value(std::move(a)); }
      fail("expected ',' or ']' in array, got " + describe_here());
    }
  }

  uint32_t hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[pos_];
      uint32_t d;
      if (c >= '0' && c <= '9') d = uint32_t(c - '0');
      else if (c >= 'a' && c <= 'f') d = uint32_t(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') d = uint32_t(c - 'A' + 10);
      else fail("invalid hex digit in \\u escape");
      v = v * 16 + d;
      ++pos_;
    }
    return v;
  }

  std::string string() {
    const size_t start = pos_;
    ++pos_;  // '"'
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail_at("unterminated string", start);
      const unsigned char c = (unsigned char)s_[pos_];
      if (c == '"') { ++pos_; return out; }
      if (c < 0x20) fail("unescaped control character in string");
      if (c >= 0x80) {
        const size_t n = utf8_sequence_length(s_, pos_);
        if (n == 0) fail("invalid UTF-8 in string");
        out.append(s_.substr(pos_, n));
        pos_ += n;
        continue;
      }
      if (c != '\\') { out += char(c); ++pos_; continue; }
      const size_t esc_at = pos_;
      ++pos_;
      if (pos_ >= s_.size()) fail_at("unterminated string", start);
      const char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail_at("lone low surrogate in \\u escape", esc_at);
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.substr(pos_, 2) != "\\u") fail_at("high surrogate not followed by a low surrogate", esc_at);
            pos_ += 2;
            const uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail_at("high surrogate not followed by a low surrogate", esc_at);
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default: fail_at(std::string("invalid escape '\\") + e + "'", esc_at);
      }
    }
  }

  Value number() {
    const size_t start = pos_;
    const auto digit = [&] { return pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9'; };
    if (s_[pos_] == '-') ++pos_;
    if (!digit()) fail("expected a digit");
    if (s_[pos_] == '0') {
      ++pos_;
      if (digit()) fail_at("leading zero in number", start);
    } else {
      while (digit()) ++pos_;
    }
    bool integral = true;
    if (pos_ < s_.size() && s_[pos_] == '.') {
      integral = false;
      ++pos_;
      if (!digit()) fail("expected a digit after '.'");
      while (digit()) ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      integral = false;
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (!digit()) fail("expected a digit in exponent");
      while (digit()) ++pos_;
    }
    const char* first = s_.data() + start;
    const char* last = s_.data() + pos_;
    if (integral) {
      int64_t i;
      auto r = std::from_chars(first, last, i);
      if (r.ec == std::errc() && r.ptr == last) return Value(i);
      if (*first != '-') {
        uint64_t u;
        r = std::from_chars(first, last, u);
        if (r.ec == std::errc() && r.ptr == last) return Value(u);
      }
      // Beyond 64 bits: keep the magnitude as a double, like most parsers.
    }
    double d;
    auto r = std::from_chars(first, last, d);
    if (r.ptr != last) fail_at("malformed number", start);
    if (r.ec == std::errc::result_out_of_range) {
      // from_chars also reports underflow, without telling which; strtod does.
      // Too small for a double is zero (or a denormal); too large is an error.
      const std::string copy(first, last);
      d = std::strtod(copy.c_str(), nullptr);
      if (std::isinf(d)) fail_at("number out of range", start);
    }
    return Value(d);
  }
};
}  // namespace

Value parse(std::string_view text, int max_depth) { return Parser(text, max_depth).document(); }

}  // namespace trainer::json
