#include "mc/transfer/topology.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include "mc/common/input_file.hpp"

namespace mc::transfer {
namespace fs = std::filesystem;
namespace {

int read_numa_node(const fs::path& file) {
  std::ifstream in(file);
  int node = -1;
  if (in >> node) return node < 0 ? -1 : node;
  return -1;
}

bool contains(const std::vector<std::string>& v, std::string_view s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

}  // namespace

Result<Topology> Topology::discover(const std::string& sysfs_root) {
  const fs::path root(sysfs_root);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    return Status(Code::kNotFound, "topology: sysfs root " + sysfs_root + " is not a readable directory");
  }
  Topology t;
  std::vector<int> nodes;
  for (const auto& e : fs::directory_iterator(root / "devices/system/node", ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("node", 0) == 0 && n.size() > 4 && std::all_of(n.begin() + 4, n.end(), ::isdigit)) {
      nodes.push_back(std::stoi(n.substr(4)));
    }
  }
  if (nodes.empty()) nodes.push_back(0);
  std::sort(nodes.begin(), nodes.end());

  for (const auto& e : fs::directory_iterator(root / "class/net", ec)) {
    TopologyDevice d;
    d.name = e.path().filename().string();
    d.kind = "net";
    d.numa_node = read_numa_node(e.path() / "device/numa_node");
    t.devices_.push_back(std::move(d));
  }
  for (const auto& e : fs::directory_iterator(root / "class/infiniband", ec)) {
    TopologyDevice d;
    d.name = e.path().filename().string();
    d.kind = "rdma";
    d.numa_node = read_numa_node(e.path() / "device/numa_node");
    t.devices_.push_back(std::move(d));
  }
  std::sort(t.devices_.begin(), t.devices_.end(),
            [](const TopologyDevice& a, const TopologyDevice& b) { return a.name < b.name; });

  ifaddrs* ifa = nullptr;
  if (getifaddrs(&ifa) == 0) {
    for (ifaddrs* i = ifa; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_name == nullptr) continue;
      char buf[INET6_ADDRSTRLEN] = {0};
      if (i->ifa_addr->sa_family == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof buf);
      } else if (i->ifa_addr->sa_family == AF_INET6) {
        inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, buf, sizeof buf);
      } else {
        continue;
      }
      for (auto& d : t.devices_) {
        if (d.kind == "net" && d.name == i->ifa_name) d.addresses.emplace_back(buf);
      }
    }
    freeifaddrs(ifa);
  }

  for (int n : nodes) {
    TopologyEntry entry;
    for (const auto& d : t.devices_) {
      if (d.numa_node < 0 || d.numa_node == n) {
        entry.preferred.push_back(d.name);
      } else {
        entry.fallback.push_back(d.name);
      }
    }
    t.matrix_["cpu:" + std::to_string(n)] = std::move(entry);
  }
  return t;
}

Result<Topology> Topology::parse_json(std::string_view json_text, std::string_view what) {
  const std::string w(what);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const std::exception& e) {
    return Status(Code::kInvalidArgument, w + ": not valid JSON: " + e.what());
  }
  try {
    if (!j.is_object()) return Status(Code::kInvalidArgument, w + ": expected a JSON object");
    Topology t;
    if (j.contains("version") && j.at("version").get<int>() != 1) {
      return Status(Code::kInvalidArgument, w + ": unknown version " + j.at("version").dump() + " (expected 1)");
    }
    if (j.contains("devices")) {
      for (const auto& jd : j.at("devices")) {
        TopologyDevice d;
        d.name = jd.at("name").get<std::string>();
        d.kind = jd.value("kind", "net");
        d.numa_node = jd.value("numa_node", -1);
        if (jd.contains("addresses")) d.addresses = jd.at("addresses").get<std::vector<std::string>>();
        t.devices_.push_back(std::move(d));
      }
    }
    if (!j.contains("matrix") || !j.at("matrix").is_object()) {
      return Status(Code::kInvalidArgument, w + ": missing object \"matrix\" (location -> {preferred, fallback})");
    }
    for (const auto& [loc, je] : j.at("matrix").items()) {
      TopologyEntry e;
      if (je.is_array()) {  // Mooncake's form: [[preferred...], [fallback...]]
        if (!je.empty()) e.preferred = je.at(0).get<std::vector<std::string>>();
        if (je.size() > 1) e.fallback = je.at(1).get<std::vector<std::string>>();
      } else {
        if (je.contains("preferred")) e.preferred = je.at("preferred").get<std::vector<std::string>>();
        if (je.contains("fallback")) e.fallback = je.at("fallback").get<std::vector<std::string>>();
      }
      t.matrix_[loc] = std::move(e);
    }
    return t;
  } catch (const std::exception& e) {
    return Status(Code::kInvalidArgument, w + ": wrong shape: " + e.what());
  }
}

Result<Topology> Topology::load(const std::string& path) {
  MC_ASSIGN_OR_RETURN(std::ifstream in, open_input_file(path, "topology file"));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_json(ss.str(), "topology file " + path);
}

std::string Topology::to_json(int indent) const {
  nlohmann::json j;
  j["version"] = 1;
  j["devices"] = nlohmann::json::array();
  for (const auto& d : devices_) {
    j["devices"].push_back(
        {{"name", d.name}, {"kind", d.kind}, {"numa_node", d.numa_node}, {"addresses", d.addresses}});
  }
  j["matrix"] = nlohmann::json::object();
  for (const auto& [loc, e] : matrix_) j["matrix"][loc] = {{"preferred", e.preferred}, {"fallback", e.fallback}};
  return j.dump(indent);
}

double Topology::weight(std::string_view location, std::string_view device) const {
  if (device.empty()) return kPreferredWeight;
  auto it = matrix_.find(std::string(location));
  if (it == matrix_.end()) return kPreferredWeight;
  if (contains(it->second.preferred, device)) return kPreferredWeight;
  if (contains(it->second.fallback, device)) return kFallbackWeight;
  return kUnknownWeight;
}

std::string Topology::device_of_address(std::string_view address) const {
  for (const auto& d : devices_) {
    if (contains(d.addresses, address)) return d.name;
  }
  return "";
}

}  // namespace mc::transfer
