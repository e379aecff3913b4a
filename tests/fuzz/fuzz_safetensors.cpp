// Fuzz harness: the safetensors header parser every checkpoint file goes through before anything of it is used
// (model/include/mc/model/safetensors.hpp: parse_safetensors_header). Input: one control byte, then the file's first
// bytes; the file is taken to be that long plus 8 · (control byte) bytes (data beyond what the parser is given, as
// when SafetensorsFile parses a large mapping). Invariants: no crash or throw; a refusal is kInvalidArgument or
// kDataLoss (or kResourceExhausted) with a message naming the file; an accepted header has data_start = 8 + N within
// the file, at most the limits' tensors, names and ranks, and every tensor's bytes lie inside the data section,
// match its shape and dtype, and overlap no other tensor's.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mc/model/safetensors.hpp"

namespace {

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "fuzz_safetensors: invariant broken: %s\n", what);
  std::abort();
}

constexpr std::string_view kName = "fuzz.safetensors";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view prefix(reinterpret_cast<const char*>(data) + 1, size - 1);
  const uint64_t file_size_bytes = prefix.size() + 8 * uint64_t{data[0]};
  mc::Result<mc::model::SafetensorsHeader> h = mc::model::parse_safetensors_header(prefix, file_size_bytes, kName);
  if (!h.is_ok()) {
    const mc::Code code = h.status().code();
    if (code != mc::Code::kInvalidArgument && code != mc::Code::kDataLoss && code != mc::Code::kResourceExhausted) {
      broken("a refusal that is neither kInvalidArgument, kDataLoss nor kResourceExhausted");
    }
    if (h.status().message().find(kName) == std::string::npos) broken("a refusal that does not name the file");
    return 0;
  }
  if (h->header_size_bytes > mc::model::kMaxSafetensorsHeaderBytes) broken("a header over the limit");
  if (h->data_start_bytes != 8 + h->header_size_bytes) broken("data_start is not 8 + N");
  if (h->data_start_bytes > file_size_bytes || h->data_end_bytes > file_size_bytes) broken("data past the file");
  if (h->data_end_bytes < h->data_start_bytes) broken("data ends before it starts");
  if (h->tensors.size() > mc::model::kMaxSafetensorsTensors) broken("more tensors than the limit");
  std::vector<std::pair<uint64_t, uint64_t>> extents;
  for (const auto& [name, info] : h->tensors) {
    if (name.empty() || name.size() > mc::model::kMaxSafetensorsNameBytes) broken("a name outside the limits");
    if (info.shape.size() > mc::model::kMaxSafetensorsRank) broken("a rank over the limit");
    int64_t elements = 1;
    for (const int64_t d : info.shape) {
      if (d < 0 || __builtin_mul_overflow(elements, d, &elements)) broken("a shape that overflows");
    }
    if (elements != info.element_count) broken("element_count is not the product of the shape");
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(elements), mc::model::dtype_size_bytes(info.dtype), &bytes) ||
        bytes != info.size_bytes) {
      broken("size_bytes is not element_count times the dtype size");
    }
    if (info.file_offset_bytes < h->data_start_bytes || info.file_offset_bytes > file_size_bytes ||
        info.size_bytes > file_size_bytes - info.file_offset_bytes ||
        info.file_offset_bytes + info.size_bytes > h->data_end_bytes) {
      broken("a tensor outside the data section");
    }
    if (info.size_bytes > 0) extents.emplace_back(info.file_offset_bytes, info.file_offset_bytes + info.size_bytes);
  }
  std::sort(extents.begin(), extents.end());
  for (size_t i = 1; i < extents.size(); ++i) {
    if (extents[i].first < extents[i - 1].second) broken("two tensors overlap");
  }
  return 0;
}
