// Safetensors files and checkpoint directories (mc/model/safetensors.hpp): round trips through write_safetensors and
// SafetensorsFile / Checkpoint, every refusal of an untrusted header or index with a message naming the file and the
// tensor, and the exactness of the bf16 / fp16 conversions.
#include "mc/model/safetensors.hpp"

#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace mc::model {
namespace MC_UNITY_ID {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("mc-safetensors-" + std::to_string(::getpid()) + "-" + info->test_suite_name() + "-" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes `bytes` to the file `name` of the test's directory; returns its path.
  std::string put(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }

  fs::path dir_;
};

// A safetensors file by hand: the 8-byte little-endian header length, `header`, then `data_bytes` bytes.
std::string raw_file(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<char>((uint64_t{header.size()} >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\x5a');
}

template <typename T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

// Expects `s` to be a refusal with `code` whose message contains each of `parts`.
void expect_refusal(const Status& s, Code code, const std::vector<std::string>& parts) {
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), code) << s.to_string();
  for (const std::string& part : parts) EXPECT_NE(s.message().find(part), std::string::npos) << s.to_string();
}

// Opens a hand-made file and expects it refused naming the file and `parts`.
void expect_file_refused(const std::string& file, Code code, std::vector<std::string> parts) {
  auto f = SafetensorsFile::open(file);
  parts.push_back(file);
  expect_refusal(f.status(), code, parts);
}

// The test tensors: a BF16 matrix, an F16 vector, an F32 3-d tensor and an F32 scalar, with exactly representable
// values so that the float views can be compared exactly.
struct SampleTensors {
  std::vector<uint16_t> bf16, f16;
  std::vector<float> f32, scalar{42.5f};
  std::vector<TensorToWrite> list;

  SampleTensors() {
    for (int i = 0; i < 6; ++i) bf16.push_back(float_to_bf16(static_cast<float>(i) - 2.5f));
    for (int i = 0; i < 5; ++i) f16.push_back(float_to_fp16(static_cast<float>(i) * 0.25f));
    for (int i = 0; i < 24; ++i) f32.push_back(static_cast<float>(i) / 8.0f);
    // F32 first: the format has no padding, so larger elements go first to keep every offset aligned.
    list = {{"model.layers.0.mlp.up_proj.weight", Dtype::kF32, {2, 3, 4}, bytes_of(f32)},
            {"model.norm.weight", Dtype::kF32, {}, bytes_of(scalar)},
            {"model.embed_tokens.weight", Dtype::kBF16, {2, 3}, bytes_of(bf16)},
            {"lm_head.bias", Dtype::kF16, {5}, bytes_of(f16)}};
  }
};

std::vector<float> floats_of(const TensorView& view, const std::string& name) {
  std::vector<float> out(static_cast<size_t>(view.element_count));
  const Status s = to_float(view, out, name);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return out;
}

TEST_F(SafetensorsTest, RoundTripOfEachFloatDtypeWithMetadata) {
  SampleTensors t;
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"made_by", "safetensors_test"}};
  const std::string file = path("model.safetensors");
  ASSERT_TRUE(write_safetensors(file, t.list, metadata).is_ok());
  EXPECT_FALSE(fs::exists(file + ".partial"));

  auto f = SafetensorsFile::open(file);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  const SafetensorsFile& st = *f.value();
  EXPECT_EQ(st.metadata(), metadata);
  ASSERT_EQ(st.tensors().size(), t.list.size());
  uint64_t data_bytes = 0;
  for (const TensorToWrite& w : t.list) {
    SCOPED_TRACE(w.name);
    auto v = st.tensor(w.name);
    ASSERT_TRUE(v.is_ok()) << v.status().to_string();
    EXPECT_EQ(v->dtype, w.dtype);
    EXPECT_EQ(std::vector<int64_t>(v->shape.begin(), v->shape.end()), w.shape);
    ASSERT_EQ(v->size_bytes, w.data.size());
    EXPECT_EQ(std::memcmp(v->data, w.data.data(), w.data.size()), 0);
    const TensorInfo& info = st.tensors().find(w.name)->second;
    EXPECT_EQ(info.file_offset_bytes % dtype_size_bytes(w.dtype), 0u) << "offset " << info.file_offset_bytes;
    EXPECT_EQ(info.element_count * static_cast<int64_t>(dtype_size_bytes(w.dtype)),
              static_cast<int64_t>(info.size_bytes));
    data_bytes += w.data.size();
  }
  // The header is padded to 8 bytes and the data follows it contiguously to the end of the file.
  const uint64_t first_offset = st.tensors().find("model.layers.0.mlp.up_proj.weight")->second.file_offset_bytes;
  EXPECT_EQ(first_offset % 8, 0u);
  EXPECT_EQ(first_offset + data_bytes, st.size_bytes());

  EXPECT_EQ(floats_of(st.tensor("model.embed_tokens.weight").value(), "e"),
            (std::vector<float>{-2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.5f}));
  EXPECT_EQ(floats_of(st.tensor("lm_head.bias").value(), "b"), (std::vector<float>{0.0f, 0.25f, 0.5f, 0.75f, 1.0f}));
  EXPECT_EQ(floats_of(st.tensor("model.layers.0.mlp.up_proj.weight").value(), "w"), t.f32);
  const TensorView scalar = st.tensor("model.norm.weight").value();
  EXPECT_TRUE(scalar.shape.empty());
  EXPECT_EQ(scalar.element_count, 1);
  EXPECT_EQ(floats_of(scalar, "s"), std::vector<float>{42.5f});
}

TEST_F(SafetensorsTest, HeaderParsesWhatTheWriterEncodes) {
  SampleTensors t;
  auto header = encode_safetensors_header(t.list, {});
  ASSERT_TRUE(header.is_ok()) << header.status().to_string();
  EXPECT_EQ(header->size() % 8, 0u);
  EXPECT_EQ(header->find("__metadata__"), std::string::npos);  // no metadata, no key
  uint64_t data_bytes = 0;
  for (const TensorToWrite& w : t.list) data_bytes += w.data.size();
  auto h = parse_safetensors_header(*header, header->size() + data_bytes, "encoded");
  ASSERT_TRUE(h.is_ok()) << h.status().to_string();
  EXPECT_EQ(h->data_start_bytes, header->size());
  EXPECT_EQ(h->header_size_bytes, header->size() - 8);
  EXPECT_EQ(h->data_end_bytes, header->size() + data_bytes);
  // The data follows in the given order.
  EXPECT_EQ(h->tensors.at("model.layers.0.mlp.up_proj.weight").file_offset_bytes, h->data_start_bytes);
  EXPECT_EQ(h->tensors.at("lm_head.bias").file_offset_bytes, h->data_end_bytes - t.f16.size() * 2);
  // A file longer than its tensors (trailing bytes) is accepted; one shorter is not.
  EXPECT_TRUE(parse_safetensors_header(*header, header->size() + data_bytes + 100).is_ok());
  expect_refusal(parse_safetensors_header(*header, header->size() + data_bytes - 1, "short").status(), Code::kDataLoss,
                 {"short", "lm_head.bias"});
}

TEST_F(SafetensorsTest, CheckpointOfOneFile) {
  SampleTensors t;
  ASSERT_TRUE(write_safetensors(path("model.safetensors"), t.list, {{"format", "pt"}}).is_ok());
  auto c = Checkpoint::open(dir_.string());
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c.value()->tensor_names(),
            (std::vector<std::string>{"lm_head.bias", "model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight",
                                      "model.norm.weight"}));
  EXPECT_EQ(c.value()->metadata().at("format"), "pt");
  EXPECT_EQ(c.value()->file_paths(), std::vector<std::string>{path("model.safetensors")});
  auto v = c.value()->tensor("lm_head.bias");
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(std::memcmp(v->data, t.f16.data(), v->size_bytes), 0);
  expect_refusal(c.value()->tensor("model.layers.7.self_attn.q_proj.weight").status(), Code::kNotFound,
                 {dir_.string(), "model.layers.7.self_attn.q_proj.weight"});
}

TEST_F(SafetensorsTest, ShardedCheckpointThroughItsIndex) {
  SampleTensors t;
  ASSERT_TRUE(write_safetensors(path("model-00001-of-00002.safetensors"), {t.list[0], t.list[1]}, {}).is_ok());
  ASSERT_TRUE(write_safetensors(path("model-00002-of-00002.safetensors"), {t.list[2], t.list[3]}, {}).is_ok());
  put("model.safetensors.index.json", R"({"metadata": {"total_size": 134, "note": "two shards"}, "weight_map": {
      "model.layers.0.mlp.up_proj.weight": "model-00001-of-00002.safetensors",
      "model.norm.weight": "model-00001-of-00002.safetensors",
      "model.embed_tokens.weight": "model-00002-of-00002.safetensors",
      "lm_head.bias": "model-00002-of-00002.safetensors"}})");
  auto c = Checkpoint::open(dir_.string());
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  const Checkpoint& ck = *c.value();
  EXPECT_EQ(ck.tensor_names().size(), 4u);
  EXPECT_EQ(ck.metadata().at("total_size"), "134");
  EXPECT_EQ(ck.metadata().at("note"), "two shards");
  // Opened in the order of the weight map's (sorted) names: lm_head.bias's shard first.
  EXPECT_EQ(ck.file_paths(), (std::vector<std::string>{path("model-00002-of-00002.safetensors"),
                                                       path("model-00001-of-00002.safetensors")}));
  for (const TensorToWrite& w : t.list) {
    auto v = ck.tensor(w.name);
    ASSERT_TRUE(v.is_ok()) << v.status().to_string();
    EXPECT_EQ(v->dtype, w.dtype);
    ASSERT_EQ(v->size_bytes, w.data.size());
    EXPECT_EQ(std::memcmp(v->data, w.data.data(), w.data.size()), 0) << w.name;
  }
  EXPECT_EQ(floats_of(ck.tensor("model.embed_tokens.weight").value(), "e")[5], 2.5f);
}

TEST_F(SafetensorsTest, TruncatedFileNamesItsSizeAndTheSizeNeeded) {
  SampleTensors t;
  const std::string file = path("model.safetensors");
  ASSERT_TRUE(write_safetensors(file, t.list, {}).is_ok());
  const uint64_t full = fs::file_size(file);
  fs::resize_file(file, full - 3);
  expect_file_refused(file, Code::kDataLoss,
                      {"tensor 'lm_head.bias' ends there", "truncated",
                       "the file is " + std::to_string(full - 3) + " bytes", "needs " + std::to_string(full)});
  fs::resize_file(file, 5);
  expect_file_refused(file, Code::kDataLoss, {"5 bytes", "8-byte header length"});
  fs::resize_file(file, 0);
  expect_file_refused(file, Code::kDataLoss, {"0 bytes"});
}

TEST_F(SafetensorsTest, HeaderLengthBeyondTheFile) {
  std::string bytes = raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
  bytes[0] = static_cast<char>(200);  // N = 200, the file is 8 + 53 + 4 bytes
  expect_file_refused(put("x.safetensors", bytes), Code::kDataLoss,
                      {"header length 200", "past the end", std::to_string(bytes.size()) + "-byte file"});
}

TEST_F(SafetensorsTest, HundredMegabyteHeaderLengthIsRefusedUnread) {
  // A sparse file of 100 MB + 8 whose length field says 100,000,000: within the file, over the 64 MiB limit.
  std::string bytes = raw_file("", 0);
  const uint64_t n = 100'000'000;
  for (size_t i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  const std::string file = put("big.safetensors", bytes);
  fs::resize_file(file, 8 + n);
  expect_file_refused(file, Code::kInvalidArgument, {"header length 100000000", "over the limit of 67108864"});
  // The same length field in a short file: still the limit that is reported first.
  expect_refusal(parse_safetensors_header(bytes, 64, "short").status(), Code::kInvalidArgument,
                 {"short", "over the limit"});
}

TEST_F(SafetensorsTest, UnknownDtypeNamesItAndTheTensor) {
  expect_file_refused(put("x.safetensors", raw_file(R"({"w":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,2]}})", 2)),
                      Code::kInvalidArgument, {"tensor 'w'", "unknown dtype 'Q4_K'", "BF16", "F8_E5M2"});
  // Recognised but not computable: accepted by the reader, refused by to_float naming the dtype.
  auto f = SafetensorsFile::open(put("y.safetensors", raw_file(R"({"ids":{"dtype":"I64","shape":[2],)"
                                                               R"("data_offsets":[0,16]}})",
                                                               16)));
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  const TensorView v = f.value()->tensor("ids").value();
  EXPECT_EQ(v.dtype, Dtype::kI64);
  std::vector<float> out(2);
  expect_refusal(to_float(v, out, "ids"), Code::kInvalidArgument, {"'ids'", "I64"});
}

TEST_F(SafetensorsTest, ShapeAndOffsetsDisagree) {
  expect_file_refused(
      put("x.safetensors", raw_file(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 20)),
      Code::kInvalidArgument, {"tensor 'w'", "hold 20 bytes", "needs 24"});
  expect_file_refused(put("y.safetensors", raw_file(R"({"w":{"dtype":"F16","shape":[1],"data_offsets":[4,2]}})", 4)),
                      Code::kInvalidArgument, {"tensor 'w'", "end before they begin"});
  expect_file_refused(put("z.safetensors", raw_file(R"({"w":{"dtype":"F16","shape":[1],"data_offsets":[0]}})", 2)),
                      Code::kInvalidArgument, {"tensor 'w'", "data_offsets"});
  expect_file_refused(put("u.safetensors", raw_file(R"({"w":{"dtype":"F16","shape":[-1],"data_offsets":[0,2]}})", 2)),
                      Code::kInvalidArgument, {"tensor 'w'", "not an integer"});
  expect_file_refused(put("v.safetensors", raw_file(R"({"w":{"dtype":"F16","shape":[1.0],"data_offsets":[0,2]}})", 2)),
                      Code::kInvalidArgument, {"tensor 'w'", "not an integer"});
  expect_file_refused(put("t.safetensors", raw_file(R"({"w":{"shape":[1],"data_offsets":[0,2]}})", 2)),
                      Code::kInvalidArgument, {"tensor 'w'", "\"dtype\" is missing"});
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  expect_file_refused(put("x.safetensors", raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                                    12)),
                      Code::kInvalidArgument, {"tensor 'b'", "overlap", "tensor 'a'"});
  // Adjacent tensors, gaps and empty tensors at the same offset are fine.
  auto ok =
      SafetensorsFile::open(put("y.safetensors", raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
                                                          R"("c":{"dtype":"F32","shape":[1],"data_offsets":[16,20]},)"
                                                          R"("e":{"dtype":"F32","shape":[0,5],"data_offsets":[4,4]}})",
                                                          20)));
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(ok.value()->tensor("e")->element_count, 0);
}

TEST_F(SafetensorsTest, OffsetsPastTheEnd) {
  expect_file_refused(put("x.safetensors", raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                                    R"("b":{"dtype":"F32","shape":[1],"data_offsets":[96,100]}})",
                                                    8)),
                      Code::kDataLoss, {"tensor 'b'", "truncated"});
  // An end offset near 2^64: no wrap-around anywhere.
  expect_file_refused(put("y.safetensors", raw_file(R"({"a":{"dtype":"U8","shape":[4],)"
                                                    R"("data_offsets":[18446744073709551612,18446744073709551615]}})",
                                                    8)),
                      Code::kInvalidArgument, {"tensor 'a'", "hold 3 bytes", "needs 4"});
  expect_file_refused(put("z.safetensors", raw_file(R"({"a":{"dtype":"U8","shape":[3],)"
                                                    R"("data_offsets":[18446744073709551612,18446744073709551615]}})",
                                                    8)),
                      Code::kDataLoss, {"tensor 'a'", "more than 2^64"});
}

TEST_F(SafetensorsTest, DuplicateNamesAndKeysAreDetected) {
  // nlohmann::json alone would keep the second "w" silently.
  expect_file_refused(put("x.safetensors", raw_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                                    R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                                    8)),
                      Code::kInvalidArgument, {"key 'w' appears twice"});
  expect_file_refused(
      put("y.safetensors", raw_file(R"({"w":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})", 4)),
      Code::kInvalidArgument, {"key 'dtype' appears twice in the entry of 'w'"});
  // The same key in two different objects is not a duplicate.
  EXPECT_TRUE(SafetensorsFile::open(put("z.safetensors", raw_file(R"({"a":{"dtype":"F32","shape":[1],)"
                                                                  R"("data_offsets":[0,4]},"b":{"dtype":"F32",)"
                                                                  R"("shape":[1],"data_offsets":[4,8]}})",
                                                                  8)))
                  .is_ok());
}

TEST_F(SafetensorsTest, MalformedHeaders) {
  expect_file_refused(put("a.safetensors", raw_file("[1, 2, 3]", 0)), Code::kInvalidArgument,
                      {"not an object", "array"});
  expect_file_refused(put("b.safetensors", raw_file(R"({"w": 3})", 0)), Code::kInvalidArgument,
                      {"tensor 'w'", "not an object"});
  expect_file_refused(put("c.safetensors", raw_file(R"({"w": {"dtype": "F32")", 0)), Code::kInvalidArgument,
                      {"not valid JSON"});
  expect_file_refused(put("d.safetensors", raw_file(std::string(20, '[') + std::string(20, ']'), 0)),
                      Code::kInvalidArgument, {"nested deeper than 8"});
  expect_file_refused(put("e.safetensors", raw_file(R"({"__metadata__": {"n": 1}})", 0)), Code::kInvalidArgument,
                      {"__metadata__", "'n'", "not a string"});
  expect_file_refused(put("f.safetensors", raw_file(R"({"": {"dtype":"F32","shape":[],"data_offsets":[0,4]}})", 4)),
                      Code::kInvalidArgument, {"empty name"});
  const std::string long_name(kMaxSafetensorsNameBytes + 1, 'n');
  expect_file_refused(
      put("g.safetensors", raw_file("{\"" + long_name + R"(": {"dtype":"F32","shape":[],"data_offsets":[0,4]}})", 4)),
      Code::kInvalidArgument, {"1025 bytes", "over the limit of 1024"});
  // Whitespace padding and unknown keys of an entry are accepted; a header with only metadata has no tensors.
  auto f = SafetensorsFile::open(put("h.safetensors", raw_file(R"({"__metadata__": {"k": "v"}}      )", 0)));
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_TRUE(f.value()->tensors().empty());
  EXPECT_EQ(f.value()->metadata().at("k"), "v");
  EXPECT_TRUE(SafetensorsFile::open(put("i.safetensors", raw_file(R"({"w":{"dtype":"U8","shape":[1],)"
                                                                  R"("data_offsets":[0,1],"extra":[1]}})",
                                                                  1)))
                  .is_ok());
}

TEST_F(SafetensorsTest, RankAboveEightAndOverflowingDims) {
  expect_file_refused(
      put("a.safetensors", raw_file(R"({"w":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", 1)),
      Code::kInvalidArgument, {"tensor 'w'", "9 dimensions", "limit of 8"});
  EXPECT_TRUE(SafetensorsFile::open(put("b.safetensors", raw_file(R"({"w":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1],)"
                                                                  R"("data_offsets":[0,1]}})",
                                                                  1)))
                  .is_ok());
  // 2^32 · 2^32 elements overflow int64; 2^62 F32 elements overflow the byte count; a dimension of 2^63 is refused.
  expect_file_refused(put("c.safetensors", raw_file(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],)"
                                                    R"("data_offsets":[0,0]}})",
                                                    0)),
                      Code::kInvalidArgument, {"tensor 'w'", "overflows 64 bits"});
  expect_file_refused(
      put("d.safetensors", raw_file(R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0)),
      Code::kInvalidArgument, {"tensor 'w'", "overflows 64 bits"});
  expect_file_refused(
      put("e.safetensors", raw_file(R"({"w":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0]}})", 0)),
      Code::kInvalidArgument, {"tensor 'w'", "not an integer in [0, 2^63)"});
}

TEST_F(SafetensorsTest, TensorCountOverTheLimit) {
  // A lowered limit (the default, 131,072, costs seconds of parsing under the sanitizers): counted before any entry is
  // looked at, so the entries need not be valid; the metadata is not a tensor.
  SafetensorsLimits limits;
  limits.max_tensors = 3;
  const std::string at_limit = raw_file(R"({"a":{"dtype":"U8","shape":[],"data_offsets":[0,1]},)"
                                        R"("b":{"dtype":"U8","shape":[],"data_offsets":[1,2]},)"
                                        R"("c":{"dtype":"U8","shape":[],"data_offsets":[2,3]},"__metadata__":{}})",
                                        3);
  EXPECT_TRUE(parse_safetensors_header(at_limit, at_limit.size(), "three", limits).is_ok());
  const std::string over = raw_file(R"({"a":0,"b":0,"c":0,"d":0})", 0);
  expect_refusal(parse_safetensors_header(over, over.size(), "four", limits).status(), Code::kInvalidArgument,
                 {"four", "4 tensors", "over the limit of 3", "shards"});
  // Values beyond what the limit's tensors could need are refused before parsing (the JSON shape bound).
  std::string many_values = "{\"a\":[0";
  for (int i = 0; i < 100; ++i) many_values += ",0";
  const std::string crowded = raw_file(many_values + "]}", 0);
  expect_refusal(parse_safetensors_header(crowded, crowded.size(), "crowded", limits).status(), Code::kInvalidArgument,
                 {"crowded", "more than 50 JSON values"});
}

TEST_F(SafetensorsTest, TensorLookupNamesTheTensorAndTheFile) {
  SampleTensors t;
  const std::string file = path("m.safetensors");
  ASSERT_TRUE(write_safetensors(file, t.list, {}).is_ok());
  auto f = SafetensorsFile::open(file);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  expect_refusal(f.value()->tensor("nope").status(), Code::kNotFound, {file, "'nope'", "4 tensors"});
  expect_file_refused(path("missing.safetensors"), Code::kInvalidArgument, {"cannot open", "No such file"});
  expect_file_refused(dir_.string(), Code::kInvalidArgument, {"not a regular file"});
}

TEST_F(SafetensorsTest, CheckpointDirectoryRefusals) {
  expect_refusal(Checkpoint::open(path("absent")).status(), Code::kInvalidArgument, {path("absent"), "does not exist"});
  expect_refusal(Checkpoint::open(dir_.string()).status(), Code::kInvalidArgument,
                 {dir_.string(), "model.safetensors", "model.safetensors.index.json"});
  SampleTensors t;
  ASSERT_TRUE(write_safetensors(path("shard.safetensors"), {t.list[0]}, {}).is_ok());
  const std::string index = path("model.safetensors.index.json");
  for (const char* shard : {"../shard.safetensors", "/etc/passwd", "sub/shard.safetensors", "..", ""}) {
    put("model.safetensors.index.json",
        R"({"weight_map": {"model.layers.0.mlp.up_proj.weight": ")" + std::string(shard) + "\"}}");
    expect_refusal(Checkpoint::open(dir_.string()).status(), Code::kInvalidArgument,
                   {index, "model.layers.0.mlp.up_proj.weight", "not a plain file name"});
  }
  put("model.safetensors.index.json", R"({"weight_map": {"model.layers.0.mlp.up_proj.weight": "shard.safetensors",
      "model.norm.weight": "shard.safetensors"}})");
  expect_refusal(Checkpoint::open(dir_.string()).status(), Code::kInvalidArgument,
                 {index, "'model.norm.weight'", "'shard.safetensors'", "has no such tensor"});
  put("model.safetensors.index.json", R"({"weight_map": {"w": "other.safetensors"}})");
  expect_refusal(Checkpoint::open(dir_.string()).status(), Code::kInvalidArgument,
                 {path("other.safetensors"), "cannot open"});
  put("model.safetensors.index.json", R"({"weight_map": {"w": "shard.safetensors", "w": "shard.safetensors"}})");
  expect_refusal(Checkpoint::open(dir_.string()).status(), Code::kInvalidArgument,
                 {index, "key 'w' appears twice in the entry of 'weight_map'"});
  put("model.safetensors.index.json", R"({"metadata": {}})");
  expect_refusal(Checkpoint::open(dir_.string()).status(), Code::kInvalidArgument, {index, "weight_map"});
  put("model.safetensors.index.json", "not json");
  expect_refusal(Checkpoint::open(dir_.string()).status(), Code::kInvalidArgument, {index, "not valid JSON"});
  // A broken shard's error names the shard.
  put("model.safetensors.index.json", R"({"weight_map": {"w": "bad.safetensors"}})");
  put("bad.safetensors", raw_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 2));
  expect_refusal(Checkpoint::open(dir_.string()).status(), Code::kDataLoss, {path("bad.safetensors"), "'w'"});
}

TEST_F(SafetensorsTest, WriterRefusals) {
  const std::vector<uint16_t> three_halves(3);
  const std::vector<float> two_floats(2);
  const std::string file = path("w.safetensors");
  // An F32 tensor after 6 bytes of F16 would sit at offset 6: the format has no padding, so it is refused.
  expect_refusal(
      write_safetensors(
          file, {{"h", Dtype::kF16, {3}, bytes_of(three_halves)}, {"f", Dtype::kF32, {2}, bytes_of(two_floats)}}, {}),
      Code::kInvalidArgument, {file, "tensor 'f'", "offset 6", "larger elements first"});
  expect_refusal(
      write_safetensors(
          file, {{"f", Dtype::kF32, {2}, bytes_of(two_floats)}, {"f", Dtype::kF32, {2}, bytes_of(two_floats)}}, {}),
      Code::kInvalidArgument, {file, "tensor 'f'", "twice"});
  expect_refusal(write_safetensors(file, {{"f", Dtype::kF32, {3}, bytes_of(two_floats)}}, {}), Code::kInvalidArgument,
                 {file, "tensor 'f'", "needs 12"});
  expect_refusal(write_safetensors(file, {{"f", Dtype::kF32, {-2}, bytes_of(two_floats)}}, {}), Code::kInvalidArgument,
                 {file, "tensor 'f'"});
  expect_refusal(write_safetensors(file, {{"__metadata__", Dtype::kF32, {2}, bytes_of(two_floats)}}, {}),
                 Code::kInvalidArgument, {file, "reserved"});
  expect_refusal(write_safetensors(file, {{"bad\xff", Dtype::kF32, {2}, bytes_of(two_floats)}}, {}),
                 Code::kInvalidArgument, {file, "UTF-8"});
  EXPECT_FALSE(fs::exists(file));
  EXPECT_FALSE(fs::exists(file + ".partial"));
  expect_refusal(write_safetensors(path("no-such-dir/w.safetensors"), {}, {}), Code::kIo, {"no-such-dir"});
}

// ---- bf16 / fp16 ----

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }

TEST(Float16, EveryBf16AndFp16ValueRoundTripsThroughFloat) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const auto b = static_cast<uint16_t>(h);
    ASSERT_EQ(float_to_bf16(bf16_to_float(b)), b) << std::hex << h;
    ASSERT_EQ(float_to_fp16(fp16_to_float(b)), b) << std::hex << h;
  }
}

TEST(Float16, WideningIsExact) {
  EXPECT_EQ(fp16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_float(0xc000), -2.0f);
  EXPECT_EQ(fp16_to_float(0x7bff), 65504.0f);                  // largest finite
  EXPECT_EQ(fp16_to_float(0x0400), std::ldexp(1.0f, -14));     // smallest normal
  EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(fp16_to_float(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(bits_of(fp16_to_float(0x8000)), 0x80000000u);      // -0
  EXPECT_EQ(fp16_to_float(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp16_to_float(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(fp16_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(fp16_to_float(0x7c01)));  // signalling NaN stays NaN
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xc1a0), -20.0f);
  EXPECT_EQ(bf16_to_float(0x7f7f), 0x1.fep127f);             // largest finite
  EXPECT_EQ(bf16_to_float(0x0001), std::ldexp(1.0f, -133));  // smallest subnormal
  EXPECT_EQ(bf16_to_float(0xff80), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7fc0)));
  EXPECT_TRUE(std::isnan(bf16_to_float(0xff81)));
}

TEST(Float16, NarrowingRoundsToNearestEven) {
  // bf16 keeps 7 mantissa bits: at 1.0 its ulp is 2^-7.
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);                          // tie -> even (down)
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);                      // tie -> even (up)
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);  // above the tie
  EXPECT_EQ(float_to_bf16(-(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20))), 0xbf81);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to Inf
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  const uint16_t bf16_nan = float_to_bf16(std::bit_cast<float>(0x7f800001u));  // payload only in the dropped bits
  EXPECT_TRUE(std::isnan(bf16_to_float(bf16_nan))) << std::hex << bf16_nan;
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::quiet_NaN()) & 0x8000, 0x8000);

  // fp16: 10 mantissa bits; at 1.0 the ulp is 2^-10.
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie -> even (down)
  EXPECT_EQ(float_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16(65519.996f), 0x7bff);  // just below the tie with 65536
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);    // the tie rounds to even: Inf
  EXPECT_EQ(float_to_fp16(-1e10f), 0xfc00);
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // half of it: tie -> even (0)
  EXPECT_EQ(float_to_fp16(std::ldexp(1.5f, -25)), 0x0001);  // above the tie
  EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 units: tie -> even (2)
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -26)), 0x0000);
  EXPECT_EQ(float_to_fp16(-std::ldexp(1.0f, -30)), 0x8000);     // underflow keeps the sign
  EXPECT_EQ(float_to_fp16(std::ldexp(1023.5f, -24)), 0x0400);   // largest subnormal + 1/2 unit: tie -> 0x400
  EXPECT_EQ(float_to_fp16(std::ldexp(1023.75f, -24)), 0x0400);  // rounds up into the smallest normal
  EXPECT_EQ(float_to_fp16(std::ldexp(2045.0f, -25)), 0x03fe);   // 1022.5 units: tie -> even (1022)
  EXPECT_EQ(float_to_fp16(std::numeric_limits<float>::denorm_min()), 0x0000);
  const uint16_t fp16_nan = float_to_fp16(std::bit_cast<float>(0x7f800001u));
  EXPECT_EQ(fp16_nan & 0x7c00, 0x7c00);
  EXPECT_NE(fp16_nan & 0x03ff, 0);
}

// An independent rounding of `v` to a binary format of `mantissa_bits` explicit bits whose smallest normal exponent
// is `min_exponent` (subnormals below it), overflowing from `inf_from` up: std::rint (ties to even) on the grid.
double reference_round(double v, int mantissa_bits, int min_exponent, double inf_from) {
  if (std::fabs(v) >= inf_from) return std::copysign(std::numeric_limits<double>::infinity(), v);
  if (v == 0) return v;
  const double ulp = std::ldexp(1.0, std::max(std::ilogb(v), min_exponent) - mantissa_bits);
  return std::rint(v / ulp) * ulp;
}

TEST(Float16, NarrowingAgreesWithAReferenceRounding) {
  const double bf16_inf_from = std::ldexp(2.0 - std::ldexp(1.0, -8), 127);  // largest finite + half an ulp
  std::mt19937 rng(49);
  std::uniform_int_distribution<uint32_t> any_bits;
  // Random bits with a random number of low mantissa bits cleared, so that exact values and ties are common.
  auto bits = [&] { return any_bits(rng) & ~((1u << (any_bits(rng) % 24)) - 1); };
  for (int i = 0; i < 300000; ++i) {
    const float x = std::bit_cast<float>(bits());
    if (std::isnan(x)) continue;
    ASSERT_EQ(static_cast<double>(bf16_to_float(float_to_bf16(x))), reference_round(x, 7, -126, bf16_inf_from)) << x;
    // fp16's range and beyond: magnitudes from 2^-30 to 2^18.
    const float y =
        std::ldexp(std::bit_cast<float>((bits() & 0x807fffffu) | 0x3f800000u), static_cast<int>(i % 48) - 30);
    ASSERT_EQ(static_cast<double>(fp16_to_float(float_to_fp16(y))), reference_round(y, 10, -14, 65520.0)) << y;
  }
}

}  // namespace MC_UNITY_ID
}  // namespace mc::model
