// The message a call throws, for the tests that check what a bad input is
// told: "<no error>" when it throws nothing.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

#include "config/config.h"

namespace trainer::test {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no error>";
}

// A configuration's refusal must be a ConfigError (main exits 2 on it);
// any other exception's message comes back marked as such.
inline std::string config_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not a ConfigError> ") + e.what();
  }
  return "<no error>";
}

}  // namespace trainer::test
