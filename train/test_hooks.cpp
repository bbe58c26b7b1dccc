#include "train/test_hooks.h"

#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>

namespace trainer {

TestHooks test_hooks_for(int rank) {
  TestHooks h;
  const char* env = std::getenv("TRAINER_TEST_HOOKS");
  if (!env || !*env) return h;
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const bool first_launch = !restart || std::string(restart) == "0";
  std::stringstream in(env);
  for (std::string entry; std::getline(in, entry, ',');) {
    const auto eq = entry.find('='), colon = entry.find(':');
    if (eq == std::string::npos || colon == std::string::npos || colon < eq)
      throw std::invalid_argument("TRAINER_TEST_HOOKS: '" + entry + "' is not NAME=RANK:VALUE");
    const std::string name = entry.substr(0, eq);
    int r = 0;
    double value = 0;
    try {
      const std::string who = entry.substr(eq + 1, colon - eq - 1);
      r = who == "*" ? rank : std::stoi(who);
      value = std::stod(entry.substr(colon + 1));
    } catch (const std::exception&) {
      throw std::invalid_argument("TRAINER_TEST_HOOKS: '" + entry + "' is not NAME=RANK:VALUE");
    }
    if (r != rank) continue;
    if (name == "nan_grad")
      h.nan_grad_step = int64_t(value);
    else if (name == "delay")
      h.delay_ms = value;
    else if (name == "kill")
      h.kill_step = first_launch ? int64_t(value) : -1;
    else if (name == "kill_in_save")
      h.kill_in_save_step = first_launch ? int64_t(value) : -1;
    else if (name == "signal")
      h.signal_step = first_launch ? int64_t(value) : -1;
    else if (name == "flip_bit")
      h.flip_bit_step = int64_t(value);
    else if (name == "skip")
      h.skip_steps.insert(int64_t(value));
    else
      throw std::invalid_argument("TRAINER_TEST_HOOKS: unknown hook '" + name + "' (nan_grad, delay, kill, kill_in_save, signal, skip, flip_bit)");
  }
  return h;
}

}  // namespace trainer
