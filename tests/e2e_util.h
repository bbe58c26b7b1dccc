// Helpers of the tests that run the real binary as several processes (the
// data-, tensor-parallel and resharding tests): free ports, launching ranks
// with the variables torchrun sets, reading metrics.jsonl, and assembling
// checkpoints for comparison.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace trainer::e2e {

int free_port();
// Runs a shell command, appending its stdout and stderr to *out; its exit code.
int run(const std::string& cmd, std::string* out);

// Writes the bytes of a license text as uint16 tokens (values < 256) to
// dir/tokens.bin and returns its path.
std::filesystem::path write_byte_tokens(const std::filesystem::path& dir);

// The values of one key ("loss", "val_loss") in metrics.jsonl, in order.
std::vector<double> metric(const std::filesystem::path& metrics, const std::string& key);
std::vector<double> losses(const std::filesystem::path& metrics);
// Largest |a_i - b_i| / |b_i| over two equally long series.
double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b);

// Every "model/" tensor of a checkpoint, assembled whole from its pieces
// (NaN where no piece holds an element).
std::map<std::string, std::vector<float>> model_tensors(const std::filesystem::path& dir);
// Largest |a - b| / max|b| over every model tensor of two checkpoints; a hole
// in either fails (infinite).
//
// Except the attention key biases: adding a constant to every key of a
// query leaves its softmax unchanged, so their gradient is zero in exact
// arithmetic and rounding noise of order 1e-9 is all they get; AdamW
// divides that noise by its own root mean square and moves them by about
// the learning rate each step in a direction the summation order decides.
// They never change the loss; every other tensor is compared.
double weight_diff(const std::filesystem::path& a, const std::filesystem::path& b);

// Starts `world` copies of the binary with the variables torchrun sets
// (rank r on LOCAL_RANK r of one node); returns 0 when all succeeded.
// `codes`, when given, gets each rank's exit code. Each rank's output goes to
// <run_dir>.rank<r>.log and is appended to *out.
int run_by_hand(const std::string& cfg, int world, const std::string& run_dir, std::string* out,
                const std::string& extra = "", std::vector<int>* codes = nullptr);

}  // namespace trainer::e2e
