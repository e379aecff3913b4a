// parse_cluster_description (the file examples/cluster.sh starts) and the simulator config derived from it.
#include "mc/sim/cluster_description.hpp"

#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

namespace mc::sim {
namespace {

nlohmann::json good() {
  return nlohmann::json::parse(R"({
    "name": "t",
    "defaults": {"model": "llama3-70b", "gpu": "a800x8", "block_size": 512, "kv_bytes_per_token": 1024,
                 "policy": "cache_aware", "dram_bytes": "64MiB"},
    "racks": [{"name": "r0", "uplink_mbit": 5000}, {"name": "r1"}],
    "hosts": [
      {"name": "a", "rack": "r0", "nic_mbit": 8000, "daemons": {"master": 1, "conductor": 1, "store": 1, "prefill": 2}},
      {"name": "b", "rack": "r1", "daemons": {"store": 2, "decode": 1, "gateway": 1}}
    ]})");
}

// The refusal of `doc` (kInvalidArgument), its message.
std::string refusal(const nlohmann::json& doc) {
  auto r = parse_cluster_description(doc, "c.json");
  EXPECT_FALSE(r.is_ok());
  if (r.is_ok()) return "";
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("c.json: "), std::string::npos) << r.status().message();
  return r.status().message();
}

TEST(ClusterDescription, ParsesTheExamples) {
  for (const char* name : {"pair", "two-racks", "ssh-example", "main-job", "pipeline"}) {
    auto r = parse_cluster_description(std::string(MC_SOURCE_DIR "/examples/clusters/") + name + ".json");
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(r->name, name);
    EXPECT_EQ(r->total(&DescribedHost::master), 1);
  }
  // main-job.json: every host's NIC from defaults.nic_mbit (no host names its own).
  auto main_job = parse_cluster_description(std::string(MC_SOURCE_DIR "/examples/clusters/main-job.json"));
  ASSERT_TRUE(main_job.is_ok()) << main_job.status().message();
  EXPECT_GT(main_job->nic_mbit, 0);
  for (const DescribedHost& h : main_job->hosts) EXPECT_EQ(h.nic_mbit, main_job->nic_mbit) << h.name;
  EXPECT_GE(main_job->total(&DescribedHost::prefill), 2);
  EXPECT_GE(main_job->total(&DescribedHost::decode), 2);
  EXPECT_EQ(main_job->total(&DescribedHost::store), static_cast<int64_t>(main_job->hosts.size()));
  auto r = parse_cluster_description(std::string(MC_SOURCE_DIR "/examples/clusters/two-racks.json"));
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->hosts.size(), 4u);
  EXPECT_EQ(r->racks.size(), 2u);
  EXPECT_EQ(r->total(&DescribedHost::prefill), 2);
  EXPECT_EQ(r->total(&DescribedHost::decode), 2);
  EXPECT_EQ(r->total(&DescribedHost::store), 4);
  EXPECT_EQ(r->summary(), "two-racks: 4 hosts in 2 racks (rack0: h0 h1; rack1: h2 h3)");
}

TEST(ClusterDescription, ParsesFieldsAndDefaults) {
  auto r = parse_cluster_description(good(), "c.json");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->name, "t");
  EXPECT_EQ(r->policy, "cache_aware");
  EXPECT_EQ(r->dram_bytes, 64 << 20);
  EXPECT_EQ(r->racks[0].uplink_mbit, 5000);
  EXPECT_EQ(r->racks[1].uplink_mbit, 0);
  EXPECT_EQ(r->hosts[0].nic_mbit, 8000);
  EXPECT_EQ(r->hosts[1].nic_mbit, 0);
  EXPECT_EQ(r->client, "a");  // the Conductor's host
  nlohmann::json doc = good();
  doc.erase("racks");  // no racks: every host in rack0, as cluster.sh
  doc["hosts"][0].erase("rack");
  doc["hosts"][1].erase("rack");
  doc.erase("defaults");
  doc.erase("name");
  r = parse_cluster_description(doc, "dir/mine.json");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->name, "mine");
  EXPECT_EQ(r->racks.size(), 1u);
  EXPECT_EQ(r->hosts[1].rack, "rack0");
  EXPECT_EQ(r->model, "llama3-70b");
  EXPECT_EQ(r->kv_bytes_per_token, 1024);
  EXPECT_EQ(r->block_size, 512);
}

TEST(ClusterDescription, RefusesWhatClusterShRefuses) {
  EXPECT_NE(refusal(nlohmann::json::array()).find("JSON object"), std::string::npos);
  nlohmann::json d = good();
  d["hosts"] = nlohmann::json::array();
  EXPECT_NE(refusal(d).find("hosts: names no hosts"), std::string::npos);
  d = good();
  d["hosts"][1]["daemons"]["master"] = 1;
  EXPECT_NE(refusal(d).find("exactly one store master, has 2"), std::string::npos);
  d = good();
  d["hosts"][0]["daemons"].erase("conductor");
  EXPECT_NE(refusal(d).find("exactly one conductor, has 0"), std::string::npos);
  d = good();
  d["hosts"][0]["daemons"].erase("prefill");
  EXPECT_NE(refusal(d).find("at least one prefill and one decode"), std::string::npos);
  d = good();
  d["hosts"][1]["daemons"]["decode"] = 0;
  EXPECT_NE(refusal(d).find("at least one prefill and one decode"), std::string::npos);
  d = good();
  d["hosts"][0]["daemons"]["store"] = 0;
  d["hosts"][1]["daemons"]["store"] = 0;
  EXPECT_NE(refusal(d).find("daemons.store"), std::string::npos);
  d = good();
  d["hosts"][0]["daemons"]["gateway"] = 1;
  EXPECT_NE(refusal(d).find("at most one gateway"), std::string::npos);
  d = good();
  d["hosts"][1]["name"] = "a";
  EXPECT_NE(refusal(d).find("host 'a' named twice"), std::string::npos);
  d = good();
  d["hosts"][1]["name"] = "no spaces";
  EXPECT_NE(refusal(d).find("letters, digits"), std::string::npos);
  d = good();
  d["hosts"][1].erase("name");
  EXPECT_NE(refusal(d).find("hosts[1].name"), std::string::npos);
  d = good();
  d["racks"][1]["name"] = "r0";
  EXPECT_NE(refusal(d).find("rack 'r0' named twice"), std::string::npos);
  d = good();
  d["racks"][1].erase("name");
  EXPECT_NE(refusal(d).find("racks[1]: every rack needs a \"name\""), std::string::npos);
  d = good();
  d["hosts"][1]["rack"] = "r9";
  EXPECT_NE(refusal(d).find("rack 'r9' is not named in .racks"), std::string::npos);
  d = good();
  d["hosts"][0]["nic_mbit"] = -5;
  EXPECT_NE(refusal(d).find("host 'a'.nic_mbit: must be a whole number of Mbit/s"), std::string::npos);
  d = good();
  d["hosts"][0]["daemons"]["prefill"] = "two";
  EXPECT_NE(refusal(d).find("host 'a'.daemons.prefill"), std::string::npos);
  d = good();
  d["hosts"][0]["daemons"]["prefil"] = 1;
  EXPECT_NE(refusal(d).find("unknown role"), std::string::npos);
  d = good();
  d["client"] = "zz";
  EXPECT_NE(refusal(d).find("client 'zz' is not a host"), std::string::npos);
  d = good();
  d["defaults"]["subnet"] = "192.168";
  EXPECT_NE(refusal(d).find("defaults.subnet"), std::string::npos);
  d = good();
  d["defaults"]["dram_bytes"] = "lots";
  EXPECT_NE(refusal(d).find("defaults.dram_bytes"), std::string::npos);
  d = good();
  d["defaults"]["queue"] = "lifo";
  EXPECT_NE(refusal(d).find("defaults.queue: must be \"fcfs\" or \"slo\""), std::string::npos);
  auto missing = parse_cluster_description(std::string("/nonexistent/cluster.json"));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/cluster.json"), std::string::npos);
}

TEST(ClusterDescription, DerivesTheSimulatedCluster) {
  auto d = parse_cluster_description(good(), "c.json");
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  auto s = sim_config_from_description(*d);
  ASSERT_TRUE(s.is_ok()) << s.status().message();
  const ClusterConfig& c = s->config;
  EXPECT_EQ(c.prefill_instances, 2);
  EXPECT_EQ(c.decode_instances, 1);
  EXPECT_EQ(c.policy, "cache_aware");
  EXPECT_EQ(c.queue, "");  // absent: the policy's default
  EXPECT_EQ(c.block_size, 512);
  EXPECT_EQ(s->model_kv_bytes_per_token, 327680);  // llama3-70b: 2 * 80 layers * 8 kv heads * 128 * 2 B
  // The description asks for 1024 B per token; the sim backend stores 1280 (80 layers x 16 B, its smallest even
  // layout: model::sim_kv_bytes_per_token), and that is what the pool and the scale count.
  EXPECT_EQ(s->live_kv_bytes_per_token, 1280);
  EXPECT_DOUBLE_EQ(s->scale, 256);
  // 3 storage nodes x 64 MiB / 1280 B per token, spread over the 2 prefill instances.
  EXPECT_EQ(s->pool_tokens, 3 * (64 * 1024 * 1024 / 1280));
  EXPECT_EQ(c.cache_capacity_tokens, 3 * (64 * 1024 * 1024 / 1280) / 2);
  // prefill0, prefill1 on a (8000 Mbit/s x 256), decode0 on b (unshaped: the simulator's default).
  ASSERT_EQ(c.instance_nic_bandwidth_bytes_per_s.size(), 3u);
  EXPECT_DOUBLE_EQ(c.instance_nic_bandwidth_bytes_per_s[0], 1e9 * 256);
  EXPECT_DOUBLE_EQ(c.instance_nic_bandwidth_bytes_per_s[1], 1e9 * 256);
  EXPECT_DOUBLE_EQ(c.instance_nic_bandwidth_bytes_per_s[2], ClusterConfig{}.nic_bandwidth_bytes_per_s);
  EXPECT_DOUBLE_EQ(c.nic_bandwidth_bytes_per_s, ClusterConfig{}.nic_bandwidth_bytes_per_s);  // the slowest
  EXPECT_EQ(s->instance_hosts, (std::vector<std::string>{"a", "a", "b"}));

  // The ref backend stores real KV: the model's bytes per token, scale 1.
  d->backend = "ref";
  d->model = "tiny";
  d->block_size = 16;
  s = sim_config_from_description(*d);
  ASSERT_TRUE(s.is_ok()) << s.status().message();
  EXPECT_EQ(s->live_kv_bytes_per_token, s->model_kv_bytes_per_token);
  EXPECT_DOUBLE_EQ(s->scale, 1);

  d->model = "no-such-model";
  s = sim_config_from_description(*d);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("c.json: defaults.model"), std::string::npos);
}

TEST(ClusterDescription, QueueDisciplineReachesTheSimulatedCluster) {
  nlohmann::json doc = good();
  doc["defaults"]["queue"] = "fcfs";
  auto d = parse_cluster_description(doc, "c.json");
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  auto s = sim_config_from_description(*d);
  ASSERT_TRUE(s.is_ok()) << s.status().message();
  EXPECT_EQ(s->config.queue, "fcfs");
}

// Pending prefixes, load-priced placement, SLO headroom and load shedding (DESIGN.md §10): defaults.pending_prefix,
// defaults.placement_load_weight, defaults.slo_headroom and defaults.shed_limit reach the simulated cluster as the
// Conductor gets them from cluster.sh; bad values are refused naming the field.
TEST(ClusterDescription, PlacementSettingsReachTheSimulatedCluster) {
  nlohmann::json doc = good();
  auto d = parse_cluster_description(doc, "c.json");
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  auto s = sim_config_from_description(*d);
  ASSERT_TRUE(s.is_ok()) << s.status().message();
  EXPECT_EQ(s->config.pending_prefix, "");
  EXPECT_EQ(s->config.placement_load_weight, 1.0);
  EXPECT_EQ(s->config.slo_headroom, 0.2);
  EXPECT_EQ(s->config.shed_limit, 5.0);
  doc["defaults"]["pending_prefix"] = "off";
  doc["defaults"]["shed_limit"] = 0;
  doc["defaults"]["placement_load_weight"] = 0;
  doc["defaults"]["slo_headroom"] = 0;
  d = parse_cluster_description(doc, "c.json");
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  s = sim_config_from_description(*d);
  ASSERT_TRUE(s.is_ok()) << s.status().message();
  EXPECT_EQ(s->config.pending_prefix, "off");
  EXPECT_EQ(s->config.placement_load_weight, 0.0);
  EXPECT_EQ(s->config.slo_headroom, 0.0);
  EXPECT_EQ(s->config.shed_limit, 0.0);
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{{"pending_prefix", "maybe"},
                                                                                      {"placement_load_weight", -1},
                                                                                      {"placement_load_weight", "high"},
                                                                                      {"slo_headroom", 0.95},
                                                                                      {"slo_headroom", "some"},
                                                                                      {"shed_limit", -1},
                                                                                      {"shed_limit", 1001}}) {
    nlohmann::json bad = good();
    bad["defaults"][key] = value;
    auto r = parse_cluster_description(bad, "c.json");
    ASSERT_FALSE(r.is_ok()) << key << " = " << value.dump();
    EXPECT_NE(r.status().message().find("defaults." + key), std::string::npos) << r.status().message();
  }
}

TEST(ClusterDescription, ClusterConfigChecksPerInstanceNics) {
  ClusterConfig c;
  c.prefill_instances = 1;
  c.decode_instances = 1;
  c.instance_nic_bandwidth_bytes_per_s = {1e9};
  EXPECT_FALSE(c.validate().is_ok());
  c.instance_nic_bandwidth_bytes_per_s = {1e9, 0};
  EXPECT_FALSE(c.validate().is_ok());
  c.instance_nic_bandwidth_bytes_per_s = {1e9, 2e9};
  EXPECT_TRUE(c.validate().is_ok());
  EXPECT_DOUBLE_EQ(c.nic_bandwidth_of(1), 2e9);
  auto back = parse_cluster_config(c.to_json(), "round trip");
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_EQ(back->instance_nic_bandwidth_bytes_per_s, c.instance_nic_bandwidth_bytes_per_s);
}

}  // namespace
}  // namespace mc::sim
