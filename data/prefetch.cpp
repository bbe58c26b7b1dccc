#include "data/prefetch.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "core/trace.h"

namespace trainer {

std::vector<int64_t> default_step_indices(int64_t micro_steps, int64_t micro_batch) {
  std::vector<int64_t> v(size_t(micro_steps * micro_batch));
  for (size_t i = 0; i < v.size(); ++i) v[i] = int64_t(i);
  return v;
}

void fill_batch(const BatchSampler& sampler, const std::vector<int64_t>& indices, int64_t step,
                int64_t micro_steps, int64_t micro_batch, HostBatch& out, const std::atomic<bool>* cancel) {
  const int64_t T = sampler.seq_len();
  if (int64_t(indices.size()) != micro_steps * micro_batch)
    throw std::invalid_argument("fill_batch: " + std::to_string(indices.size()) + " sequence indices for " +
                                std::to_string(micro_steps) + " x " + std::to_string(micro_batch) + " sequences");
  out.step = -1;  // not a valid batch until the last sequence is in
  out.micro_steps = micro_steps;
  out.micro_batch = micro_batch;
  out.seq_len = T;
  out.inputs.resize(indices.size() * size_t(T));
  out.targets.resize(indices.size() * size_t(T));
  out.doc_start.resize(sampler.separate_documents() ? indices.size() * size_t(T) : 0);
  out.masked = sampler.masks_targets();
  for (size_t i = 0; i < indices.size(); ++i) {
    if (cancel && cancel->load(std::memory_order_relaxed)) return;
    sampler.sequence(step, indices[i], out.inputs.data() + i * size_t(T), out.targets.data() + i * size_t(T),
                     out.doc_start.empty() ? nullptr : out.doc_start.data() + i * size_t(T));
  }
  out.step = step;
}

BatchPrefetcher::BatchPrefetcher(const BatchSampler& sampler, int64_t micro_steps, int64_t micro_batch,
                                 std::vector<int64_t> indices, bool background)
    : sampler_(sampler),
      micro_steps_(micro_steps),
      micro_batch_(micro_batch),
      indices_(indices.empty() ? default_step_indices(micro_steps, micro_batch) : std::move(indices)),
      background_(background) {
  if (int64_t(indices_.size()) != micro_steps_ * micro_batch_)
    throw std::invalid_argument("BatchPrefetcher: " + std::to_string(indices_.size()) + " sequence indices for " +
                                std::to_string(micro_steps_) + " x " + std::to_string(micro_batch_) + " sequences");
  if (background_) thread_ = std::thread([this] { worker(); });
}

BatchPrefetcher::~BatchPrefetcher() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BatchPrefetcher::worker() {
  trace::name_thread("data prefetch");
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_.load() || state_ == State::Requested; });
    if (stop_) return;
    state_ = State::Filling;
    const int64_t step = back_step_;
    lk.unlock();
    std::exception_ptr err;
    try {
      const trace::Scope span("data", "load batch of step", step + 1);
      fill_batch(sampler_, indices_, step, micro_steps_, micro_batch_, back_, &stop_);
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    back_error_ = err;
    state_ = State::Done;
    cv_.notify_all();
  }
}

const HostBatch& BatchPrefetcher::get(int64_t step) {
  if (!background_) {
    fill_batch(sampler_, indices_, step, micro_steps_, micro_batch_, front_);
    return front_;
  }
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return state_ == State::Idle || state_ == State::Done; });
  const bool ready = state_ == State::Done && back_step_ == step;
  state_ = State::Idle;
  if (ready) {
    if (back_error_) {
      // Not retried: the same (step, index) would fail the same way.
      std::exception_ptr err = std::exchange(back_error_, nullptr);
      std::rethrow_exception(err);
    }
    std::swap(front_, back_);
  } else {
    // The worker is idle, so it cannot touch front_/back_ meanwhile; filling
    // here rather than through the worker keeps the exception path direct.
    back_error_ = nullptr;
    lk.unlock();
    fill_batch(sampler_, indices_, step, micro_steps_, micro_batch_, front_);
    lk.lock();
  }
  back_step_ = step + 1;
  state_ = State::Requested;
  cv_.notify_all();
  return front_;
}

}  // namespace trainer
