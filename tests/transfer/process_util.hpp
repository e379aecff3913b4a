// Child processes for e2e tests: start a binary, wait for its "ready" line, run a command to completion
// with a deadline; RAII guards kill what they started (SIGTERM, then SIGKILL) even when a test fails.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace mc::transfer::testing {

inline int64_t mono_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A started child with its stdout on a pipe (stderr inherited, so diagnostics land in the test log).
class Child {
 public:
  explicit Child(const std::vector<std::string>& argv) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], 1);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    out_fd_ = fds[0];
  }
  ~Child() {
    kill_now(SIGTERM, 2000);
    if (out_fd_ >= 0) close(out_fd_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }

  // Reads stdout until a line starting with `prefix` appears or timeout; returns that line ("" on timeout/EOF).
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
      if (left <= 0) return "";
      pollfd p{out_fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) return "";
      char tmp[4096];
      ssize_t k = read(out_fd_, tmp, sizeof tmp);
      if (k <= 0) return "";
      buf_.append(tmp, static_cast<size_t>(k));
    }
  }

  // Reads the rest of stdout and waits for exit (or kills it at the deadline). Returns the exit status
  // as from waitpid (-1 when killed for the deadline).
  int finish(int64_t timeout_ms, std::string* out) {
    const int64_t end = mono_ms() + timeout_ms;
    for (;;) {
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
    int status = 0;
    for (;;) {
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return status;
      }
      if (mono_ms() > end) {
        kill_now(SIGKILL, 1000);
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  void kill_now(int sig, int64_t grace_ms) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    const int64_t end = mono_ms() + grace_ms;
    int status;
    while (mono_ms() < end) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string buf_;
  std::string out_;
};

struct RunResult {
  int exit_code = -1;  // -1: killed at the deadline or by a signal
  bool signaled = false;
  std::string out;
  int64_t elapsed_ms = 0;
};

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

// The value of key=value in a ready line.
inline std::string ready_field(const std::string& line, const std::string& key) {
  std::istringstream is(line);
  std::string tok;
  while (is >> tok) {
    if (tok.rfind(key + "=", 0) == 0) return tok.substr(key.size() + 1);
  }
  return "";
}

}  // namespace mc::transfer::testing
