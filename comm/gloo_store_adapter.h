// Gloo finds its peers through a gloo::rendezvous::Store; ours is the
// rendezvous store of comm/store.h. This adapter lets Gloo use it, so that a
// job has one rendezvous (rank 0's server) whatever the backend, and so that
// Gloo's waits get our timeouts and our "which key is missing" messages.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <string>
#include <vector>

#include "comm/store.h"

namespace trainer {

class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  // Does not own `store`; give it a PrefixStore to keep a group's keys apart.
  // `timeout_s` bounds every wait Gloo asks for without a timeout of its own.
  GlooStoreAdapter(trainer::Store& store, double timeout_s) : store_(store), timeout_s_(timeout_s) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits for the key (Gloo sometimes reads a key without waiting first).
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  trainer::Store& store_;
  double timeout_s_;
};

}  // namespace trainer
