#include "mc/sim/cluster_description.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>

#include "mc/common/input_file.hpp"
#include "mc/common/units.hpp"
#include "mc/model/cost_model.hpp"
#include "mc/model/model_config.hpp"
#include "mc/sched/queue_discipline.hpp"

namespace mc::sim {

namespace {

constexpr const char* kSeeDesign = " (docs/DESIGN.md §16, examples/clusters/*.json)";

Status bad_field(const std::string& source, const std::string& field, const std::string& why) {
  return error(Code::kInvalidArgument, source + ": " + field + ": " + why);
}

bool absent(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null();  // jq's `// default` treats null as absent too
}

// A name as cluster.sh accepts it: letters, digits, _ and -, at most 32, not starting with _ or -.
// (No std::regex: GCC 12's <regex> trips -Wmaybe-uninitialized under the sanitizers.)
bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 32 || !std::isalnum(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) != 0 || ch == '_' || ch == '-';
  });
}

// "10.N" with N one to three digits, as cluster.sh's defaults.subnet.
bool valid_subnet(const std::string& s) {
  if (s.size() < 4 || s.size() > 6 || s.compare(0, 3, "10.") != 0) return false;
  return std::all_of(s.begin() + 3, s.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)) != 0; });
}

// A whole number >= 0: a JSON integer or a string of digits (cluster.sh reads both through jq).
Result<int64_t> whole(const nlohmann::json& v, const std::string& source, const std::string& field,
                      const std::string& what) {
  if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0)) return v.get<int64_t>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (!s.empty() && s.size() <= 18 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return std::stoll(s);
    }
  }
  return bad_field(source, field, "must be a whole number of " + what + ", got " + v.dump());
}

Result<std::string> string_field(const nlohmann::json& v, const std::string& source, const std::string& field) {
  if (!v.is_string()) return bad_field(source, field, "must be a string, got " + v.dump());
  return v.get<std::string>();
}

// A byte quantity: a number or a units string ("256MiB").
Result<int64_t> bytes_field(const nlohmann::json& v, const std::string& source, const std::string& field) {
  if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0)) return v.get<int64_t>();
  if (v.is_string()) {
    auto r = units::parse_size_bytes(v.get<std::string>());
    if (r.is_ok() && *r >= 0) return *r;
  }
  return bad_field(source, field, "must be a byte size such as 268435456 or \"256MiB\", got " + v.dump());
}

Status parse_defaults(const nlohmann::json& d, const std::string& source, ClusterDescription& c) {
  if (!d.is_object()) return bad_field(source, "defaults", "must be an object of settings" + std::string(kSeeDesign));
  if (!absent(d, "backend")) {
    MC_ASSIGN_OR_RETURN(c.backend, string_field(d["backend"], source, "defaults.backend"));
    if (c.backend != "sim" && c.backend != "ref") {
      return bad_field(source, "defaults.backend", "must be \"sim\" or \"ref\", got \"" + c.backend + "\"");
    }
  }
  if (!absent(d, "model")) {
    MC_ASSIGN_OR_RETURN(c.model, string_field(d["model"], source, "defaults.model"));
  }
  if (!absent(d, "gpu")) {
    MC_ASSIGN_OR_RETURN(c.gpu, string_field(d["gpu"], source, "defaults.gpu"));
  }
  if (!absent(d, "policy")) {
    MC_ASSIGN_OR_RETURN(c.policy, string_field(d["policy"], source, "defaults.policy"));
  }
  if (!absent(d, "queue")) {
    MC_ASSIGN_OR_RETURN(c.queue, string_field(d["queue"], source, "defaults.queue"));
    if (!c.queue.empty() && !sched::parse_queue_discipline(c.queue).is_ok()) {
      return bad_field(
          source, "defaults.queue",
          "must be \"fcfs\" or \"slo\" (absent, null or \"\": the policy's default), got \"" + c.queue + "\"");
    }
  }
  if (!absent(d, "pending_prefix")) {
    MC_ASSIGN_OR_RETURN(c.pending_prefix, string_field(d["pending_prefix"], source, "defaults.pending_prefix"));
    if (!c.pending_prefix.empty() && c.pending_prefix != "on" && c.pending_prefix != "off") {
      return bad_field(
          source, "defaults.pending_prefix",
          "must be \"on\" or \"off\" (absent, null or \"\": the policy's default), got \"" + c.pending_prefix + "\"");
    }
  }
  if (!absent(d, "placement_load_weight")) {
    const auto& v = d["placement_load_weight"];
    if (!v.is_number() || !(v.get<double>() >= 0 && v.get<double>() <= 1000)) {
      return bad_field(source, "defaults.placement_load_weight",
                       "must be a number in [0, 1000] (0: the smallest TTFT, the paper's rule), got " + v.dump());
    }
    c.placement_load_weight = v.get<double>();
  }
  if (!absent(d, "slo_headroom")) {
    const auto& v = d["slo_headroom"];
    if (!v.is_number() || !(v.get<double>() >= 0 && v.get<double>() <= 0.9)) {
      return bad_field(
          source, "defaults.slo_headroom",
          "must be a number in [0, 0.9] (0: admit up to the SLO itself, the paper's rule), got " + v.dump());
    }
    c.slo_headroom = v.get<double>();
  }
  if (!absent(d, "shed_limit")) {
    const auto& v = d["shed_limit"];
    if (!v.is_number() || !(v.get<double>() >= 0 && v.get<double>() <= 1000)) {
      return bad_field(source, "defaults.shed_limit",
                       "must be a number in [0, 1000] (0: no load shedding), got " + v.dump());
    }
    c.shed_limit = v.get<double>();
  }
  if (!absent(d, "pipeline_group")) {
    MC_ASSIGN_OR_RETURN(c.pipeline_group,
                        whole(d["pipeline_group"], source, "defaults.pipeline_group", "prefill instances (1: off)"));
    if (c.pipeline_group < 1) return bad_field(source, "defaults.pipeline_group", "must be >= 1 (1: no pipelining)");
  }
  if (!absent(d, "pipeline_chunk_tokens")) {
    MC_ASSIGN_OR_RETURN(c.pipeline_chunk_tokens,
                        whole(d["pipeline_chunk_tokens"], source, "defaults.pipeline_chunk_tokens", "tokens"));
    if (c.pipeline_chunk_tokens < 1) return bad_field(source, "defaults.pipeline_chunk_tokens", "must be >= 1 token");
  }
  if (!absent(d, "pipeline_reserve_factor")) {
    const auto& v = d["pipeline_reserve_factor"];
    if (!v.is_number() || !(v.get<double>() >= 1 && v.get<double>() <= 64)) {
      return bad_field(
          source, "defaults.pipeline_reserve_factor",
          "must be a number in [1, 64] (instances about free to form a group, x its size; 1: its members)");
    }
    c.pipeline_reserve_factor = v.get<double>();
  }
  if (!absent(d, "block_size")) {
    MC_ASSIGN_OR_RETURN(c.block_size, whole(d["block_size"], source, "defaults.block_size", "tokens"));
    if (c.block_size < 1) return bad_field(source, "defaults.block_size", "must be >= 1 token");
  }
  if (!absent(d, "kv_bytes_per_token")) {
    MC_ASSIGN_OR_RETURN(c.kv_bytes_per_token, whole(d["kv_bytes_per_token"], source, "defaults.kv_bytes_per_token",
                                                    "bytes (0: the model's)"));
  }
  if (!absent(d, "dram_bytes")) {
    MC_ASSIGN_OR_RETURN(c.dram_bytes, bytes_field(d["dram_bytes"], source, "defaults.dram_bytes"));
  }
  if (!absent(d, "kv_buffer_size")) {
    MC_ASSIGN_OR_RETURN(c.kv_buffer_size, bytes_field(d["kv_buffer_size"], source, "defaults.kv_buffer_size"));
  }
  if (!absent(d, "nic_mbit")) {
    MC_ASSIGN_OR_RETURN(c.nic_mbit, whole(d["nic_mbit"], source, "defaults.nic_mbit", "Mbit/s (0: unshaped)"));
  }
  if (!absent(d, "time_scale")) {
    const nlohmann::json& t = d["time_scale"];
    double ts = 0;
    if (t.is_number()) {
      ts = t.get<double>();
    } else if (t.is_string()) {
      try {
        ts = std::stod(t.get<std::string>());
      } catch (const std::exception&) {
        ts = 0;
      }
    }
    if (!(ts > 0)) return bad_field(source, "defaults.time_scale", "must be a number > 0, got " + t.dump());
    c.time_scale = ts;
  }
  if (!absent(d, "subnet")) {
    MC_ASSIGN_OR_RETURN(std::string subnet, string_field(d["subnet"], source, "defaults.subnet"));
    if (!valid_subnet(subnet)) {
      return bad_field(source, "defaults.subnet", "must be 10.N (hosts get 10.N.RACK.HOST), got '" + subnet + "'");
    }
  }
  return Status::ok();
}

Result<DescribedHost> parse_host(const nlohmann::json& h, size_t i, const std::string& source,
                                 const std::set<std::string>& racks, const std::string& first_rack,
                                 int64_t default_nic_mbit) {
  std::string at = "hosts[" + std::to_string(i) + "]";
  if (!h.is_object())
    return bad_field(source, at, "must be an object with \"name\", \"rack\", \"nic_mbit\", \"daemons\"");
  DescribedHost host;
  if (absent(h, "name")) return bad_field(source, at + ".name", "every host needs a name");
  MC_ASSIGN_OR_RETURN(host.name, string_field(h["name"], source, at + ".name"));
  if (!valid_name(host.name)) {
    return bad_field(source, at + ".name", "host name '" + host.name + "': letters, digits, _ and - (at most 32)");
  }
  at = "host '" + host.name + "'";
  host.rack = first_rack;
  if (!absent(h, "rack")) {
    MC_ASSIGN_OR_RETURN(host.rack, string_field(h["rack"], source, at + ".rack"));
  }
  if (!racks.count(host.rack)) {
    return bad_field(
        source, at + ".rack",
        "rack '" + host.rack + "' is not named in .racks (add {\"name\": \"" + host.rack + "\"} to \"racks\")");
  }
  host.nic_mbit = default_nic_mbit;
  if (!absent(h, "nic_mbit")) {
    MC_ASSIGN_OR_RETURN(host.nic_mbit, whole(h["nic_mbit"], source, at + ".nic_mbit", "Mbit/s (0: unshaped)"));
  }
  if (!absent(h, "nic_latency_us")) {
    MC_ASSIGN_OR_RETURN(host.nic_latency_us, whole(h["nic_latency_us"], source, at + ".nic_latency_us", "µs"));
  }
  if (!absent(h, "daemons")) {
    const nlohmann::json& d = h["daemons"];
    if (!d.is_object()) return bad_field(source, at + ".daemons", "must be an object of counts per role");
    for (const auto& item : d.items()) {
      const std::string field = at + ".daemons." + item.key();
      int64_t DescribedHost::*role = nullptr;
      if (item.key() == "master") {
        role = &DescribedHost::master;
      } else if (item.key() == "conductor") {
        role = &DescribedHost::conductor;
      } else if (item.key() == "store") {
        role = &DescribedHost::store;
      } else if (item.key() == "prefill") {
        role = &DescribedHost::prefill;
      } else if (item.key() == "decode") {
        role = &DescribedHost::decode;
      } else if (item.key() == "gateway") {
        role = &DescribedHost::gateway;
      } else {
        return bad_field(source, field, "unknown role (master, conductor, store, prefill, decode, gateway)");
      }
      if (item.value().is_null()) continue;
      MC_ASSIGN_OR_RETURN(host.*role, whole(item.value(), source, field, "daemons (a count)"));
    }
  }
  return host;
}

}  // namespace

int64_t ClusterDescription::total(int64_t DescribedHost::*role) const {
  int64_t n = 0;
  for (const DescribedHost& h : hosts) n += h.*role;
  return n;
}

std::string ClusterDescription::summary() const {
  std::string s = name + ": " + std::to_string(hosts.size()) + (hosts.size() == 1 ? " host" : " hosts") + " in " +
                  std::to_string(racks.size()) + (racks.size() == 1 ? " rack" : " racks") + " (";
  for (size_t r = 0; r < racks.size(); ++r) {
    s += (r ? "; " : "") + racks[r].name + ":";
    for (const DescribedHost& h : hosts) {
      if (h.rack == racks[r].name) s += " " + h.name;
    }
  }
  return s + ")";
}

Result<ClusterDescription> parse_cluster_description(const nlohmann::json& doc, const std::string& source) {
  if (!doc.is_object()) {
    return error(Code::kInvalidArgument,
                 source + ": a cluster description must be a JSON object with \"hosts\"" + std::string(kSeeDesign));
  }
  ClusterDescription c;
  c.source = source;
  c.name = std::filesystem::path(source).stem().string();
  if (!absent(doc, "name")) {
    MC_ASSIGN_OR_RETURN(c.name, string_field(doc["name"], source, "name"));
  }
  if (!absent(doc, "defaults")) {
    MC_RETURN_IF_ERROR(parse_defaults(doc["defaults"], source, c));
  }
  if (c.model.empty()) c.model = c.backend == "ref" ? "tiny" : "llama3-70b";

  std::set<std::string> rack_names;
  if (!absent(doc, "racks")) {
    const nlohmann::json& racks = doc["racks"];
    if (!racks.is_array()) return bad_field(source, "racks", "must be an array of {\"name\", \"uplink_mbit\"}");
    for (size_t r = 0; r < racks.size(); ++r) {
      const std::string at = "racks[" + std::to_string(r) + "]";
      const nlohmann::json& rj = racks[r];
      if (!rj.is_object() || absent(rj, "name")) return bad_field(source, at, "every rack needs a \"name\"");
      DescribedRack rack;
      MC_ASSIGN_OR_RETURN(rack.name, string_field(rj["name"], source, at + ".name"));
      if (!valid_name(rack.name)) {
        return bad_field(source, at + ".name", "rack name '" + rack.name + "': letters, digits, _ and - (at most 32)");
      }
      if (!rack_names.insert(rack.name).second) {
        return bad_field(source, at + ".name", "rack '" + rack.name + "' named twice (each rack once)");
      }
      if (!absent(rj, "uplink_mbit")) {
        MC_ASSIGN_OR_RETURN(rack.uplink_mbit,
                            whole(rj["uplink_mbit"], source, at + ".uplink_mbit", "Mbit/s (0: unshaped)"));
      }
      c.racks.push_back(rack);
    }
  }
  if (c.racks.empty()) {  // as cluster.sh: one rack, rack0
    c.racks.push_back(DescribedRack{"rack0", 0});
    rack_names.insert("rack0");
  }

  if (absent(doc, "hosts") || !doc["hosts"].is_array() || doc["hosts"].empty()) {
    return bad_field(
        source, "hosts",
        "names no hosts: give an array of {\"name\", \"rack\", \"nic_mbit\", \"daemons\"}" + std::string(kSeeDesign));
  }
  const nlohmann::json& hosts = doc["hosts"];
  if (hosts.size() > 200 || c.racks.size() > 200) return bad_field(source, "hosts", "at most 200 hosts and 200 racks");
  std::set<std::string> host_names;
  for (size_t i = 0; i < hosts.size(); ++i) {
    MC_ASSIGN_OR_RETURN(DescribedHost h, parse_host(hosts[i], i, source, rack_names, c.racks.front().name, c.nic_mbit));
    if (!host_names.insert(h.name).second) {
      return bad_field(source, "hosts[" + std::to_string(i) + "].name",
                       "host '" + h.name + "' named twice (each host once)");
    }
    c.hosts.push_back(std::move(h));
  }

  if (int64_t n = c.total(&DescribedHost::master); n != 1) {
    return bad_field(
        source, "daemons.master",
        "the cluster needs exactly one store master, has " + std::to_string(n) + " (give one host \"master\": 1)");
  }
  if (int64_t n = c.total(&DescribedHost::conductor); n != 1) {
    return bad_field(
        source, "daemons.conductor",
        "the cluster needs exactly one conductor, has " + std::to_string(n) + " (give one host \"conductor\": 1)");
  }
  if (c.total(&DescribedHost::prefill) < 1 || c.total(&DescribedHost::decode) < 1) {
    return bad_field(source, "daemons.prefill/decode",
                     "the cluster needs at least one prefill and one decode instance, has " +
                         std::to_string(c.total(&DescribedHost::prefill)) + " and " +
                         std::to_string(c.total(&DescribedHost::decode)));
  }
  if (c.total(&DescribedHost::store) < 1) {
    return bad_field(source, "daemons.store", "the cluster needs at least one storage node (give a host \"store\": 1)");
  }
  if (c.total(&DescribedHost::gateway) > 1) return bad_field(source, "daemons.gateway", "at most one gateway");

  if (!absent(doc, "client")) {
    MC_ASSIGN_OR_RETURN(c.client, string_field(doc["client"], source, "client"));
    if (!host_names.count(c.client)) {
      return bad_field(source, "client", "client '" + c.client + "' is not a host of the description");
    }
  } else {
    for (const DescribedHost& h : c.hosts) {
      if (h.conductor == 1) c.client = h.name;
    }
  }
  return c;
}

Result<ClusterDescription> parse_cluster_description(const std::string& path) {
  MC_ASSIGN_OR_RETURN(std::ifstream in, open_input_file(path, "cluster description",
                                                        "give a description file such as examples/clusters/pair.json"));
  nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return error(Code::kInvalidArgument, path + ": not valid JSON (check it with `jq . " + path + "`)");
  }
  return parse_cluster_description(doc, path);
}

Result<DescribedSimCluster> sim_config_from_description(const ClusterDescription& d) {
  DescribedSimCluster out;
  ClusterConfig& c = out.config;
  c.model = d.model;
  c.gpu = d.gpu;
  c.policy = d.policy;
  c.queue = d.queue;
  c.pending_prefix = d.pending_prefix;
  c.placement_load_weight = d.placement_load_weight;
  c.slo_headroom = d.slo_headroom;
  c.shed_limit = d.shed_limit;
  c.pipeline_group = d.pipeline_group;
  c.pipeline_chunk_tokens = d.pipeline_chunk_tokens;
  c.pipeline_reserve_factor = d.pipeline_reserve_factor;
  c.block_size = d.block_size;
  c.prefill_instances = d.total(&DescribedHost::prefill);
  c.decode_instances = d.total(&DescribedHost::decode);

  auto model = model::load_model(d.model);
  if (!model.is_ok()) return bad_field(d.source, "defaults.model", model.status().message());
  if (auto gpu = model::gpu_preset(d.gpu); !gpu.is_ok())
    return bad_field(d.source, "defaults.gpu", gpu.status().message());
  out.model_kv_bytes_per_token = model->kv_bytes_per_token();
  // What the live workers store and move per token: the sim backend's --kv-bytes-per-token (cluster.sh
  // passes the description's, 0 = the model's) as that backend rounds it; the ref backend stores real KV.
  out.live_kv_bytes_per_token =
      d.backend == "sim" ? model::sim_kv_bytes_per_token(*model, d.kv_bytes_per_token) : out.model_kv_bytes_per_token;
  out.scale = static_cast<double>(out.model_kv_bytes_per_token) / static_cast<double>(out.live_kv_bytes_per_token);
  out.pool_tokens = d.total(&DescribedHost::store) * (d.dram_bytes / out.live_kv_bytes_per_token);
  c.cache_capacity_tokens = out.pool_tokens / c.prefill_instances;

  const double default_nic = ClusterConfig{}.nic_bandwidth_bytes_per_s;
  auto nic_of = [&](const DescribedHost& h) {
    return h.nic_mbit > 0 ? static_cast<double>(h.nic_mbit) * 1e6 / 8 * out.scale : default_nic;
  };
  for (int64_t DescribedHost::*role : {&DescribedHost::prefill, &DescribedHost::decode}) {
    for (const DescribedHost& h : d.hosts) {
      for (int64_t k = 0; k < h.*role; ++k) {
        c.instance_nic_bandwidth_bytes_per_s.push_back(nic_of(h));
        out.instance_hosts.push_back(h.name);
      }
    }
  }
  c.nic_bandwidth_bytes_per_s =
      *std::min_element(c.instance_nic_bandwidth_bytes_per_s.begin(), c.instance_nic_bandwidth_bytes_per_s.end());
  Status s = c.validate();
  if (!s.is_ok()) return error(s.code(), d.source + ": the derived simulator config: " + s.message());
  return out;
}

}  // namespace mc::sim
