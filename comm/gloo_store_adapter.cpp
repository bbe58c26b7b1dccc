#include "comm/gloo_store_adapter.h"

namespace trainer {

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_.set(key, std::string(data.begin(), data.end()));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  const std::string v = store_.get(key, timeout_s_);
  return std::vector<char>(v.begin(), v.end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) { store_.wait(keys, timeout_s_); }

void GlooStoreAdapter::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  // Gloo spells "no timeout" as zero; we never wait forever, so that a rank
  // that never comes is reported instead of hanging the job.
  const double t = timeout.count() > 0 ? double(timeout.count()) / 1000.0 : timeout_s_;
  store_.wait(keys, t);
}

}  // namespace trainer
