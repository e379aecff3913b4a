#include "mc/common/daemon.hpp"

#include <atomic>
#include <csignal>
#include <cstdio>

namespace mc::daemon {
namespace {
std::atomic<bool> g_stop{false};
std::atomic<int> g_signals{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free counter");
extern "C" void on_stop_signal(int) {
  g_signals.fetch_add(1);
  g_stop.store(true);
}
}  // namespace

void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
}

bool stop_requested() { return g_stop.load(); }
void request_stop() { g_stop.store(true); }
int stop_signals() { return g_signals.load(); }

void announce_ready(const std::string& service, const std::string& endpoint,
                    const std::vector<std::pair<std::string, std::string>>& extra) {
  std::string line = "ready " + service + " " + endpoint;
  for (const auto& [k, v] : extra) line += " " + k + "=" + v;
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace mc::daemon
