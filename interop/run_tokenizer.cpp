#include "interop/run_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "data/dataset_blend.h"

namespace trainer {

namespace fs = std::filesystem;

std::string first_train_file(const Config& cfg) {
  if (cfg.data.train.empty()) return "";
  const DataEntry e = parse_data_entry(cfg.data.train[0], "data.train[0]");
  const std::vector<std::string> files = expand_data_entry(e, cfg.data.train[0], "data.train[0]", cfg.data.format);
  return files.empty() ? "" : files[0];
}

std::optional<TokenizerFiles> check_data_tokenizer(const Config& cfg) {
  const std::string first = first_train_file(cfg);
  if (first.empty()) return std::nullopt;
  std::optional<TokenizerFiles> f = find_tokenizer(fs::path(first).parent_path().string());
  if (!f) return f;
  const std::unique_ptr<Tokenizer> t = load_tokenizer(*f);
  const int64_t v = t->vocab_size() > 0 ? t->vocab_size() : f->info_vocab;
  const std::string named = f->file.empty() ? f->info : f->file;
  if (v > cfg.model.vocab_size)
    throw ConfigError(named + ": the data's tokenizer has a vocabulary of " + std::to_string(v) +
                      " ids, larger than model.vocab_size " + std::to_string(cfg.model.vocab_size) +
                      " (set model.vocab_size to at least " + std::to_string(v) + ")");
  if (!f->info_dtype.empty() && f->info_dtype != cfg.data.dtype)
    throw ConfigError(f->info + ": the data was written as " + f->info_dtype + " tokens, data.dtype is " +
                      cfg.data.dtype + " (set data.dtype: " + f->info_dtype + ")");
  return f;
}

void record_tokenizer(const TokenizerFiles& files, const std::string& run_dir) {
  const fs::path dest = fs::path(run_dir) / "tokenizer";
  std::error_code ec;
  fs::remove_all(dest, ec);
  fs::create_directories(dest, ec);
  if (ec) throw std::runtime_error(dest.string() + ": cannot create the tokenizer directory: " + ec.message());
  for (const std::string& f : files.all) {
    if (fs::path(f).filename() == "tokenizer_info.json") continue;  // rewritten below
    fs::copy_file(f, dest / fs::path(f).filename(), fs::copy_options::overwrite_existing, ec);
    if (ec) throw std::runtime_error(f + ": cannot copy it into " + dest.string() + ": " + ec.message());
  }
  nlohmann::json info = nlohmann::json::object();
  if (!files.info.empty()) {
    std::ifstream in(files.info);
    info = nlohmann::json::parse(in);
  } else {
    info["kind"] = files.kind;
  }
  info["data_dir"] = fs::absolute(files.dir).lexically_normal().string();
  std::ofstream out(dest / "tokenizer_info.json");
  out << info.dump(2) << "\n";
  if (!out) throw std::runtime_error((dest / "tokenizer_info.json").string() + ": cannot write it");
}

std::unique_ptr<Tokenizer> tokenizer_or_fallback(const std::optional<TokenizerFiles>& files, int64_t vocab_size) {
  if (files) return load_tokenizer(*files);
  if (vocab_size == 256) return byte_tokenizer();
  return id_tokenizer(vocab_size, "no tokenizer next to the data (tokenizer_info.json, tokenizer.model or "
                                  "tokenizer.json): showing token ids");
}

std::optional<TokenizerFiles> saved_tokenizer_files(const Config& saved, const std::string& checkpoint_dir) {
  std::error_code ec;
  std::vector<std::string> places = {(fs::path(saved.run_dir()) / "tokenizer").string(),
                                     (fs::path(checkpoint_dir).parent_path().parent_path() / "tokenizer").string()};
  try {
    const std::string first = first_train_file(saved);
    if (!first.empty()) places.push_back(fs::path(first).parent_path().string());
  } catch (const std::exception&) {
    // The data may be gone (another machine): the other places still count.
  }
  for (const std::string& dir : places) {
    if (!fs::is_directory(dir, ec)) continue;
    if (auto f = find_tokenizer(dir)) return f;  // throws when its info names a missing file
  }
  return std::nullopt;
}

std::unique_ptr<Tokenizer> tokenizer_for_checkpoint(const Config& saved, const std::string& checkpoint_dir,
                                                    const std::string& override_path, std::string& chosen) {
  std::error_code ec;
  if (!override_path.empty()) {
    const fs::path p(override_path);
    if (fs::is_directory(p, ec)) {
      if (auto f = find_tokenizer(p.string())) {
        chosen = override_path;
        return load_tokenizer(*f);
      }
      throw ConfigError("--tokenizer " + override_path + ": no tokenizer_info.json, tokenizer.model or tokenizer.json there");
    }
    if (!fs::is_regular_file(p, ec)) throw ConfigError("--tokenizer " + override_path + ": no such file or directory");
    TokenizerFiles f;
    f.dir = p.parent_path().string();
    f.file = p.string();
    f.kind = p.extension() == ".json" ? "huggingface" : "sentencepiece";
    chosen = override_path;
    return load_tokenizer(f);
  }
  if (auto f = saved_tokenizer_files(saved, checkpoint_dir)) {
    chosen = f->dir;
    return load_tokenizer(*f);
  }
  chosen = "";
  return tokenizer_or_fallback(std::nullopt, saved.model.vocab_size);
}

}  // namespace trainer
