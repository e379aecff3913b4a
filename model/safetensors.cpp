// Safetensors files and Hugging Face checkpoint directories (mc/model/safetensors.hpp).
#include "mc/model/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iterator>
#include <limits>
#include <new>
#include <unordered_set>
#include <utility>

#include <nlohmann/json.hpp>
#include "mc/common/fd.hpp"
#include "mc/common/json_guard.hpp"

namespace mc::model {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; TensorView hands out the file's bytes as they are");

namespace {

using nlohmann::json;

struct DtypeEntry {
  Dtype dtype;
  std::string_view name;
  uint64_t size_bytes;
};

// In the order of enum class Dtype (checked below), so that a Dtype indexes it.
constexpr DtypeEntry kDtypes[] = {
    {Dtype::kBF16, "BF16", 2}, {Dtype::kF16, "F16", 2},        {Dtype::kF32, "F32", 4},        {Dtype::kF64, "F64", 8},
    {Dtype::kI64, "I64", 8},   {Dtype::kI32, "I32", 4},        {Dtype::kI16, "I16", 2},        {Dtype::kI8, "I8", 1},
    {Dtype::kU64, "U64", 8},   {Dtype::kU32, "U32", 4},        {Dtype::kU16, "U16", 2},        {Dtype::kU8, "U8", 1},
    {Dtype::kBool, "BOOL", 1}, {Dtype::kF8E4M3, "F8_E4M3", 1}, {Dtype::kF8E5M2, "F8_E5M2", 1},
};

constexpr bool dtype_table_in_enum_order() {
  for (size_t i = 0; i < std::size(kDtypes); ++i) {
    if (static_cast<size_t>(kDtypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(dtype_table_in_enum_order());

std::string known_dtype_names() {
  std::string out;
  for (const DtypeEntry& e : kDtypes) out += (out.empty() ? "" : ", ") + std::string(e.name);
  return out;
}

// A name from a file, quoted for a message; a very long one is cut (the limit error says how long it was).
std::string quote_name(std::string_view name) {
  constexpr size_t kShownBytes = 120;
  if (name.size() <= kShownBytes) return "'" + std::string(name) + "'";
  return "'" + std::string(name.substr(0, kShownBytes)) + "...'";
}

Status file_error(Code code, std::string_view display, const std::string& what) {
  return Status(code, std::string(display) + ": " + what);
}

Status tensor_error(Code code, std::string_view display, std::string_view tensor, const std::string& what) {
  return file_error(code, display, "tensor " + quote_name(tensor) + ": " + what);
}

constexpr std::string_view kCorruptRemedy = "the file is corrupt or was not written by a safetensors writer";

// Parses untrusted JSON text: its shape bounded first (check_json_shape), then parsed with a callback that refuses
// a key repeated in one object (nlohmann::json would silently keep the last one, so a crafted header could show
// one tensor to one reader and another to us). `what` names the text in messages ("header", "index").
// At most 4 containers and 16 values a tensor: a rank-8 entry is 3 containers and 14 values.
Result<json> parse_json_unique_keys(std::string_view text, std::string_view display, std::string_view what,
                                    size_t max_tensors) {
  JsonShapeLimits limits;
  limits.max_depth = 8;  // the format needs 3: header object, tensor entry, shape array
  limits.max_containers = 4 * max_tensors + 2;
  limits.max_values = 16 * max_tensors + 2;
  if (Status s = check_json_shape(text, limits, ""); !s.is_ok()) {
    return file_error(Code::kInvalidArgument, display, std::string(what) + ": " + s.message());
  }
  std::vector<std::unordered_set<std::string>> keys_at;  // [d]: the keys seen of the object opened at depth d
  std::string top_key;                                   // the last key of the outermost object
  std::string duplicate, duplicate_owner;
  bool found_duplicate = false;
  const json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    const auto d = static_cast<size_t>(depth);
    if (event == json::parse_event_t::object_start) {
      if (keys_at.size() <= d) keys_at.resize(d + 1);
      keys_at[d].clear();
    } else if (event == json::parse_event_t::key && d >= 1 && d <= keys_at.size() && !found_duplicate) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!keys_at[d - 1].insert(key).second) {
        found_duplicate = true;
        duplicate = key;
        duplicate_owner = d == 1 ? std::string() : top_key;
      } else if (d == 1) {
        top_key = key;
      }
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true);
  } catch (const json::exception& e) {
    return file_error(Code::kInvalidArgument, display,
                      std::string(what) + " is not valid JSON (" + e.what() + "); " + std::string(kCorruptRemedy));
  }
  if (found_duplicate) {
    return file_error(
        Code::kInvalidArgument, display,
        std::string(what) + ": key " + quote_name(duplicate) + " appears twice" +
            (duplicate_owner.empty() ? std::string() : " in the entry of " + quote_name(duplicate_owner)) +
            " (JSON readers disagree on which one counts); " + std::string(kCorruptRemedy));
  }
  return j;
}

uint64_t read_le64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// One tensor's entry checked against the format, except against the file's size (the caller's).
Result<TensorInfo> parse_tensor_entry(const std::string& name, const json& entry, std::string_view display,
                                      const SafetensorsLimits& limits) {
  auto fail = [&](const std::string& what) { return tensor_error(Code::kInvalidArgument, display, name, what); };
  if (name.empty()) return file_error(Code::kInvalidArgument, display, "a tensor has an empty name");
  if (name.size() > limits.max_name_bytes) {
    return fail("its name is " + std::to_string(name.size()) + " bytes, over the limit of " +
                std::to_string(limits.max_name_bytes));
  }
  if (!entry.is_object()) return fail("its entry is a JSON " + std::string(entry.type_name()) + ", not an object");
  TensorInfo info;
  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) return fail("\"dtype\" is missing or not a string");
  const auto& dtype_text = dtype_it->get_ref<const std::string&>();
  if (!dtype_from_name(dtype_text, &info.dtype)) {
    return fail("unknown dtype " + quote_name(dtype_text) + " (known: " + known_dtype_names() + ")");
  }
  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) return fail("\"shape\" is missing or not an array");
  if (shape_it->size() > limits.max_rank) {
    return fail("its shape has " + std::to_string(shape_it->size()) + " dimensions, over the limit of " +
                std::to_string(limits.max_rank));
  }
  int64_t elements = 1;
  bool overflow = false;
  for (const json& dim : *shape_it) {
    if (!dim.is_number_unsigned() || dim.get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()}) {
      return fail("shape " + shape_it->dump() + " has a dimension that is not an integer in [0, 2^63)");
    }
    info.shape.push_back(static_cast<int64_t>(dim.get<uint64_t>()));
    overflow = overflow || __builtin_mul_overflow(elements, info.shape.back(), &elements);
  }
  const uint64_t element_bytes = dtype_size_bytes(info.dtype);
  uint64_t size_bytes = 0;
  if (overflow || __builtin_mul_overflow(static_cast<uint64_t>(elements), element_bytes, &size_bytes)) {
    return fail("shape " + shape_it->dump() + " of " + dtype_text + " overflows 64 bits; " +
                std::string(kCorruptRemedy));
  }
  info.element_count = elements;
  const auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    return fail("\"data_offsets\" is missing or not two non-negative integers [begin, end]");
  }
  const auto begin = (*offsets_it)[0].get<uint64_t>();
  const auto end = (*offsets_it)[1].get<uint64_t>();
  if (end < begin) return fail("data_offsets " + offsets_it->dump() + " end before they begin");
  if (end - begin != size_bytes) {
    return fail("data_offsets " + offsets_it->dump() + " hold " + std::to_string(end - begin) + " bytes, but shape " +
                shape_it->dump() + " of " + dtype_text + " needs " + std::to_string(size_bytes) + "; " +
                std::string(kCorruptRemedy));
  }
  info.size_bytes = size_bytes;
  info.file_offset_bytes = begin;  // relative to the data section until the caller has checked the file's size
  return info;
}

Result<std::map<std::string, std::string>> parse_metadata(const json& j, std::string_view display) {
  if (!j.is_object()) {
    return file_error(Code::kInvalidArgument, display,
                      "\"__metadata__\" is a JSON " + std::string(j.type_name()) + ", not an object of strings");
  }
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : j.items()) {
    if (!value.is_string()) {
      return file_error(
          Code::kInvalidArgument, display,
          "\"__metadata__\" entry " + quote_name(key) + " is not a string (the format allows only strings)");
    }
    out.emplace(key, value.get<std::string>());
  }
  return out;
}

Result<SafetensorsHeader> parse_header(std::string_view prefix, uint64_t file_size_bytes, std::string_view display,
                                       const SafetensorsLimits& limits) {
  constexpr uint64_t kLengthBytes = 8;
  if (file_size_bytes < kLengthBytes || prefix.size() < kLengthBytes) {
    return file_error(Code::kDataLoss, display,
                      "the file is " + std::to_string(std::min<uint64_t>(file_size_bytes, prefix.size())) +
                          " bytes, shorter than the 8-byte header length a safetensors file starts with (truncated, "
                          "or not a safetensors file)");
  }
  SafetensorsHeader h;
  h.header_size_bytes = read_le64(prefix.data());
  if (h.header_size_bytes > limits.max_header_bytes) {
    return file_error(Code::kInvalidArgument, display,
                      "header length " + std::to_string(h.header_size_bytes) + " bytes is over the limit of " +
                          std::to_string(limits.max_header_bytes) +
                          " bytes (not a safetensors file, or a corrupt one)");
  }
  if (h.header_size_bytes > file_size_bytes - kLengthBytes) {
    return file_error(Code::kDataLoss, display,
                      "header length " + std::to_string(h.header_size_bytes) + " bytes reaches past the end of the " +
                          std::to_string(file_size_bytes) + "-byte file (truncated: download or copy it again)");
  }
  if (h.header_size_bytes > prefix.size() - kLengthBytes) {
    return file_error(Code::kInvalidArgument, display,
                      "only " + std::to_string(prefix.size()) + " bytes of the file were given to the parser, the " +
                          "header needs " + std::to_string(kLengthBytes + h.header_size_bytes));
  }
  h.data_start_bytes = kLengthBytes + h.header_size_bytes;
  MC_ASSIGN_OR_RETURN(json j, parse_json_unique_keys(prefix.substr(kLengthBytes, h.header_size_bytes), display,
                                                     "header", limits.max_tensors));
  if (!j.is_object()) {
    return file_error(
        Code::kInvalidArgument, display,
        "the header is a JSON " + std::string(j.type_name()) + ", not an object; " + std::string(kCorruptRemedy));
  }
  const size_t tensor_count = j.size() - (j.contains("__metadata__") ? 1 : 0);
  if (tensor_count > limits.max_tensors) {
    return file_error(Code::kInvalidArgument, display,
                      "the header declares " + std::to_string(tensor_count) + " tensors, over the limit of " +
                          std::to_string(limits.max_tensors) + " in one file (split the checkpoint into shards)");
  }
  const uint64_t data_size_bytes = file_size_bytes - h.data_start_bytes;
  uint64_t max_end = 0;  // relative to the data section
  std::string max_end_tensor;
  struct Extent {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Extent> extents;
  for (const auto& [name, entry] : j.items()) {
    if (name == "__metadata__") {
      MC_ASSIGN_OR_RETURN(h.metadata, parse_metadata(entry, display));
      continue;
    }
    MC_ASSIGN_OR_RETURN(TensorInfo info, parse_tensor_entry(name, entry, display, limits));
    const uint64_t begin = info.file_offset_bytes;
    const uint64_t end = begin + info.size_bytes;  // no overflow: it is the entry's own end offset
    if (max_end_tensor.empty() || end > max_end) {
      max_end = end;
      max_end_tensor = name;
    }
    auto it = h.tensors.emplace(name, std::move(info)).first;
    if (it->second.size_bytes > 0) extents.push_back({begin, end, &it->first});
  }
  if (max_end > data_size_bytes) {
    uint64_t needed = 0;
    const bool representable = !__builtin_add_overflow(h.data_start_bytes, max_end, &needed);
    return file_error(Code::kDataLoss, display,
                      "the file is " + std::to_string(file_size_bytes) + " bytes, but its header needs " +
                          (representable ? std::to_string(needed) : std::string("more than 2^64")) + " (tensor " +
                          quote_name(max_end_tensor) +
                          " ends there): the file is truncated, or its header corrupt; download or copy it again");
  }
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < extents.size(); ++i) {
    if (extents[i].begin < extents[i - 1].end) {
      return tensor_error(Code::kInvalidArgument, display, *extents[i].name,
                          "its bytes [" + std::to_string(extents[i].begin) + ", " + std::to_string(extents[i].end) +
                              ") of the data section overlap those of tensor " + quote_name(*extents[i - 1].name) +
                              " [" + std::to_string(extents[i - 1].begin) + ", " + std::to_string(extents[i - 1].end) +
                              "); " + std::string(kCorruptRemedy));
    }
  }
  for (auto& [name, info] : h.tensors) info.file_offset_bytes += h.data_start_bytes;  // all within the file now
  h.data_end_bytes = h.data_start_bytes + max_end;
  return h;
}

// A file mapped read-only, whole; unmapped on destruction unless released.
class Mapping {
 public:
  // kInvalidArgument when the file cannot be opened or is not a regular file (naming `what` and the path), kIo when
  // mmap fails. An empty file maps to nothing (data() null, size 0).
  static Result<Mapping> open(const std::string& path, std::string_view what) {
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));  // a FIFO must not block the open
    if (!fd) {
      return Status(Code::kInvalidArgument,
                    "cannot open " + std::string(what) + " '" + path + "': " + std::strerror(errno));
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) {
      return Status(Code::kIo, "cannot stat " + std::string(what) + " '" + path + "': " + std::strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
      return Status(Code::kInvalidArgument, std::string(what) + " '" + path + "' is not a regular file");
    }
    Mapping m;
    m.size_bytes_ = static_cast<uint64_t>(st.st_size);
    if (m.size_bytes_ == 0) return m;
    void* p = ::mmap(nullptr, m.size_bytes_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (p == MAP_FAILED) {
      return Status(Code::kIo, "cannot map " + std::string(what) + " '" + path + "' (" + std::to_string(m.size_bytes_) +
                                   " bytes): " + std::strerror(errno));
    }
    m.data_ = static_cast<const std::byte*>(p);
    return m;
  }

  Mapping() = default;
  Mapping(Mapping&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_bytes_(o.size_bytes_) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      unmap(data_, size_bytes_);
      data_ = std::exchange(o.data_, nullptr);
      size_bytes_ = o.size_bytes_;
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { unmap(data_, size_bytes_); }

  static void unmap(const std::byte* data, uint64_t size_bytes) {
    if (data != nullptr) ::munmap(const_cast<std::byte*>(data), size_bytes);
  }

  const std::byte* data() const { return data_; }
  uint64_t size_bytes() const { return size_bytes_; }
  std::string_view text() const { return {reinterpret_cast<const char*>(data_), size_bytes_}; }
  // The caller takes over the mapping (and unmaps it with unmap()).
  const std::byte* release() { return std::exchange(data_, nullptr); }

 private:
  const std::byte* data_ = nullptr;
  uint64_t size_bytes_ = 0;
};

// Writes all of [data, data + size_bytes) to `fd`; false with errno set when it cannot.
bool write_all(int fd, const std::byte* data, size_t size_bytes) {
  while (size_bytes > 0) {
    const ssize_t n = ::write(fd, data, std::min<size_t>(size_bytes, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    data += n;
    size_bytes -= static_cast<size_t>(n);
  }
  return true;
}

Result<std::string> encode_header(const std::vector<TensorToWrite>& tensors,
                                  const std::map<std::string, std::string>& metadata, std::string_view display) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset_bytes = 0;
  for (const TensorToWrite& t : tensors) {
    const uint64_t element_bytes = dtype_size_bytes(t.dtype);
    if (t.name == "__metadata__" || header.contains(t.name)) {
      return tensor_error(Code::kInvalidArgument, display, t.name,
                          t.name == "__metadata__" ? "the name is reserved for the metadata" : "given twice");
    }
    if (offset_bytes % element_bytes != 0) {
      return tensor_error(Code::kInvalidArgument, display, t.name,
                          "its data would start at offset " + std::to_string(offset_bytes) +
                              ", not a multiple of its " + std::to_string(element_bytes) + "-byte " +
                              std::string(dtype_name(t.dtype)) +
                              " elements (the format has no padding between tensors: write the tensors with larger "
                              "elements first)");
    }
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset_bytes, offset_bytes + t.data.size()}}};
    offset_bytes += t.data.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::exception& e) {
    return file_error(Code::kInvalidArgument, display,
                      std::string("a tensor name or metadata string is not valid UTF-8 (") + e.what() + ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // 8 + N a multiple of 8, as the reference writer pads
  std::string out(8, '\0');
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<char>((uint64_t{text.size()} >> (8 * i)) & 0xff);
  out += text;
  MC_RETURN_IF_ERROR(parse_safetensors_header(out, out.size() + offset_bytes, display).status());
  return out;
}

Result<std::string> encode_header_caught(const std::vector<TensorToWrite>& tensors,
                                         const std::map<std::string, std::string>& metadata, std::string_view display) {
  try {
    return encode_header(tensors, metadata, display);
  } catch (const std::exception& e) {
    return file_error(Code::kInternal, display, std::string("unexpected error encoding the header: ") + e.what());
  }
}

// A shard name of an index must name a file directly inside the checkpoint directory.
bool plain_file_name(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
         name.find('\0') == std::string_view::npos;
}

}  // namespace

std::string_view dtype_name(Dtype dtype) { return kDtypes[static_cast<size_t>(dtype)].name; }

uint64_t dtype_size_bytes(Dtype dtype) { return kDtypes[static_cast<size_t>(dtype)].size_bytes; }

bool dtype_from_name(std::string_view name, Dtype* out) {
  for (const DtypeEntry& e : kDtypes) {
    if (e.name == name) {
      *out = e.dtype;
      return true;
    }
  }
  return false;
}

bool dtype_is_float(Dtype dtype) { return dtype == Dtype::kBF16 || dtype == Dtype::kF16 || dtype == Dtype::kF32; }

Result<SafetensorsHeader> parse_safetensors_header(std::string_view file_prefix, uint64_t file_size_bytes,
                                                   std::string_view display_name, const SafetensorsLimits& limits) {
  try {
    return parse_header(file_prefix, file_size_bytes, display_name, limits);
  } catch (const std::bad_alloc&) {
    return file_error(Code::kResourceExhausted, display_name, "out of memory while parsing the header");
  } catch (const std::exception& e) {
    return file_error(Code::kInternal, display_name, std::string("unexpected error parsing the header: ") + e.what());
  }
}

Status to_float(const TensorView& view, std::span<float> out, std::string_view name) {
  if (!dtype_is_float(view.dtype)) {
    return tensor_error(Code::kInvalidArgument, "to_float", name,
                        "its dtype is " + std::string(dtype_name(view.dtype)) +
                            "; mc computes with BF16, F16 or F32 tensors only (convert the checkpoint)");
  }
  if (view.element_count < 0 || out.size() != static_cast<uint64_t>(view.element_count)) {
    return tensor_error(
        Code::kInvalidArgument, "to_float", name,
        "it has " + std::to_string(view.element_count) + " elements, the output " + std::to_string(out.size()));
  }
  if (view.dtype == Dtype::kF32) {
    if (!out.empty()) std::memcpy(out.data(), view.data, out.size() * sizeof(float));
    return Status::ok();
  }
  const bool bf16 = view.dtype == Dtype::kBF16;
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t bits = 0;
    std::memcpy(&bits, view.data + 2 * i, sizeof bits);
    out[i] = bf16 ? bf16_to_float(bits) : fp16_to_float(bits);
  }
  return Status::ok();
}

SafetensorsFile::SafetensorsFile(std::string path, const std::byte* base, uint64_t size_bytes, SafetensorsHeader header)
    : path_(std::move(path)), base_(base), size_bytes_(size_bytes), header_(std::move(header)) {}

SafetensorsFile::~SafetensorsFile() { Mapping::unmap(base_, size_bytes_); }

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  MC_ASSIGN_OR_RETURN(Mapping mapping, Mapping::open(path, "safetensors file"));
  MC_ASSIGN_OR_RETURN(SafetensorsHeader header, parse_safetensors_header(mapping.text(), mapping.size_bytes(), path));
  const uint64_t size_bytes = mapping.size_bytes();
  return std::unique_ptr<SafetensorsFile>(new SafetensorsFile(path, mapping.release(), size_bytes, std::move(header)));
}

Result<TensorView> SafetensorsFile::tensor(std::string_view name) const {
  const auto it = header_.tensors.find(name);
  if (it == header_.tensors.end()) {
    return file_error(
        Code::kNotFound, path_,
        "no tensor " + quote_name(name) + " (the file has " + std::to_string(header_.tensors.size()) + " tensors)");
  }
  const TensorInfo& info = it->second;
  return TensorView{base_ + info.file_offset_bytes, info.dtype, info.shape, info.size_bytes, info.element_count};
}

Checkpoint::~Checkpoint() = default;

Result<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Status(Code::kInvalidArgument, "checkpoint directory '" + dir + "' does not exist or is not a directory");
  }
  std::unique_ptr<Checkpoint> c(new Checkpoint());
  c->dir_ = dir;
  const std::string single = (fs::path(dir) / kSingleFileName).string();
  const std::string index = (fs::path(dir) / kIndexFileName).string();
  if (fs::exists(single, ec)) {
    MC_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::open(single));
    for (const auto& [name, info] : file->tensors()) c->where_.emplace(name, 0);
    c->metadata_ = file->metadata();
    c->files_.push_back(std::move(file));
    return c;
  }
  if (!fs::exists(index, ec)) {
    return Status(Code::kInvalidArgument, "checkpoint directory '" + dir + "' has neither " +
                                              std::string(kSingleFileName) + " nor " + std::string(kIndexFileName) +
                                              " (a Hugging Face model directory with safetensors weights; convert "
                                              "PyTorch .bin weights to safetensors first)");
  }
  MC_ASSIGN_OR_RETURN(Mapping mapping, Mapping::open(index, "checkpoint index"));
  if (mapping.size_bytes() > kMaxSafetensorsIndexBytes) {
    return file_error(Code::kInvalidArgument, index,
                      "the index is " + std::to_string(mapping.size_bytes()) + " bytes, over the limit of " +
                          std::to_string(kMaxSafetensorsIndexBytes));
  }
  try {
    MC_ASSIGN_OR_RETURN(json j, parse_json_unique_keys(mapping.text(), index, "index", kMaxSafetensorsTensors));
    const auto map_it = j.is_object() ? j.find("weight_map") : j.end();
    if (map_it == j.end() || !map_it->is_object() || map_it->empty()) {
      return file_error(Code::kInvalidArgument, index,
                        "not an object with a non-empty \"weight_map\" object {tensor: shard file name}");
    }
    if (const auto meta_it = j.find("metadata"); meta_it != j.end()) {
      if (!meta_it->is_object()) return file_error(Code::kInvalidArgument, index, "\"metadata\" is not an object");
      for (const auto& [key, value] : meta_it->items()) {
        c->metadata_.emplace(key, value.is_string() ? value.get<std::string>() : value.dump());
      }
    }
    std::map<std::string, size_t, std::less<>> shard_index;  // shard name -> index into files_
    for (const auto& [name, shard] : map_it->items()) {
      if (!shard.is_string() || !plain_file_name(shard.get_ref<const std::string&>())) {
        return tensor_error(Code::kInvalidArgument, index, name,
                            "its shard " + (shard.is_string() ? quote_name(shard.get<std::string>()) : shard.dump()) +
                                " is not a plain file name inside the checkpoint directory");
      }
      const auto& shard_name = shard.get_ref<const std::string&>();
      auto it = shard_index.find(shard_name);
      if (it == shard_index.end()) {
        MC_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                            SafetensorsFile::open((fs::path(dir) / shard_name).string()));
        c->files_.push_back(std::move(file));
        it = shard_index.emplace(shard_name, c->files_.size() - 1).first;
      }
      if (c->files_[it->second]->tensors().count(name) == 0) {
        return tensor_error(Code::kInvalidArgument, index, name,
                            "the index places it in shard " + quote_name(shard_name) +
                                ", which has no such tensor (the index and the shards disagree: download the "
                                "checkpoint again)");
      }
      c->where_.emplace(name, it->second);
    }
  } catch (const std::exception& e) {
    return file_error(Code::kInternal, index, std::string("unexpected error reading the index: ") + e.what());
  }
  return c;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(where_.size());
  for (const auto& [name, file] : where_) names.push_back(name);
  return names;
}

Result<TensorView> Checkpoint::tensor(std::string_view name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) {
    return Status(Code::kNotFound, "checkpoint '" + dir_ + "': no tensor " + quote_name(name) + " (it has " +
                                       std::to_string(where_.size()) + " tensors)");
  }
  return files_[it->second]->tensor(name);
}

std::vector<std::string> Checkpoint::file_paths() const {
  std::vector<std::string> paths;
  for (const auto& f : files_) paths.push_back(f->path());
  return paths;
}

Result<std::string> encode_safetensors_header(const std::vector<TensorToWrite>& tensors,
                                              const std::map<std::string, std::string>& metadata) {
  return encode_header_caught(tensors, metadata, "safetensors header");
}

Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  MC_ASSIGN_OR_RETURN(const std::string header, encode_header_caught(tensors, metadata, path));
  const std::string partial = path + ".partial";
  auto fail = [&](const std::string& what) {
    const int err = errno;
    (void)::unlink(partial.c_str());
    return Status(Code::kIo, "cannot " + what + ": " + std::strerror(err));
  };
  Fd fd(::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) return fail("create " + partial);
  bool ok = write_all(fd.get(), reinterpret_cast<const std::byte*>(header.data()), header.size());
  for (size_t i = 0; ok && i < tensors.size(); ++i)
    ok = write_all(fd.get(), tensors[i].data.data(), tensors[i].data.size());
  if (!ok) return fail("write " + partial);
  if (::fsync(fd.get()) != 0) return fail("sync " + partial);
  if (::close(fd.release()) != 0) return fail("close " + partial);
  if (::rename(partial.c_str(), path.c_str()) != 0) return fail("rename " + partial + " to " + path);
  return Status::ok();
}

float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(uint32_t{bits} << 16); }

uint16_t float_to_bf16(float value) {
  const auto f = std::bit_cast<uint32_t>(value);
  if ((f & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign and top payload; stay NaN
    auto h = static_cast<uint16_t>(f >> 16);
    if ((h & 0x7f) == 0) h |= 0x40;
    return h;
  }
  // Round to nearest, ties to even: add just under half a bf16 ulp, plus one when the kept part is odd.
  return static_cast<uint16_t>((f + 0x7fffu + ((f >> 16) & 1u)) >> 16);
}

float fp16_to_float(uint16_t bits) {
  const uint32_t sign = uint32_t{bits & 0x8000u} << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));  // Inf, NaN
  if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return std::bit_cast<float>(sign);
  // Subnormal: mantissa · 2^-24, normalised (exact: 10 bits fit fp32's 23).
  int32_t e = -14;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --e;
  }
  return std::bit_cast<float>(sign | (static_cast<uint32_t>(e + 127) << 23) | ((mantissa & 0x3ffu) << 13));
}

uint16_t float_to_fp16(float value) {
  const auto f = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((f >> 16) & 0x8000u);
  const uint32_t magnitude = f & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {  // NaN: keep the top payload; stay NaN
    auto payload = static_cast<uint16_t>((magnitude >> 13) & 0x3ffu);
    if (payload == 0) payload = 0x200;
    return static_cast<uint16_t>(sign | 0x7c00u | payload);
  }
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 (and Inf): Inf
  const int32_t e = static_cast<int32_t>(magnitude >> 23) - 127;
  // Keeps the top bits of `m` above `dropped_bits`, rounded to nearest, ties to even (a carry may reach the
  // exponent: that is the next binade, or Inf, as it should be).
  auto round_shift = [](uint32_t m, uint32_t dropped_bits) {
    const uint32_t kept = m >> dropped_bits;
    const uint32_t rest = m & ((1u << dropped_bits) - 1);
    const uint32_t half = 1u << (dropped_bits - 1);
    return kept + ((rest > half || (rest == half && (kept & 1u) != 0)) ? 1u : 0u);
  };
  if (e >= -14) {  // a normal fp16: exponent and the top 10 mantissa bits
    const uint32_t m = (static_cast<uint32_t>(e + 15) << 23) | (magnitude & 0x7fffffu);
    return static_cast<uint16_t>(sign | round_shift(m, 13));
  }
  if (e < -25) return sign;  // below 2^-25, half the smallest subnormal: ±0
  // Subnormal fp16: units of 2^-24; the value is (1.m) · 2^e = (m | 2^23) · 2^(e - 23), so drop -e - 1 bits.
  return static_cast<uint16_t>(sign | round_shift((magnitude & 0x7fffffu) | 0x800000u, static_cast<uint32_t>(-e - 1)));
}

}  // namespace mc::model
