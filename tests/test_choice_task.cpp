// Multiple-choice task files (data/choice_task.h): HellaSwag's fields, the
// continuation " " + ending cut as lm-eval cuts it, ids given in the file,
// and every malformed line refused naming the file, the line and the field.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "data/choice_task.h"

namespace fs = std::filesystem;
using namespace trainer;

namespace {

fs::path write_task(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("trainer_task_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p;
}

std::string error_of(const fs::path& p, const Tokenizer& tok) {
  try {
    read_choice_task(p.string(), tok, 256);
  } catch (const std::runtime_error& e) {
    std::printf("[message] %s\n", e.what());
    return e.what();
  }
  return "(nothing thrown)";
}

}  // namespace

TEST_CASE("a HellaSwag-form task: context, continuations with their space, label as a string", "[eval][task]") {
  const auto bytes = byte_tokenizer();
  const fs::path p = write_task("ok.jsonl", R"({"ctx": "A man", "endings": ["sits.", "runs fast."], "label": "1"}
{"context": "Hi", "endings": ["there", "you"], "label": 0, "context_ids": [72, 105], "endings_ids": [[32, 116], [32, 121, 111, 117]]}
)");
  const auto ex = read_choice_task(p.string(), *bytes, 256);
  REQUIRE(ex.size() == 2);
  CHECK(ex[0].context == std::vector<int32_t>{'A', ' ', 'm', 'a', 'n'});
  CHECK(ex[0].endings[1] == std::vector<int32_t>{' ', 'r', 'u', 'n', 's', ' ', 'f', 'a', 's', 't', '.'});
  CHECK(ex[0].ending_bytes == std::vector<int64_t>{5, 10});
  CHECK(ex[0].label == 1);
  CHECK(ex[1].endings[0] == std::vector<int32_t>{32, 116});
  CHECK(ex[1].line == 2);
  CHECK(read_choice_task(p.string(), *bytes, 256, 1).size() == 1);
  fs::remove(p);
}

TEST_CASE("malformed task lines are refused with the file, line and field", "[eval][task]") {
  const auto bytes = byte_tokenizer();
  const auto ids = id_tokenizer(256, "no tokenizer");
  const struct {
    const char* name;
    const char* line;
    const char* want;
  } cases[] = {
      {"label.jsonl", R"({"ctx": "a", "endings": ["b", "c"], "label": 2})", "line 2: \"label\" must be the index of the right ending, 0..1 (got 2)"},
      {"one.jsonl", R"({"ctx": "a", "endings": ["b"], "label": 0})", "\"endings\" must be a list of at least two strings"},
      {"json.jsonl", R"({"ctx": "a", )", "line 2: not JSON"},
      {"ids.jsonl", R"({"ctx": "a", "endings": ["b", "c"], "label": 0, "context_ids": [1], "endings_ids": [[2], [300]]})",
       "\"endings_ids\" holds 300, not a token id below model.vocab_size 256"},
      {"empty.jsonl", R"({"ctx": "a", "endings": ["b", ""], "label": 0})", "\"endings\" holds an empty or non-string entry"},
  };
  for (const auto& c : cases) {
    const fs::path p = write_task(c.name, std::string("\n") + c.line + "\n");
    const std::string msg = error_of(p, *bytes);
    CHECK(msg.find(p.string()) != std::string::npos);
    CHECK(msg.find(c.want) != std::string::npos);  // the blank first line counts: the example is line 2
    fs::remove(p);
  }
  const fs::path p = write_task("text.jsonl", R"({"ctx": "a", "endings": ["b", "c"], "label": 0})");
  CHECK(error_of(p, *ids).find("cannot encode text in this binary: give \"context_ids\" and \"endings_ids\" "
                               "(scripts/prepare_task.py writes them)") != std::string::npos);
  fs::remove(p);
}
