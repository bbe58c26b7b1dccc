#include "train/preemption.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>

namespace trainer {

namespace {

std::atomic<int> g_requests{0};
std::atomic<int> g_signal{0};

void on_signal(int sig) {
  g_signal.store(sig);
  if (g_requests.fetch_add(1) >= 1) _exit(kPreemptedExitCode);  // the second one: now
}

}  // namespace

void install_preemption_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // collectives and file writes carry on; the loop polls the flag
  for (int sig : {SIGTERM, SIGUSR1, SIGINT}) sigaction(sig, &sa, nullptr);
}

int preemption_requests() { return g_requests.load(); }

bool preemption_requested() { return g_requests.load() > 0; }

const char* preemption_signal() {
  switch (g_signal.load()) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGINT: return "SIGINT";
    default: return "no signal";
  }
}

}  // namespace trainer
