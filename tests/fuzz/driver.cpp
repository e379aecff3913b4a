// The fuzz harnesses' own main for builds without libFuzzer (the GCC sanitizer build CI runs): runs every
// file of the seed corpus directories named on the command line through LLVMFuzzerTestOneInput, then
// deterministic mutations of them (byte flips, byte sets, truncations, insertions, erasures, splices of two
// seeds; fixed seed) until --runs executions or --seconds have passed, whichever comes first, and prints
// what it ran. A harness aborts on a broken invariant and the sanitizers on a memory error, so a clean
// exit is the test's pass. Usage: fuzz_X [--runs N] [--seconds S] CORPUS_DIR...
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "mc/common/splitmix.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// The input being run, written to ./crash-<pid> when the run dies (a sanitizer report or an abort), so
// that it can become a regression test.
const std::string* g_current = nullptr;

void save_current() {
  if (g_current == nullptr) return;
  char path[64];
  std::snprintf(path, sizeof path, "crash-%d", static_cast<int>(getpid()));
  if (FILE* f = std::fopen(path, "wb")) {
    std::fwrite(g_current->data(), 1, g_current->size(), f);
    std::fclose(f);
    std::fprintf(stderr, "fuzz driver: the failing input (%zu bytes) is in %s\n", g_current->size(), path);
  }
  g_current = nullptr;
}

void on_abort(int sig) {
  save_current();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void run_one(const std::string& input) {
  g_current = &input;
  // A copy in a heap block of exactly its size, so that AddressSanitizer sees any read past its end.
  std::vector<uint8_t> exact(input.begin(), input.end());
  LLVMFuzzerTestOneInput(exact.data(), exact.size());
  g_current = nullptr;
}

std::string mutate(const std::vector<std::string>& seeds, uint64_t& rng) {
  std::string s = seeds[mc::splitmix64(rng) % seeds.size()];
  const int edits = 1 + static_cast<int>(mc::splitmix64(rng) % 4);
  for (int e = 0; e < edits; ++e) {
    const uint64_t r = mc::splitmix64(rng);
    const size_t at = s.empty() ? 0 : static_cast<size_t>((r >> 8) % s.size());
    switch (r % 7) {
      case 0:  // flip one bit
        if (!s.empty()) s[at] = static_cast<char>(s[at] ^ (1 << ((r >> 40) % 8)));
        break;
      case 1: {  // set a byte to an interesting value
        static constexpr uint8_t kValues[] = {0x00, 0x01, 0x7f, 0x80, 0xff, 0xc0, 0xc1, 0xdc, 0xdd, 0xde, 0xdf};
        if (!s.empty()) s[at] = static_cast<char>(kValues[(r >> 40) % std::size(kValues)]);
        break;
      }
      case 2:  // truncate
        s.resize(at);
        break;
      case 3:  // insert random bytes
        s.insert(at, std::string(1 + (r >> 40) % 8, static_cast<char>(r >> 48)));
        break;
      case 4:  // erase a few bytes
        if (!s.empty()) s.erase(at, 1 + (r >> 40) % 8);
        break;
      case 5: {  // splice the tail of another seed
        const std::string& other = seeds[(r >> 40) % seeds.size()];
        const size_t from = other.empty() ? 0 : static_cast<size_t>((r >> 20) % other.size());
        s = s.substr(0, at) + other.substr(from);
        break;
      }
      default:  // random byte
        if (!s.empty()) s[at] = static_cast<char>(r >> 40);
        break;
    }
  }
  return s;
}

}  // namespace

// Called by AddressSanitizer and UndefinedBehaviorSanitizer before they exit on an error (weak: absent
// without the sanitizers).
extern "C" void __sanitizer_set_death_callback(void (*callback)()) __attribute__((weak));

int main(int argc, char** argv) {
  std::signal(SIGABRT, on_abort);
  if (__sanitizer_set_death_callback != nullptr) __sanitizer_set_death_callback(save_current);
  long runs = 20000;
  double seconds = 10;
  std::vector<std::string> seeds;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--runs" && i + 1 < argc) {
      runs = std::atol(argv[++i]);
    } else if (arg == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else {
      std::error_code ec;
      for (const auto& entry : std::filesystem::directory_iterator(std::string(arg), ec)) {
        if (!entry.is_regular_file()) continue;
        std::ifstream in(entry.path(), std::ios::binary);
        seeds.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      }
      if (ec) {
        std::fprintf(stderr, "fuzz driver: cannot read corpus directory %s: %s\n", argv[i], ec.message().c_str());
        return 2;
      }
    }
  }
  if (seeds.empty()) seeds.emplace_back();  // no corpus: mutate the empty input
  const auto start = std::chrono::steady_clock::now();
  long done = 0;
  for (const std::string& s : seeds) {
    run_one(s);
    ++done;
  }
  uint64_t rng = 0x6d632d66757a7aULL;  // "mc-fuzz"
  double elapsed = 0;
  while (done < runs) {
    run_one(mutate(seeds, rng));
    ++done;
    if (done % 256 == 0) {
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (elapsed >= seconds) break;
    }
  }
  elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fuzz driver: %ld executions (%zu seeds, %ld mutations) in %.2f s\n", done, seeds.size(),
              done - static_cast<long>(seeds.size()), elapsed);
  return 0;
}
