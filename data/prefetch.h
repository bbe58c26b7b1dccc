// Fills the host token buffers of step s+1 in a background thread while
// step s trains. Every sequence comes from BatchSampler::sequence, a pure
// function of (step, index), so the output is identical with and without
// the thread; only the waiting moves.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "data/batch_sampler.h"

namespace trainer {

// One optimizer step's tokens on the host: [micro_steps, micro_batch, seq_len].
struct HostBatch {
  int64_t step = -1;
  int64_t micro_steps = 0, micro_batch = 0, seq_len = 0;
  std::vector<int32_t> inputs, targets;
  // Separate documents only (BatchSampler::sequence): where each token's
  // document starts in its sequence; empty otherwise.
  std::vector<int32_t> doc_start;
  // Some targets may be -1 (BatchSampler::masks_targets): the loss is then
  // the mean over the others (train/micro_batch.h: predicted_share).
  bool masked = false;

  // The [micro_batch, seq_len] block of micro-batch m.
  const int32_t* inputs_of(int64_t m) const { return inputs.data() + m * micro_batch * seq_len; }
  const int32_t* targets_of(int64_t m) const { return targets.data() + m * micro_batch * seq_len; }
  const int32_t* doc_start_of(int64_t m) const {
    return doc_start.empty() ? nullptr : doc_start.data() + m * micro_batch * seq_len;
  }
};

// The global sequence indices 0 .. micro_steps*micro_batch-1 in [m][b] order:
// what a single data-parallel rank reads (sequence m*B + b).
std::vector<int64_t> default_step_indices(int64_t micro_steps, int64_t micro_batch);

// Fills out (resizing it) with the sequences `indices` ([m][b] order) of
// `step`. cancel, when set to true, stops early and leaves out partial.
void fill_batch(const BatchSampler& sampler, const std::vector<int64_t>& indices, int64_t step,
                int64_t micro_steps, int64_t micro_batch, HostBatch& out,
                const std::atomic<bool>* cancel = nullptr);

class BatchPrefetcher {
 public:
  // indices: the global sequence indices this rank reads each step,
  // micro_steps*micro_batch of them in [m][b] order; empty means
  // default_step_indices. background=false fills synchronously in get()
  // (same output, for debugging and comparison). The sampler must outlive
  // the prefetcher.
  BatchPrefetcher(const BatchSampler& sampler, int64_t micro_steps, int64_t micro_batch,
                  std::vector<int64_t> indices = {}, bool background = true);
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // The batch of `step`, then starts filling step+1 in the background. Waits
  // if that fill is still running; steps asked for out of order (the first
  // call, a resume, a jump) are filled on the spot. An exception thrown while
  // filling `step` (a bad token id, an I/O error) is rethrown here unchanged.
  // The reference stays valid until the next get() or destruction.
  const HostBatch& get(int64_t step);

 private:
  enum class State { Idle, Requested, Filling, Done };
  void worker();

  const BatchSampler& sampler_;
  const int64_t micro_steps_, micro_batch_;
  const std::vector<int64_t> indices_;
  const bool background_;

  HostBatch front_;  // handed to the caller; only get() writes it
  HostBatch back_;   // written by the worker while Requested/Filling

  std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::Idle;
  int64_t back_step_ = -1;
  std::exception_ptr back_error_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace trainer
