// Child processes for e2e tests, shared by every area's tests: start a binary, wait for its "ready"
// line (daemon.hpp), run a command to completion with a deadline. The RAII guard stops what it started
// (SIGTERM, then SIGKILL after a grace period) even when a test fails, so no daemon outlives its test.
//
// Output: by default the child's stdout is a pipe the test reads (wait_line, wait_ready, finish) and
// its stderr is inherited, so diagnostics land in the test log; ChildOptions can send either to a file
// instead. With own_process_group the child leads a new process group and stop()/kill signal the whole
// group (for scripts that start daemons of their own, such as examples/local-cluster.sh).
// Thread-safety: a Child is used by one thread.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "mc/common/clock.hpp"

namespace mc::testkit {

// The monotonic clock every mc library uses (mc/common/clock.hpp), in milliseconds.
inline int64_t mono_ms() { return mc::steady_ms(); }

// The command line of a running process (/proc/PID/cmdline), each `flag` given in `replace` followed by its new value
// (e.g. {"--listen", the endpoint it resolved}): to start a killed daemon again just as it was.
inline std::vector<std::string> restart_argv(pid_t pid, const std::map<std::string, std::string>& replace = {}) {
  std::vector<std::string> argv;
  std::ifstream cmdline("/proc/" + std::to_string(pid) + "/cmdline");
  std::string arg;
  while (std::getline(cmdline, arg, '\0')) argv.push_back(arg);
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    auto it = replace.find(argv[i]);
    if (it != replace.end()) argv[i + 1] = it->second;
  }
  return argv;
}

// n bytes drawn from a generator seeded with `seed`: the same seed, the same bytes (to check what is read back).
inline std::vector<std::byte> seeded_bytes(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

struct ChildOptions {
  bool own_process_group = false;  // setpgid(0, 0) in the child; signals go to the group
  std::string stdout_path;         // non-empty: stdout to this file (no pipe; wait_line returns "")
  std::string stderr_path;         // non-empty: stderr to this file; else inherited
  std::string stdin_path;          // non-empty: stdin from this file (e.g. /dev/null); else inherited
  int64_t stop_grace_ms = 5000;    // the destructor's SIGTERM -> SIGKILL grace period
};

class Child {
 public:
  // argv[0] is a path or a name looked up in PATH. A child that cannot be started (no such program, a file of
  // ChildOptions that cannot be opened) leaves pid() == -1 and finish()/wait_exit() report exit code 127.
  //
  // Started with posix_spawnp, not fork + exec: the test process has threads (etcd watches, heartbeats, loggers),
  // and a forked child that allocates or takes a stdio lock before exec may block forever on a lock another thread
  // held at the fork: a member that never starts (the child here runs no code of ours between clone and exec).
  explicit Child(const std::vector<std::string>& argv, ChildOptions options = {}) : options_(std::move(options)) {
    int fds[2] = {-1, -1};
    const bool piped = options_.stdout_path.empty();
    if (piped && pipe2(fds, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (!options_.stdin_path.empty())
      posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, options_.stdin_path.c_str(), O_RDONLY, 0);
    if (piped) {
      posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
    } else {
      posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, options_.stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                       0644);
    }
    if (!options_.stderr_path.empty()) {
      posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, options_.stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                       0644);
    }
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    if (options_.own_process_group) {
      posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
      posix_spawnattr_setpgroup(&attr, 0);  // a group of its own, set before exec: no race with the first signal
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = -1;
    const int rc = args.size() > 1 ? posix_spawnp(&pid, args[0], &fa, &attr, args.data(), environ) : EINVAL;
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&fa);
    if (piped) close(fds[1]);
    if (rc != 0) {
      std::fprintf(stderr, "testkit: cannot start %s: %s\n", argv.empty() ? "(nothing)" : argv[0].c_str(),
                   std::strerror(rc));
      if (piped) close(fds[0]);
      status_ = 127 << 8;  // as a shell reports a command it could not run
      return;
    }
    pid_ = pid;
    if (piped) out_fd_ = fds[0];
  }
  ~Child() {
    stop(options_.stop_grace_ms);
    if (out_fd_ >= 0) close(out_fd_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  bool running() { return pid_ > 0 && !reap(false); }

  // Reads stdout until a line starting with `prefix` appears; that line, or "" on timeout or EOF.
  std::string wait_line(const std::string& prefix, int64_t timeout_ms) {
    const int64_t end = mono_ms() + timeout_ms;
    for (;;) {
      size_t nl;
      while ((nl = buf_.find('\n')) != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        out_ += line + "\n";
        if (line.rfind(prefix, 0) == 0) return line;
      }
      const int64_t left = end - mono_ms();
      if (left <= 0 || out_fd_ < 0) return "";
      pollfd p{out_fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) return "";
      char tmp[4096];
      ssize_t k = read(out_fd_, tmp, sizeof tmp);
      if (k <= 0) return "";
      buf_.append(tmp, static_cast<size_t>(k));
    }
  }
  // The next stdout line ("" on timeout or EOF).
  std::string read_line(int64_t timeout_ms) { return wait_line("", timeout_ms); }
  // Waits for "ready <service> <endpoint> ..." and returns the endpoint ("" on timeout or exit).
  std::string wait_ready(int64_t timeout_ms = 30000) {
    std::istringstream is(wait_line("ready ", timeout_ms));
    std::string word, service, endpoint;
    is >> word >> service >> endpoint;
    return endpoint;
  }

  // Reads the rest of stdout and waits for the exit, killing the child at the deadline. The status as
  // from waitpid, or -1 when it was killed for the deadline. `out`: everything read from stdout.
  int finish(int64_t timeout_ms, std::string* out) {
    const int64_t end = mono_ms() + timeout_ms;
    while (out_fd_ >= 0) {
      const int64_t left = end - mono_ms();
      if (left <= 0) break;
      pollfd p{out_fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) break;
      char tmp[65536];
      ssize_t k = read(out_fd_, tmp, sizeof tmp);
      if (k <= 0) break;
      buf_.append(tmp, static_cast<size_t>(k));
    }
    if (out != nullptr) *out = out_ + buf_;
    for (;;) {
      if (pid_ <= 0 || reap(false)) return status_;
      if (mono_ms() > end) {
        kill_now(SIGKILL, 1000);
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // Waits up to timeout_ms for the exit: the exit code (128 + signal when killed), -1 on timeout.
  int wait_exit(int64_t timeout_ms) {
    const int64_t end = mono_ms() + timeout_ms;
    while (pid_ > 0 && !reap(false) && mono_ms() < end) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (pid_ > 0) return -1;
    return exit_code(status_);
  }

  // SIGTERM, then SIGKILL after grace_ms. The exit code when it exited by itself within the grace
  // period (128 + signal when a signal ended it), -1 when it had to be killed or was not running.
  int stop(int64_t grace_ms = 5000) {
    if (pid_ <= 0) return -1;
    signal(SIGTERM);
    const int64_t end = mono_ms() + grace_ms;
    while (mono_ms() < end) {
      if (reap(false)) return exit_code(status_);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill_now(SIGKILL, 0);
    return -1;
  }
  // SIGKILL at once (a crash: no goodbye to anyone), reaped.
  void kill_hard() { kill_now(SIGKILL, 0); }
  // Sends `sig`, waits up to grace_ms for the exit, then SIGKILL; always reaps.
  void kill_now(int sig, int64_t grace_ms) {
    if (pid_ <= 0) return;
    signal(sig);
    const int64_t end = mono_ms() + grace_ms;
    while (mono_ms() < end) {
      if (reap(false)) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    signal(SIGKILL);
    reap(true);
  }
  // Sends `sig` to the child (its group with own_process_group).
  void signal(int sig) {
    if (pid_ <= 0) return;
    ::kill(options_.own_process_group ? -pid_ : pid_, sig);
  }

  static int exit_code(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return -1;
  }

 private:
  // True when the child has exited (status_ set, pid_ cleared).
  bool reap(bool block) {
    int status = 0;
    if (waitpid(pid_, &status, block ? 0 : WNOHANG) == pid_) {
      status_ = status;
      pid_ = -1;
      return true;
    }
    return false;
  }

  ChildOptions options_;
  pid_t pid_ = -1;
  int status_ = -1;
  int out_fd_ = -1;
  std::string buf_;
  std::string out_;
};

struct RunResult {
  int exit_code = -1;  // -1: killed at the deadline
  bool signaled = false;
  std::string out;
  int64_t elapsed_ms = 0;
};

// Runs argv to completion (stdout captured, stderr inherited), killing it at timeout_ms.
inline RunResult run(const std::vector<std::string>& argv, int64_t timeout_ms) {
  RunResult r;
  const int64_t t0 = mono_ms();
  Child c(argv);
  int status = c.finish(timeout_ms, &r.out);
  r.elapsed_ms = mono_ms() - t0;
  if (status >= 0 && WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (status >= 0 && WIFSIGNALED(status)) r.signaled = true;
  return r;
}

// `/bin/sh -c CMD` run to completion: its exit code (-1: killed by a signal) and its standard output. CMD says
// where its standard error goes ("2>&1" to capture it too). For pipelines and redirections; run() for an argv.
struct ShellResult {
  int code = -1;
  std::string out;
};
inline ShellResult shell(const std::string& cmd) {
  ShellResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The value of key=value in a ready line ("" when absent).
inline std::string ready_field(const std::string& line, const std::string& key) {
  std::istringstream is(line);
  std::string tok;
  while (is >> tok) {
    if (tok.rfind(key + "=", 0) == 0) return tok.substr(key.size() + 1);
  }
  return "";
}

}  // namespace mc::testkit
