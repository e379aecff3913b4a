// The limit of mc-gateway's request rate (docs/BENCHMARKS.md "Gateway"): the same HTTP library (cpp-httplib) with
// the gateway's server settings (worker threads, keep-alive, TCP_NODELAY) answering every POST /v1/completions
// with one fixed completion document of the size a 1-token answer has. No cluster, no JSON parsing, no tokenizer:
// what is left is the library's own cost, which the gateway cannot beat.
// Usage: http_fixed_server [PORT] [THREADS]; prints "ready http_fixed_server http://127.0.0.1:PORT"; SIGTERM stops.
#include <httplib.h>

#include "mc/net/http_pool.hpp"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace {
httplib::Server* g_server = nullptr;
void on_signal(int) {
  if (g_server != nullptr) g_server->stop();
}
}  // namespace

int main(int argc, char** argv) {
  const int want_port = argc > 1 ? std::atoi(argv[1]) : 0;
  const size_t threads = argc > 2 ? static_cast<size_t>(std::atoi(argv[2])) : 256;
  httplib::Server server;
  server.new_task_queue = [threads] { return new mc::http::BoundedPool(threads, threads); };
  mc::http::no_shared_port(server);
  server.set_keep_alive_max_count(10'000);
  server.set_keep_alive_timeout(5);
  server.set_tcp_nodelay(true);
  const std::string body =
      R"({"id":"cmpl-gw-0000000000000000-1","object":"text_completion","created":1764800000,"model":"llama3-70b",)"
      R"("choices":[{"index":0,"finish_reason":"length","logprobs":null,"text":"x"}],"usage":{"prompt_tokens":8,)"
      R"("completion_tokens":1,"total_tokens":9,"prompt_tokens_details":{"cached_tokens":0}}})";
  server.Post("/v1/completions",
              [&](const httplib::Request&, httplib::Response& res) { res.set_content(body, "application/json"); });
  const int port = want_port == 0 ? server.bind_to_any_port("127.0.0.1") : want_port;
  if (port <= 0 || (want_port != 0 && !server.bind_to_port("127.0.0.1", port))) {
    std::fprintf(stderr, "http_fixed_server: cannot listen on 127.0.0.1:%d\n", want_port);
    return 1;
  }
  g_server = &server;
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  std::printf("ready http_fixed_server http://127.0.0.1:%d\n", port);
  std::fflush(stdout);
  server.listen_after_bind();
  return 0;
}
