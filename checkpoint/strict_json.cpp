#include "checkpoint/strict_json.h"

#include <unordered_set>

namespace trainer::json {

namespace {

std::string with_offset(const std::string& reason, std::optional<size_t> offset) {
  return offset ? reason + " (at byte " + std::to_string(*offset) + ")" : reason;
}

// nlohmann's messages start with "[json.exception.parse_error.101] "; the
// rest ("parse error at line 1, column 6: ...") is what a reader needs.
std::string without_exception_id(const std::string& what) {
  if (what.rfind("[json.exception.", 0) == 0) {
    const size_t end = what.find("] ");
    if (end != std::string::npos) return what.substr(end + 2);
  }
  return what;
}

// Watches the parser's events to refuse duplicate keys and deep nesting.
// The path (object keys and array indices) makes the error findable in a
// manifest of thousands of lines.
class KeyChecker {
 public:
  explicit KeyChecker(int max_depth) : max_depth_(max_depth) {}

  bool on_event(nlohmann::detail::parse_event_t event, const Value& parsed) {
    using E = nlohmann::detail::parse_event_t;
    switch (event) {
      case E::object_start:
      case E::array_start:
        if (int(stack_.size()) >= max_depth_)
          throw ParseError("nesting deeper than " + std::to_string(max_depth_) + " levels", std::nullopt);
        stack_.push_back(Frame{event == E::object_start, {}, {}, 0});
        break;
      case E::key: {
        Frame& top = stack_.back();
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!top.keys.insert(key).second) {
          const std::string where = path();
          throw ParseError("duplicate key \"" + key + "\"" + (where.empty() ? "" : " in " + where), std::nullopt);
        }
        top.key = key;
        break;
      }
      case E::object_end:
      case E::array_end:
        stack_.pop_back();
        element_done();
        break;
      case E::value:
        element_done();
        break;
    }
    return true;  // keep every value
  }

 private:
  struct Frame {
    bool object;
    std::unordered_set<std::string> keys;
    std::string key;  // the member being read (objects)
    size_t index;     // the element being read (arrays)
  };

  void element_done() {
    if (!stack_.empty() && !stack_.back().object) ++stack_.back().index;
  }

  // "tensors/3/pieces/0": where the innermost object lies.
  std::string path() const {
    std::string p;
    for (size_t i = 0; i + 1 < stack_.size(); ++i)
      p += (p.empty() ? "" : "/") + (stack_[i].object ? stack_[i].key : std::to_string(stack_[i].index));
    return p;
  }

  int max_depth_;
  std::vector<Frame> stack_;
};

std::string got(const Value& v) {
  if (v.is_number_float()) return "a fractional number " + v.dump();
  if (v.is_number_integer()) return "the integer " + v.dump();
  return v.type_name();
}

}  // namespace

ParseError::ParseError(std::string reason, std::optional<size_t> offset)
    : std::runtime_error(with_offset(reason, offset)), reason_(std::move(reason)), offset_(offset) {}

Value parse(std::string_view text, int max_depth) {
  KeyChecker checker(max_depth);
  try {
    return Value::parse(
        text.begin(), text.end(),
        [&](int, nlohmann::detail::parse_event_t event, Value& parsed) { return checker.on_event(event, parsed); });
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte counts from 1 and points at the last character read.
    throw ParseError(without_exception_id(e.what()), e.byte > 0 ? std::optional<size_t>(e.byte - 1) : std::nullopt);
  } catch (const nlohmann::json::exception& e) {  // e.g. a number too large for a double
    throw ParseError(without_exception_id(e.what()), std::nullopt);
  }
}

std::string dump(const Value& v, int indent) {
  return v.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

const Value& at(const Value& object, std::string_view key) {
  if (!object.is_object()) throw TypeError("expected an object, got " + got(object));
  const auto it = object.find(key);
  if (it == object.end()) throw TypeError("missing key \"" + std::string(key) + "\"");
  return *it;
}

const Value* find(const Value& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

int64_t as_int64(const Value& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(INT64_MAX)) throw TypeError("the integer " + std::to_string(u) + " does not fit in int64");
    return int64_t(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  throw TypeError("expected an integer, got " + got(v));
}

uint64_t as_uint64(const Value& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  // Built (not parsed) values hold non-negative int64s as signed.
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return uint64_t(v.get<int64_t>());
  throw TypeError("expected a non-negative integer, got " + got(v));
}

const std::string& as_string(const Value& v) {
  if (!v.is_string()) throw TypeError("expected a string, got " + got(v));
  return v.get_ref<const std::string&>();
}

const Value& as_array(const Value& v) {
  if (!v.is_array()) throw TypeError("expected an array, got " + got(v));
  return v;
}

const Value& as_object(const Value& v) {
  if (!v.is_object()) throw TypeError("expected an object, got " + got(v));
  return v;
}

std::vector<int64_t> as_int64_list(const Value& v) {
  std::vector<int64_t> out;
  for (const Value& x : as_array(v)) out.push_back(as_int64(x));
  return out;
}

Value int_array(const std::vector<int64_t>& v) {
  Value a = Value::array();
  for (int64_t x : v) a.push_back(x);
  return a;
}

}  // namespace trainer::json
