#include "comm/collective_trace.h"

#include <chrono>
#include <cstdio>
#include <mutex>

namespace trainer {

namespace {
std::mutex g_mu;
std::string g_op, g_group;
std::chrono::steady_clock::time_point g_at;
}  // namespace

void note_collective(const char* op, const std::string& group) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_op = op;
  g_group = group;
  g_at = std::chrono::steady_clock::now();
}

std::string last_collective() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_op.empty()) return "";
  char ago[32];
  std::snprintf(ago, sizeof ago, "%.1f", std::chrono::duration<double>(std::chrono::steady_clock::now() - g_at).count());
  return g_op + " on group " + g_group + ", issued " + ago + " s ago";
}

}  // namespace trainer
