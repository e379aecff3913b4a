// Safetensors files and Hugging Face checkpoint directories (library mc_model; issue 49 item 1).
//
// The format (https://github.com/huggingface/safetensors, README, "Format"):
//   bytes [0, 8)        N, the header's length in bytes, an unsigned 64-bit little-endian integer;
//   bytes [8, 8 + N)    the header: a UTF-8 JSON object. Each key is a tensor name mapping to
//                         {"dtype": "BF16", "shape": [d0, d1, ...], "data_offsets": [begin, end]}
//                       with begin/end byte offsets relative to the first byte after the header (byte 8 + N), so
//                       the tensor's bytes are [8 + N + begin, 8 + N + end) of the file, row-major (C order),
//                       little-endian, end - begin = product(shape) · dtype size (shape [] is a scalar of one
//                       element). The optional key "__metadata__" maps to an object of string -> string.
//                       Writers pad the JSON with trailing spaces so that 8 + N is a multiple of 8.
//   bytes [8 + N, ...)  the data section.
// The reference implementation also requires the tensors to tile the data section without gaps; this reader only
// requires that they lie inside it and do not overlap, and ignores keys of a tensor's entry other than the three.
//
// Untrusted input: parse_safetensors_header bounds everything a file declares before it allocates for it (the limits
// below), checks every size with overflow-checked arithmetic, and reports each problem as a Status naming the file
// (the display name given), the tensor and what is wrong, with the remedy where there is one: kInvalidArgument for a
// malformed header (bad JSON, a field of the wrong type, an unknown dtype, a limit passed), kDataLoss for bytes
// that are missing (a file shorter than its header says), kResourceExhausted if memory runs out. Nothing here
// throws or aborts.
//
// Units: sizes and offsets in bytes (uint64_t, as in the file), shapes in elements (int64_t, each dimension
// at most 2^63 - 1 and their product too).
//
// Ownership: a TensorView points into the memory map of the SafetensorsFile (or Checkpoint) it came from and is
// valid as long as that object lives. The file is mapped read-only and private; truncating it on disk while it is
// open makes touching the lost pages raise SIGBUS (as with any mapping), so replace checkpoint files by renaming
// (write_safetensors does).
// Thread-safety: SafetensorsFile and Checkpoint are immutable after open; their const methods may be called from
// many threads at once. The free functions are pure (write_safetensors writes only its own files).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mc/common/status.hpp"

namespace mc::model {

// Limits on what a safetensors header may declare (each refusal says which was passed).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{64} << 20;  // N; real checkpoints: under 1 MiB
inline constexpr size_t kMaxSafetensorsTensors = size_t{1} << 17;           // tensors in one file
inline constexpr size_t kMaxSafetensorsNameBytes = 1024;                    // bytes of one tensor name
inline constexpr size_t kMaxSafetensorsRank = 8;                            // dimensions of one shape
// The longest model.safetensors.index.json read (a 100,000-tensor index is about 8 MiB).
inline constexpr uint64_t kMaxSafetensorsIndexBytes = uint64_t{64} << 20;

// The limits parse_safetensors_header applies: the defaults above (SafetensorsFile and Checkpoint use them; a test
// may lower them to reach a limit with a small input).
struct SafetensorsLimits {
  uint64_t max_header_bytes = kMaxSafetensorsHeaderBytes;
  size_t max_tensors = kMaxSafetensorsTensors;
  size_t max_name_bytes = kMaxSafetensorsNameBytes;
  size_t max_rank = kMaxSafetensorsRank;
};

// The element types of the format. BF16, F16 and F32 are the ones mc computes with (to_float below); the others
// are recognised so that a reader can refuse them by name.
enum class Dtype : uint8_t {
  kBF16,
  kF16,
  kF32,
  kF64,
  kI64,
  kI32,
  kI16,
  kI8,
  kU64,
  kU32,
  kU16,
  kU8,
  kBool,
  kF8E4M3,
  kF8E5M2
};

// The format's name of a dtype ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(Dtype dtype);
// Bytes of one element (1, 2, 4 or 8).
uint64_t dtype_size_bytes(Dtype dtype);
// The dtype of a format name, or false when the name is not one of the format's (case-sensitive, as the format).
bool dtype_from_name(std::string_view name, Dtype* out);
// True for BF16, F16 and F32.
bool dtype_is_float(Dtype dtype);

struct TensorInfo {
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;      // elements per dimension, outermost first; empty for a scalar
  uint64_t file_offset_bytes = 0;  // where its bytes start, from the start of the file (8 + N + begin)
  uint64_t size_bytes = 0;         // end - begin = element_count · dtype_size_bytes
  int64_t element_count = 1;       // product of shape
};

struct SafetensorsHeader {
  uint64_t header_size_bytes = 0;  // N
  uint64_t data_start_bytes = 0;   // 8 + N: the data section's first byte in the file
  uint64_t data_end_bytes = 0;     // the end of the last tensor's bytes in the file (>= data_start_bytes)
  std::map<std::string, TensorInfo, std::less<>> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__", empty when absent
};

// Parses and checks the header of a safetensors file of `file_size_bytes` bytes whose first bytes are
// `file_prefix` (at least 8 + N of them; more are ignored). `display_name` names the file in every message.
// Checks: N <= max_header_bytes and 8 + N <= file_size_bytes; the header is one JSON object (nesting at most 8
// levels, at most 4 · max_tensors + 2 arrays and objects and 16 · max_tensors + 2 values, checked before parsing)
// without duplicate keys at any level; at most max_tensors tensors with names of 1 to max_name_bytes bytes; each
// entry has a known dtype, a shape of at most max_rank non-negative integer dimensions whose product times the
// dtype size does not overflow, and data_offsets [begin, end] with begin <= end, end - begin = that product, and
// 8 + N + end <= file_size_bytes; no two tensors share a byte; "__metadata__" is an object of strings.
Result<SafetensorsHeader> parse_safetensors_header(std::string_view file_prefix, uint64_t file_size_bytes,
                                                   std::string_view display_name = "safetensors header",
                                                   const SafetensorsLimits& limits = {});

// One tensor's bytes in place: `data` points into a mapping (see Ownership above) and may be unaligned for the
// dtype when the file's offsets are (files written by write_safetensors and the reference writer are aligned);
// read elements with memcpy or to_float.
struct TensorView {
  const std::byte* data = nullptr;
  Dtype dtype = Dtype::kF32;
  std::span<const int64_t> shape;  // into the owning file's TensorInfo
  uint64_t size_bytes = 0;
  int64_t element_count = 0;
};

// Converts a BF16, F16 or F32 tensor to fp32 into `out` (exactly element_count floats; exact, as the helpers
// below). kInvalidArgument naming `name` and the dtype for any other dtype, or for a size mismatch of `out`.
Status to_float(const TensorView& view, std::span<float> out, std::string_view name);

// A safetensors file, memory-mapped read-only for as long as the object lives.
class SafetensorsFile {
 public:
  // Maps `path` and parses its header. Errors name the path: kInvalidArgument when it cannot be opened or is not a
  // regular file or its header is malformed; kDataLoss when it is shorter than its header needs (with its size and
  // the size needed); kIo when mapping fails.
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size_bytes() const { return size_bytes_; }
  const std::map<std::string, TensorInfo, std::less<>>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  // The tensor's bytes in place; kNotFound naming the tensor and the file.
  Result<TensorView> tensor(std::string_view name) const;

 private:
  SafetensorsFile(std::string path, const std::byte* base, uint64_t size_bytes, SafetensorsHeader header);

  std::string path_;
  const std::byte* base_ = nullptr;  // the mapping of the whole file
  uint64_t size_bytes_ = 0;
  SafetensorsHeader header_;
};

// The weights of a Hugging Face model directory: either `model.safetensors`, or `model.safetensors.index.json`
// ({"metadata": {...}, "weight_map": {tensor: shard file name}}) and the shards it names. model.safetensors wins
// when both exist (as Hugging Face transformers loads it first).
class Checkpoint {
 public:
  static constexpr std::string_view kSingleFileName = "model.safetensors";
  static constexpr std::string_view kIndexFileName = "model.safetensors.index.json";

  // Opens every file of the checkpoint in `dir`. Errors name the directory or the file: neither file present
  // (kInvalidArgument naming both names); an index that is not JSON of the shape above, or names a shard that is
  // not a plain file name inside the directory ("../x", "/abs", "a/b"); a tensor the index names that its shard
  // lacks (kInvalidArgument naming the tensor and the shard); and every error of SafetensorsFile::open.
  static Result<std::unique_ptr<Checkpoint>> open(const std::string& dir);
  ~Checkpoint();

  const std::string& dir() const { return dir_; }
  // Every tensor of the checkpoint (the index's weight map, or the single file's tensors), sorted.
  std::vector<std::string> tensor_names() const;
  // The tensor in the shard that holds it; kNotFound naming the tensor and the directory.
  Result<TensorView> tensor(std::string_view name) const;
  // The index's "metadata" (non-string values as their JSON text, e.g. "total_size") or the single file's
  // "__metadata__".
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The paths of the files opened, in the order opened.
  std::vector<std::string> file_paths() const;

 private:
  Checkpoint() = default;

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t, std::less<>> where_;  // tensor -> index into files_
  std::map<std::string, std::string> metadata_;
};

// One tensor to write. `data` holds exactly product(shape) · dtype_size_bytes bytes, row-major, little-endian.
struct TensorToWrite {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;
};

// The first bytes of a safetensors file holding `tensors` (data in the given order, contiguous from offset 0) and
// `metadata`: N as 8 little-endian bytes, then the JSON header padded with spaces so that 8 + N is a multiple of 8.
// The header is checked with parse_safetensors_header before it is returned, so whatever it refuses (a duplicate
// or empty name, a rank above 8, a data size that disagrees with the shape) is refused here, named the same way.
// Also kInvalidArgument when a tensor's offset would not be a multiple of its dtype size (the format has no padding
// between tensors: put the tensors with larger elements first) or a name is not valid UTF-8.
Result<std::string> encode_safetensors_header(const std::vector<TensorToWrite>& tensors,
                                              const std::map<std::string, std::string>& metadata);

// Writes the file: the header above, then each tensor's data, into PATH.partial, then renamed over `path`, so
// a reader never sees a partial file. kIo naming the path and errno's text; the header's errors as above.
Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata);

// Exact conversions between fp32 and the 16-bit formats. Widening is exact for every input (NaN payloads and
// signs kept). Narrowing rounds to nearest, ties to even; values beyond the format's range become ±Inf (fp16: from
// 65520 up), below half the smallest subnormal ±0; NaN stays NaN with its sign and the payload bits that fit (the
// quiet bit set only when none of those is set), so narrowing a widened value gives back the same bits.
float bf16_to_float(uint16_t bits);
float fp16_to_float(uint16_t bits);
uint16_t float_to_bf16(float value);
uint16_t float_to_fp16(float value);

}  // namespace mc::model
