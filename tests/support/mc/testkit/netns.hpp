// Network namespaces as hosts for e2e tests (the C++ side of examples/lib/netns.sh): namespaces with a
// unique prefix (pid + a counter), lo up, joined by veth pairs whose ends both live inside them (nothing is
// added to the test's own namespace). The destructor kills every process still inside them (by pid, from
// `ip netns pids`) and deletes them, so a failed assertion leaves nothing behind. Needs root; available()
// says why not (the test then skips with that reason).
#pragma once

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace mc::testkit {

class NetnsHosts {
 public:
  NetnsHosts() {
    static std::atomic<int> counter{0};
    prefix_ = "mct" + std::to_string(getpid()) + "n" + std::to_string(counter++);
    if (geteuid() != 0) {
      why_not_ = "needs root to create network namespaces and veth pairs (ip netns add)";
    } else if (!sh("ip netns add " + prefix_ + "-probe")) {
      why_not_ = "ip netns add fails here (no CAP_SYS_ADMIN, no iproute2, or /run/netns not writable)";
    } else {
      sh("ip netns del " + prefix_ + "-probe");
    }
  }
  ~NetnsHosts() {
    for (const auto& ns : names_) {
      for (pid_t p : pids(ns)) ::kill(p, SIGKILL);
    }
    for (const auto& ns : names_) sh("ip netns del " + ns);
  }
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  // Empty when namespaces can be made here; else the reason they cannot.
  const std::string& why_not() const { return why_not_; }
  // The full name of host `h`.
  std::string name(const std::string& h) const { return prefix_ + "-" + h; }
  // The first failed setup command ("" when none).
  const std::string& error() const { return error_; }

  // Namespace for host `h`, lo up.
  bool add(const std::string& h) {
    if (!step("ip netns add " + name(h))) return false;
    names_.push_back(name(h));
    return step("ip -n " + name(h) + " link set lo up");
  }
  // A veth pair between hosts a and b, addressed ("10.78.0.1/24") and up; the interface names are "veth<i>a"
  // in a and "veth<i>b" in b, i counting from 1 (returned).
  int link(const std::string& a, const std::string& addr_a, const std::string& b, const std::string& addr_b) {
    const int i = ++links_;
    const std::string va = "veth" + std::to_string(i) + "a", vb = "veth" + std::to_string(i) + "b";
    const bool ok =
        step("ip link add " + va + " netns " + name(a) + " type veth peer name " + vb + " netns " + name(b)) &&
        step("ip -n " + name(a) + " addr add " + addr_a + " dev " + va) &&
        step("ip -n " + name(b) + " addr add " + addr_b + " dev " + vb) &&
        step("ip -n " + name(a) + " link set " + va + " up") && step("ip -n " + name(b) + " link set " + vb + " up");
    return ok ? i : 0;
  }
  // argv run inside host h: {"ip", "netns", "exec", NAME, argv...}.
  std::vector<std::string> in(const std::string& h, std::vector<std::string> argv) const {
    std::vector<std::string> out = {"ip", "netns", "exec", name(h)};
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }
  // A counter of interface `dev` in host h (/sys/class/net/DEV/statistics/FILE), 0 when unreadable.
  uint64_t counter(const std::string& h, const std::string& dev, const std::string& file) const {
    const std::string out = capture("ip netns exec " + name(h) + " cat /sys/class/net/" + dev + "/statistics/" + file);
    return out.empty() ? 0 : std::strtoull(out.c_str(), nullptr, 10);
  }

 private:
  static bool sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }
  static std::string capture(const std::string& cmd) {
    std::string out;
    FILE* p = popen((cmd + " 2>/dev/null").c_str(), "r");
    if (p == nullptr) return out;
    char buf[256];
    while (fgets(buf, sizeof buf, p) != nullptr) out += buf;
    pclose(p);
    return out;
  }
  static std::vector<pid_t> pids(const std::string& ns) {
    std::istringstream is(capture("ip netns pids " + ns));
    std::vector<pid_t> out;
    for (pid_t p; is >> p;) out.push_back(p);
    return out;
  }
  bool step(const std::string& cmd) {
    if (sh(cmd)) return true;
    if (error_.empty()) error_ = "setup command failed: " + cmd;
    return false;
  }

  std::string prefix_;
  std::string why_not_;
  std::string error_;
  std::vector<std::string> names_;
  int links_ = 0;
};

}  // namespace mc::testkit
