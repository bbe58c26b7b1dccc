#include "data/choice_task.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace trainer {

namespace {

using nlohmann::json;

struct Where {
  const std::string& path;
  int64_t line;
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(path + ", line " + std::to_string(line) + ": " + what);
  }
};

std::vector<int32_t> ids_of(const json& v, const Where& at, const std::string& field, int64_t vocab) {
  if (!v.is_array() || v.empty()) at.fail("\"" + field + "\" must be a non-empty list of token ids");
  std::vector<int32_t> out;
  for (const json& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab)
      at.fail("\"" + field + "\" holds " + x.dump() + ", not a token id below model.vocab_size " +
              std::to_string(vocab));
    out.push_back(int32_t(x.get<int64_t>()));
  }
  return out;
}

int label_of(const json& j, const Where& at, size_t endings) {
  const json* l = j.contains("label") ? &j["label"] : nullptr;
  int64_t v = -1;
  if (l && l->is_number_integer()) v = l->get<int64_t>();
  if (l && l->is_string()) {
    try {
      size_t used = 0;
      v = std::stoll(l->get<std::string>(), &used);
      if (used != l->get<std::string>().size()) v = -1;
    } catch (const std::exception&) {
      v = -1;
    }
  }
  if (v < 0 || v >= int64_t(endings))
    at.fail("\"label\" must be the index of the right ending, 0.." + std::to_string(endings - 1) + " (got " +
            (l ? l->dump() : std::string("nothing")) + ")");
  return int(v);
}

// lm-eval's pair encoding: the whole text, less the context's own ids.
std::vector<int32_t> continuation(const Tokenizer& tok, const std::string& ctx, const std::vector<int32_t>& ctx_ids,
                                  const std::string& ending, const Where& at) {
  std::vector<int32_t> whole = tok.encode(ctx + " " + ending);
  if (whole.size() <= ctx_ids.size() || !std::equal(ctx_ids.begin(), ctx_ids.end(), whole.begin()))
    at.fail("the tokenizer encodes the context differently inside the whole text; give \"context_ids\" and "
            "\"endings_ids\" (scripts/prepare_task.py)");
  return {whole.begin() + int64_t(ctx_ids.size()), whole.end()};
}

ChoiceExample parse_example(const json& j, const Where& at, const Tokenizer& tok, int64_t vocab) {
  if (!j.is_object()) at.fail("not a JSON object");
  const char* ctx_key = j.contains("ctx") ? "ctx" : "context";
  if (!j.contains("endings") || !j["endings"].is_array() || j["endings"].size() < 2)
    at.fail("\"endings\" must be a list of at least two strings");
  ChoiceExample e;
  e.line = at.line;
  for (const json& end : j["endings"]) {
    if (!end.is_string() || end.get<std::string>().empty()) at.fail("\"endings\" holds an empty or non-string entry");
    e.ending_bytes.push_back(int64_t(end.get<std::string>().size()));
  }
  e.label = label_of(j, at, e.ending_bytes.size());
  if (j.contains("context_ids") || j.contains("endings_ids")) {
    e.context = ids_of(j.value("context_ids", json()), at, "context_ids", vocab);
    const json& ends = j.value("endings_ids", json());
    if (!ends.is_array() || ends.size() != e.ending_bytes.size())
      at.fail("\"endings_ids\" must hold one id list per ending");
    for (const json& x : ends) e.endings.push_back(ids_of(x, at, "endings_ids", vocab));
    return e;
  }
  if (!j.contains(ctx_key) || !j[ctx_key].is_string()) at.fail("no \"ctx\" (or \"context\") string");
  if (!tok.encodes_text())
    at.fail("the tokenizer (" + tok.kind() + ") cannot encode text in this binary: give \"context_ids\" and "
            "\"endings_ids\" (scripts/prepare_task.py writes them)");
  const std::string ctx = j[ctx_key].get<std::string>();
  e.context = tok.encode(ctx);
  if (e.context.empty()) at.fail("the context encodes to no tokens");
  for (const json& end : j["endings"]) e.endings.push_back(continuation(tok, ctx, e.context, end.get<std::string>(), at));
  for (const auto& ids : e.endings)
    for (int32_t id : ids)
      if (id < 0 || id >= vocab) at.fail("the text encodes to id " + std::to_string(id) + ", outside model.vocab_size");
  return e;
}

}  // namespace

std::vector<ChoiceExample> read_choice_task(const std::string& path, const Tokenizer& tok, int64_t vocab_size,
                                            int64_t limit) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open the task file");
  std::vector<ChoiceExample> out;
  std::string text;
  for (int64_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const Where at{path, line};
    json j;
    try {
      j = json::parse(text);
    } catch (const json::parse_error& e) {
      at.fail(std::string("not JSON (") + e.what() + ")");
    }
    out.push_back(parse_example(j, at, tok, vocab_size));
    if (limit > 0 && int64_t(out.size()) >= limit) break;
  }
  if (out.empty()) throw std::runtime_error(path + ": no examples in the task file");
  return out;
}

}  // namespace trainer
