#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "data/tokenizer.h"

namespace trainer {

// One more than the largest id of the model's vocabulary (an object of
// piece -> id for BPE and WordPiece, a list of [piece, score] for Unigram)
// and of added_tokens: the rows an embedding needs.
int64_t huggingface_vocab_size(const std::string& json_file) {
  nlohmann::json j;
  try {
    std::ifstream in(json_file);
    if (!in) throw std::runtime_error("cannot open it");
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw std::runtime_error(json_file + ": not a Hugging Face tokenizer.json (" + e.what() + ")");
  }
  int64_t size = 0;
  if (j.contains("model") && j["model"].contains("vocab")) {
    const auto& v = j["model"]["vocab"];
    if (v.is_object())
      for (const auto& [piece, id] : v.items())
        if (id.is_number_integer()) size = std::max<int64_t>(size, id.get<int64_t>() + 1);
    if (v.is_array()) size = std::max<int64_t>(size, int64_t(v.size()));
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const auto& t : j["added_tokens"])
      if (t.contains("id") && t["id"].is_number_integer()) size = std::max<int64_t>(size, t["id"].get<int64_t>() + 1);
  if (size == 0) throw std::runtime_error(json_file + ": no vocabulary found (model.vocab, added_tokens)");
  return size;
}

}  // namespace trainer
