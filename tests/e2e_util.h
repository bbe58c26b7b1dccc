// Helpers of the tests that run the real binary as several processes (the
// data-, tensor-parallel and resharding tests): free ports, launching ranks
// with the variables torchrun sets, reading metrics.jsonl, and assembling
// checkpoints for comparison.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace trainer::e2e {

// A loopback port, with its two neighbours, that nothing listens on.
int free_port();
// The last `chars` of a command's output: where a failing launcher's reason is,
// kept short enough that CI logs do not cut it off.
std::string tail(const std::string& out, size_t chars = 4000);
// Runs a shell command, appending its stdout and stderr to *out; its exit code.
int run(const std::string& cmd, std::string* out);

// Writes the bytes of a license text as uint16 tokens (values < 256) to
// dir/tokens.bin and returns its path.
std::filesystem::path write_byte_tokens(const std::filesystem::path& dir);

// A Megatron dataset PREFIX.bin/.idx of uint16 tokens, one sequence per
// document of the given sizes (the document index 0, 1, ..., n).
void write_megatron(const std::filesystem::path& prefix, const std::vector<uint16_t>& tokens,
                    const std::vector<int64_t>& sizes);

// The values of one key ("loss", "val_loss") in metrics.jsonl, in order.
std::vector<double> metric(const std::filesystem::path& metrics, const std::string& key);
std::vector<double> losses(const std::filesystem::path& metrics);
// The losses of runs that continued each other, in order (resharding tests).
std::vector<double> joined_losses(const std::vector<std::string>& run_dirs);
// Largest |a_i - b_i| / |b_i| over two equally long series.
double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b);

// Every "model/" tensor of a checkpoint, assembled whole from its pieces
// (NaN where no piece holds an element).
std::map<std::string, std::vector<float>> model_tensors(const std::filesystem::path& dir);
// Largest ||a - b|| / ||b|| (L2 norms) over every model tensor of two
// checkpoints; a hole in either fails (infinite).
//
// A norm, not the largest element: an element whose gradient passes near
// zero at some step (a rare token's embedding) gets AdamW's division of
// rounding noise by its own tiny root mean square for that step, and
// lands off by far more than its neighbours while every moment agrees
// (llama window cp2 on an AVX2 host: one of 8192 tok_embed elements 2e-5
// off, every other under 5e-8, m and v equal to 2e-9). The norm weighs that
// element by its share; an error spread over a tensor counts in full.
//
// Except the attention key biases: adding a constant to every key of a
// query leaves its softmax unchanged, so their gradient is zero in exact
// arithmetic and rounding noise of order 1e-9 is all they get; AdamW
// divides that noise by its own root mean square and moves them by about
// the learning rate each step in a direction the summation order decides.
// They never change the loss; every other tensor is compared. The result is
// the worst over tensors of ||a - b|| / ||b||; `where` (if given) gets
// that tensor's name.
double weight_diff(const std::filesystem::path& a, const std::filesystem::path& b, std::string* where = nullptr);

// Starts `world` copies of the binary with the variables torchrun sets
// (rank r on LOCAL_RANK r of one node); returns 0 when all succeeded.
// `codes`, when given, gets each rank's exit code. Each rank's output goes to
// <run_dir>.rank<r>.log and is appended to *out.
int run_by_hand(const std::string& cfg, int world, const std::string& run_dir, std::string* out,
                const std::string& extra = "", std::vector<int>* codes = nullptr);

}  // namespace trainer::e2e

namespace trainer::e2e {

// A 20-step run of `model` (a YAML flow map) on byte tokens, 8 sequences of
// 32 tokens a step in micro-batches of 2, evaluated at steps 10 and 20 and
// saved at 20, logged every step; the one-process reference run is made.
struct Setup {
  std::filesystem::path dir;
  std::string cfg;
  std::string single() const { return (dir / "single").string(); }
};
// data: the inside of the config's `data:` flow map; empty: the byte tokens
// (write_byte_tokens) for both splits.
Setup make_setup(const std::string& prefix, const std::string& name, const std::string& model,
                 const std::string& data = "");
// The same configuration with other `train:` keys (the inside of its flow
// map: device, precision, batch) and no reference run made.
Setup make_setup_config(const std::string& prefix, const std::string& name, const std::string& model,
                        const std::string& train, const std::string& data = "");

// Losses and validation losses within 1e-5 relative of the reference, final
// weights (assembled from the checkpoints) within 1e-4; prints the errors
// as "[tag] label ...".
void expect_same_run(const Setup& s, const std::string& tag, const std::string& label, const std::string& run_dir);
// The same against another reference run directory.
void expect_same_run(const std::string& reference, const std::string& tag, const std::string& label,
                     const std::string& run_dir);
// One process with one more "--set key=value" (run once per Setup, then
// reused): the reference of cases that change how a step is cut up.
std::string reference_run(const Setup& s, const std::string& setting);

struct Case {
  const char* label;
  int world;
  const char* set;  // --set arguments
};
// Each case through run_by_hand (run directory: the label, spaces as _),
// its output must hold every string of `must_print`, then expect_same_run.
void run_cases(const Setup& s, const std::string& tag, const std::vector<Case>& cases,
               const std::vector<std::string>& must_print);

// A checkpoint of `layout` (world ranks, its --set arguments) at step 10
// resumes in one process and continues the one-process curve to step 20:
// losses rel 1e-5, final weights rel 1e-4, both printed under `label`.
void check_reshard_to_one(const Setup& s, const std::string& tag, const std::string& label, int world,
                          const std::string& layout);

// Configuration mistakes: `trainer schedule --config configs/tiny.yaml ARGS`
// exits 2 with the message holding `want`.
struct ConfigMistake {
  std::string args;
  std::string want;
};
void expect_config_errors(const std::vector<ConfigMistake>& cases);

// A smoke test on every rank of a job: one verdict (every rank's exit code
// the same) and rank 0's checks passed.
void check_smoke(const std::string& rank0_log, const std::vector<int>& codes);

}  // namespace trainer::e2e
