#include "app/generate_command.h"
#include "app/saved_model.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "model/kv_cache.h"
#include "model/sharding.h"
#include "runtime/device_select.h"
#include "infer/generate.h"
#include "kernels/cpu/blas_core.h"
#include "interop/run_tokenizer.h"

namespace trainer {

namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int run_generate(const GenerateOptions& opt) {
  if (opt.tokens < 1) throw ConfigError("--tokens must be at least 1 (got " + std::to_string(opt.tokens) + ")");
  if (opt.top_k < 0) throw ConfigError("--top-k must be 0 (all tokens) or positive");
  if (opt.prompt.empty())
    throw ConfigError("--prompt is empty: give the text to continue (the model was never trained on an empty context)");
  if (opt.device != "auto" && opt.device != "cpu" && opt.device != "cuda")
    throw ConfigError("--device must be cpu, cuda or auto (got '" + opt.device + "')");
  const SavedModel sm = load_saved_model(opt.checkpoint);
  const std::string& dir = sm.dir;
  const LoadedCheckpoint& ck = sm.ck;
  const Config& saved = sm.cfg;
  const ModelDims& dims = sm.dims;
  const std::vector<std::vector<float>>& weights = sm.weights;

  std::string chosen;
  const std::unique_ptr<Tokenizer> tok = tokenizer_for_checkpoint(saved, dir, opt.tokenizer, chosen);
  if (tok->vocab_size() > saved.model.vocab_size)
    throw ConfigError((tok->file.empty() ? chosen : tok->file) + ": the tokenizer has a vocabulary of " +
                      std::to_string(tok->vocab_size()) + " ids, larger than the checkpoint's model.vocab_size " +
                      std::to_string(saved.model.vocab_size));
  if (!tok->warning.empty()) std::fprintf(stderr, "warning: %s\n", tok->warning.c_str());
  std::vector<int32_t> prompt = tok->encode(opt.prompt);
  if (prompt.empty()) throw ConfigError("--prompt '" + opt.prompt + "' encodes to no tokens");
  for (int32_t id : prompt)
    if (id < 0 || id >= saved.model.vocab_size)
      throw ConfigError("--prompt encodes to id " + std::to_string(id) + ", outside model.vocab_size " +
                        std::to_string(saved.model.vocab_size));

  const DeviceChoice dev = select_device(opt.device, 0);
  const int64_t window = std::min<int64_t>(saved.train.seq_len, saved.model.max_seq_len);
  std::fprintf(stderr, "generate: %s (step %lld, layout %s), %s %s, tokenizer %s%s%s\n%s\n", dir.c_str(),
               (long long)ck.meta.step, ck.meta.layout.c_str(), saved.model.arch.c_str(),
               std::to_string(saved.model.n_layers).append(" layers").c_str(), tok->kind().c_str(),
               chosen.empty() ? "" : " from ", chosen.c_str(), dev.line.c_str());
  if (dev.device == Device::CPU) std::fprintf(stderr, "BLAS: %s\n", cpu::blas_core_summary().c_str());
  if (int64_t(prompt.size()) > window)
    std::fprintf(stderr, "generate: the prompt has %zu tokens, the context window %lld (train.seq_len): keeping its "
                         "last %lld\n", prompt.size(), (long long)window, (long long)window);
  if (int64_t(prompt.size()) + opt.tokens > window)
    std::fprintf(stderr, "generate: past %lld tokens of context the window slides: it restarts from the last %lld "
                         "tokens each time it fills\n", (long long)window, (long long)std::max<int64_t>(1, window / 2));

  SamplingOptions so;
  so.temperature = float(opt.temperature);
  so.top_k = opt.top_k;
  so.seed = opt.seed;
  const auto t0 = std::chrono::steady_clock::now();
  KvDecoder decoder(dims, weights, window, dev.device);
  const std::vector<int32_t> ids = generate_cached(decoder, prompt, opt.tokens, so);
  const double secs = seconds_since(t0);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), ids.begin(), ids.end());
  std::printf("%s\n", tok->decode(all).c_str());
  std::fflush(stdout);
  std::fprintf(stderr, "generate: %d tokens in %.2f s (%.1f tokens/s) with the key/value cache, temperature %g%s\n",
               opt.tokens, secs, double(opt.tokens) / secs, opt.temperature,
               opt.top_k > 0 ? (", top-k " + std::to_string(opt.top_k)).c_str() : "");
  if (opt.compare) {
    const auto t1 = std::chrono::steady_clock::now();
    const std::vector<int32_t> ref = generate_tokens(dims, weights, window, prompt, opt.tokens, so);
    size_t same = 0;
    while (same < ids.size() && ids[same] == ref[same]) ++same;
    std::fprintf(stderr, "generate: no-cache reference (CPU, whole context per token) took %.2f s; tokens agree: "
                         "%zu of %zu%s\n", seconds_since(t1), same, ids.size(),
                 same == ids.size() ? "" : " (past the window the two slide differently: infer/generate.h)");
  }
  return 0;
}

}  // namespace trainer
