// The fuzz harnesses' seed corpora (tests/fuzz/corpus/<harness>/): valid inputs made from the real encoders
// (codec::pack of every protocol message, append_frame, the wire headers, RequestRecord's to_json, the safetensors
// header encoder) and the first rows of the shipped Mooncake trace. `fuzz_seeds DIR` writes them under DIR/<harness>/;
// `fuzz_seeds --check DIR` (the ctest fuzz_seeds_current) exits 1 naming each file that is missing or
// differs, so a changed message makes the checked-in corpus stale visibly rather than silently.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <sodium.h>

#include "mc/model/safetensors.hpp"
#include "mc/net/fast_rpc.hpp"
#include "mc/net/grant.hpp"
#include "mc/proto/codec.hpp"
#include "mc/proto/protocol.hpp"
#include "mc/report/report.hpp"
#include "message_types.hpp"
#include "tcp/wire.hpp"

namespace {

struct Seed {
  std::string harness, name, bytes;
};

std::string with_control(uint8_t control, std::string_view bytes) {
  return std::string(1, static_cast<char>(control)) + std::string(bytes);
}

template <typename H>
std::string raw(const H& header) {
  return std::string(reinterpret_cast<const char*>(&header), sizeof header);
}

void protocol_seeds(std::vector<Seed>& out) {
  mc::fuzz::for_each_message_type([&]<typename T>(size_t i) {
    char name[32];
    std::snprintf(name, sizeof name, "msg_%02zu", i);
    out.push_back({"fuzz_protocol", name, with_control(static_cast<uint8_t>(i), mc::codec::pack(T{}))});
  });
  mc::proto::StorePutStartRequest put;
  put.client_id = "client-1";
  put.keys = {"k0", "k1"};
  put.sizes_bytes = {4096, 8192};
  out.push_back({"fuzz_protocol", "put_start", with_control(32, mc::codec::pack(put))});
  mc::proto::KvEvent ev{"stored", 7, 1700000000000, {1, 2, 3}, "seg0", "cpu", 42};
  out.push_back({"fuzz_protocol", "kv_event", with_control(8, mc::codec::pack(ev))});
  const mc::proto::KvLayerTag tag{9, 3, 0, 4};
  out.push_back({"fuzz_protocol", "layer_tag", with_control(mc::fuzz::kMessageTypes, tag.encode())});
}

void fast_frame_seeds(std::vector<Seed>& out) {
  namespace fast = mc::rpc::fast;
  std::string wire;
  fast::append_frame(wire, "hello", 1, mc::codec::pack(mc::proto::HelloRequest{mc::proto::kProtocolVersion, "fuzz"}));
  fast::append_frame(wire, "store.exists", 2, mc::codec::pack(mc::proto::StoreExistsRequest{{"a", "b"}}));
  out.push_back({"fuzz_fast_frame", "requests", with_control(7, wire)});
  wire.clear();
  fast::append_frame(wire, "store.stat", 3, "", ".reply");
  fast::append_frame(wire, mc::proto::kErrorType, 4, mc::codec::pack(mc::proto::ErrorReply{201, "malformed"}));
  out.push_back({"fuzz_fast_frame", "replies", with_control(0, wire)});
  wire.clear();
  mc::proto::StoreGetReplicasRequest get;
  get.keys = {"key"};
  fast::append_frame(wire, mc::proto::StoreGetReplicasRequest::kType, 5, mc::codec::pack(get));
  out.push_back({"fuzz_fast_frame", "one_byte_chunks", with_control(0x80, wire)});
}

void kv_event_seeds(std::vector<Seed>& out) {
  const mc::proto::KvEvent ev{"stored", 0, 1700000000000, {11, 12, 13}, "seg0", "cpu", 42};
  const std::string id("\0\0\0\0\0\0\0\x05", 8);
  out.push_back({"fuzz_kv_event", "stored", with_control(0, id + mc::codec::pack(ev))});
  const mc::proto::KvEvent cleared{"cleared", 0, 1700000000001, {}, "seg1", "disk", 7};
  out.push_back({"fuzz_kv_event", "cleared", with_control(0, id + mc::codec::pack(cleared))});
}

void trace_seeds(std::vector<Seed>& out, const std::string& source_dir) {
  std::ifstream in(source_dir + "/examples/traces/conversation_trace.jsonl");
  std::string rows, line;
  for (int i = 0; i < 3 && std::getline(in, line); ++i) rows += line + "\n";
  out.push_back({"fuzz_trace", "conversation_strict", with_control(0, rows)});
  out.push_back(
      {"fuzz_trace", "conversation_lenient_bs16", with_control(1 | (1 << 2), rows + "\n{\"timestamp\": 1}\n")});
  out.push_back({"fuzz_trace", "scoped",
                 with_control(0,
                              "{\"timestamp\": 5, \"input_length\": 3, \"output_length\": 1, \"hash_ids\": [9], "
                              "\"lora_name\": \"a\", \"lora_version\": \"1\", \"salt\": \"t\"}\r\n")});
  mc::replay::RequestRecord rec;
  rec.input_tokens = 512;
  rec.output_tokens = 8;
  out.push_back({"fuzz_trace", "records", with_control(2, mc::replay::to_json(rec).dump() + "\n")});
}

void transfer_wire_seeds(std::vector<Seed>& out) {
  namespace tcp = mc::transfer::tcp;
  std::string wire;
  tcp::WireRequest ping;
  ping.op = static_cast<uint8_t>(tcp::WireOp::kPing);
  wire += raw(ping);
  const std::string note = mc::codec::pack(mc::proto::TransferNotification{"kv/1/0/0-2", "seg0", 2, 0, 4096});
  tcp::WireRequest notify;
  notify.op = static_cast<uint8_t>(tcp::WireOp::kNotify);
  notify.aux_bytes = static_cast<uint32_t>(note.size());
  wire += raw(notify) + note;
  tcp::WireRequest write;
  write.op = static_cast<uint8_t>(tcp::WireOp::kWrite);
  write.offset = 4096;
  write.length = 4;
  wire += raw(write) + "abcd";
  tcp::WireRequest read = write;
  read.op = static_cast<uint8_t>(tcp::WireOp::kRead);
  wire += raw(read);
  out.push_back({"fuzz_transfer_wire", "requests", with_control(1, wire)});
  wire.clear();
  tcp::WireReply ok;
  ok.op = static_cast<uint8_t>(tcp::WireOp::kPing);
  wire += raw(ok);
  const std::string why = "single read of 9 bytes exceeds the limit";
  tcp::WireReply err;
  err.op = static_cast<uint8_t>(tcp::WireOp::kRead);
  err.code = static_cast<uint16_t>(mc::Code::kOutOfRange);
  err.aux_bytes = static_cast<uint32_t>(why.size());
  wire += raw(err) + why;
  tcp::WireReply data;
  data.op = static_cast<uint8_t>(tcp::WireOp::kRead);
  data.length = 4;
  wire += raw(data) + "wxyz";
  out.push_back({"fuzz_transfer_wire", "replies", with_control(0, wire)});
}

void grant_seeds(std::vector<Seed>& out) {
  const std::string key(32, 'g');  // fuzz_grant's key
  const mc::auth::Grant g{"127.0.0.1:4000", 4096, 65536, mc::auth::kGrantRead, 1700000000000, "alice", 7};
  out.push_back({"fuzz_grant", "read", mc::auth::issue_grant(key, g).value()});
  const mc::auth::Grant w{"10.0.0.2:5000", 0, 1ull << 30, mc::auth::kGrantWrite, 1700000000000, "", 42};
  out.push_back({"fuzz_grant", "write", mc::auth::issue_grant(key, w).value()});
}

// Records sealed by the client side of fuzz_seal's fixed keys and nonces, as the server receives them.
void seal_seeds(std::vector<Seed>& out) {
  if (sodium_init() < 0) return;
  std::string pk[2], sk[2];
  for (int who = 0; who < 2; ++who) {
    unsigned char p[32], s[32], seed[32];
    for (int i = 0; i < 32; ++i) seed[i] = static_cast<unsigned char>(who * 64 + i);
    crypto_kx_seed_keypair(p, s, seed);
    pk[who].assign(reinterpret_cast<char*>(p), 32);
    sk[who].assign(reinterpret_cast<char*>(s), 32);
  }
  mc::rpc::fast::Seal client;
  if (!client.derive(true, pk[0], sk[0], pk[1], std::string(32, 'c'), std::string(32, 's')).is_ok()) return;
  std::string frames, sealed;
  mc::rpc::fast::append_frame(frames, "store.exists", 1, "body");
  client.seal(frames, sealed);
  client.seal("second record", sealed);
  out.push_back({"fuzz_seal", "records", with_control(7, sealed)});
}

void openai_request_seeds(std::vector<Seed>& out) {
  out.push_back({"fuzz_openai_request", "completion",
                 with_control(0, R"({"model":"tiny","prompt":"Hello","max_tokens":4,"stop":["lo"],"stream":true,)"
                                 R"("stream_options":{"include_usage":true},"mc":{"slo_ttft_ms":500}})")});
  out.push_back({"fuzz_openai_request", "token_ids", with_control(2, R"({"model":"m","prompt":[1,2,128009]})")});
  out.push_back({"fuzz_openai_request", "chat",
                 with_control(1, R"({"model":"tiny","messages":[{"role":"system","content":"S"},)"
                                 R"({"role":"user","content":[{"type":"text","text":"é"}]}],"ignore_eos":true})")});
  out.push_back({"fuzz_openai_request", "unsupported", with_control(3, R"({"model":"m","messages":[],"n":2})")});
}

// Text for fuzz_text (the control byte picks the path: 0 byte-level, 1 SentencePiece-style, 2 ids, 3 a template).
void text_seeds(std::vector<Seed>& out) {
  const std::string mixed = "The KV cache 👨‍👩‍👧 東京 e\u0301 <|eot_id|> don't 12345\n\n  x";
  out.push_back({"fuzz_text", "bytelevel", with_control(0, mixed)});
  out.push_back({"fuzz_text", "bytelevel_special", with_control(4, mixed)});
  out.push_back({"fuzz_text", "sentencepiece", with_control(1, mixed)});
  out.push_back(
      {"fuzz_text", "invalid_utf8", with_control(0, std::string("ab\xC3\x28\xF0\x9F\x98 \xFF\xED\xA0\x80z"))});
  out.push_back(
      {"fuzz_text", "ids", with_control(2, std::string("\x01\x00\xE8\x00\xF0\x00\x9F\x00\x02\x01\x03\x01", 12))});
  out.push_back({"fuzz_text", "template", with_control(3, "{{ x }} {% for %} " + mixed)});
}

// Safetensors files made by the writer's encoder (fuzz_safetensors: a control byte of 8-byte units of the file
// beyond the bytes given, then the file's first bytes).
void safetensors_seeds(std::vector<Seed>& out) {
  namespace model = mc::model;
  std::vector<std::byte> data(96);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 37);
  const std::span<const std::byte> bytes(data);
  auto file = [&](const std::vector<model::TensorToWrite>& tensors, const std::map<std::string, std::string>& meta,
                  bool with_data) {
    std::string header = model::encode_safetensors_header(tensors, meta).value();
    size_t data_bytes = 0;
    for (const model::TensorToWrite& t : tensors) data_bytes += t.data.size();
    if (!with_data) return with_control(static_cast<uint8_t>((data_bytes + 7) / 8), header);
    for (const model::TensorToWrite& t : tensors)
      header.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
    return with_control(0, header);
  };
  const std::vector<model::TensorToWrite> weights = {
      {"model.layers.0.self_attn.q_proj.weight", model::Dtype::kF32, {4, 4}, bytes.subspan(0, 64)},
      {"model.embed_tokens.weight", model::Dtype::kBF16, {2, 6}, bytes.subspan(64, 24)},
      {"lm_head.bias", model::Dtype::kF16, {4}, bytes.subspan(88, 8)}};
  out.push_back({"fuzz_safetensors", "weights_metadata", file(weights, {{"format", "pt"}}, true)});
  out.push_back({"fuzz_safetensors", "header_only", file(weights, {}, false)});
  const std::vector<model::TensorToWrite> shapes = {
      {"scalar", model::Dtype::kI64, {}, bytes.subspan(0, 8)},
      {"empty", model::Dtype::kF32, {0, 7}, bytes.subspan(8, 0)},
      {"rank8", model::Dtype::kU8, {1, 2, 1, 2, 1, 2, 1, 2}, bytes.subspan(8, 16)},
      {"fp8", model::Dtype::kF8E4M3, {3}, bytes.subspan(24, 3)},
      {"mask", model::Dtype::kBool, {5}, bytes.subspan(27, 5)}};
  out.push_back({"fuzz_safetensors", "dtypes_shapes", file(shapes, {{"a", "1"}, {"b", ""}}, true)});
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return {};
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

int main(int argc, char** argv) {
  const bool check = argc == 3 && std::string_view(argv[1]) == "--check";
  if (!check && argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds [--check] CORPUS_DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[argc - 1];
  std::vector<Seed> seeds;
  protocol_seeds(seeds);
  fast_frame_seeds(seeds);
  kv_event_seeds(seeds);
  trace_seeds(seeds, MC_SOURCE_DIR);
  transfer_wire_seeds(seeds);
  grant_seeds(seeds);
  seal_seeds(seeds);
  openai_request_seeds(seeds);
  safetensors_seeds(seeds);
  text_seeds(seeds);
  int stale = 0;
  for (const Seed& s : seeds) {
    const std::filesystem::path p = dir / s.harness / s.name;
    if (check) {
      if (!std::filesystem::exists(p) || read_file(p) != s.bytes) {
        std::fprintf(stderr, "stale or missing seed %s (regenerate: fuzz_seeds tests/fuzz/corpus)\n", p.c_str());
        ++stale;
      }
      continue;
    }
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << s.bytes;
  }
  std::printf("fuzz_seeds: %zu seeds, %d stale\n", seeds.size(), stale);
  return stale == 0 ? 0 : 1;
}
