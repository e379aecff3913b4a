#include "mc/net/auth.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <sodium.h>
#include <zmq.hpp>

#include <nlohmann/json.hpp>

#include "mc/common/endpoint.hpp"
#include "mc/common/fd.hpp"
#include "mc/common/log.hpp"
#include "mc/common/report.hpp"
#include "mc/coord/etcd.hpp"
#include "mc/net/rpc.hpp"

namespace mc::auth {
namespace {

constexpr const char* kRoleNames[kRoleCount] = {"client", "storage", "worker", "conductor", "master", "admin"};
constexpr const char* kRemedy = " (make the directory with `mc-auth init DIR`)";

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status(Code::kNotFound, "cannot read " + path + ": " + std::strerror(errno) + kRemedy);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// The key directory's permissions (issue 51): whoever can write DIR, DIR/ids or the roster can add an admin key to the
// roster, and whoever can read a secret can act as its identity. `secret`: no access for group or others (0600);
// else not writable by them. A path that does not exist is not this check's business (read_text names it).
Status check_key_mode(const std::string& path, bool secret) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::ok();
  // Another user who owns it can change it at will, whatever its mode (root's and this user's are trusted).
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    return Status(Code::kPermissionDenied, path + " is owned by uid " + std::to_string(st.st_uid) +
                                               ", neither this user (uid " + std::to_string(::geteuid()) +
                                               ") nor root: whoever owns it can change the cluster's keys; chown it");
  }
  const mode_t bad = secret ? (S_IRWXG | S_IRWXO) : (S_IWGRP | S_IWOTH);
  if ((st.st_mode & bad) == 0) return Status::ok();
  char mode[8];
  std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
  const bool dir = S_ISDIR(st.st_mode);
  return Status(Code::kPermissionDenied,
                path + " is " + (secret ? "open to" : "writable by") + " other users (mode " + mode + "): " +
                    (secret ? "whoever reads it acts as its identity; chmod 600 " + path
                            : std::string("whoever writes it can add a key to the roster; chmod ") +
                                  (dir ? "700 " : "644 ") + path));
}

Status write_text(const std::string& path, const std::string& text, mode_t mode) {
  return write_file_replacing(path, text + "\n", mode);
}

std::string hex(std::string_view bytes) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (const char c : bytes) {
    out += d[(static_cast<unsigned char>(c) >> 4) & 15];
    out += d[static_cast<unsigned char>(c) & 15];
  }
  return out;
}

Result<std::string> unhex(std::string_view text, std::string_view what) {
  if (text.size() % 2 != 0) return Status(Code::kInvalidArgument, std::string(what) + ": not hex");
  std::string out;
  for (size_t i = 0; i < text.size(); i += 2) {
    int v = 0;
    for (size_t j = i; j < i + 2; ++j) {
      const char c = text[j];
      const int n = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (n < 0) return Status(Code::kInvalidArgument, std::string(what) + ": not lowercase hex");
      v = v * 16 + n;
    }
    out += static_cast<char>(v);
  }
  return out;
}

// ---- The process ----
std::mutex g_mu;
std::shared_ptr<const Keyring> g_keyring;
std::vector<std::shared_ptr<const Keyring>> g_retired;  // replaced rings stay alive: readers hold raw pointers
std::atomic<const Keyring*> g_raw{nullptr};
std::atomic<bool> g_allow_unauthenticated{false};
std::atomic<bool> g_warned{false};
std::atomic<uint64_t> g_zap_refused{0};

// The ZAP handler (ZeroMQ RFC 27): libzmq asks it, over inproc://zeromq.zap.01 in the process's context, whether
// a peer's CURVE public key may connect, and takes the reply's user id as the peer's name (read per message with
// zmq_msg_gets "User-Id"). One per process, started by set_process_keyring before any server socket binds, so no
// CURVE connection is ever accepted without it. Destroyed before the context (it is constructed after it).
class ZapHandler {
 public:
  ZapHandler() : socket_(rpc::context(), zmq::socket_type::rep) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind("inproc://zeromq.zap.01");
    thread_ = std::thread([this] { run(); });
  }
  ~ZapHandler() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

 private:
  void run() {
    while (!stop_.load()) {
      try {
        zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0}};
        zmq::poll(items, 1, std::chrono::milliseconds(100));
        if (!(items[0].revents & ZMQ_POLLIN)) continue;
        std::vector<zmq::message_t> frames;
        if (!zmq::recv_multipart(socket_, std::back_inserter(frames), zmq::recv_flags::dontwait)) continue;
        answer(frames);
      } catch (const zmq::error_t& e) {
        if (e.num() == ETERM) return;
        if (e.num() != EINTR) MC_LOG_WARN << "authenticator: " << e.what();
      }
    }
  }

  // Counts a refused connection and logs it (rate limited) with the peer's address.
  static void refused(const std::string& address, const std::string& why) {
    const uint64_t n = g_zap_refused.fetch_add(1) + 1;
    if (log::nth_worth_logging(n)) {
      MC_LOG_WARN << "refused a connection from " << address << ": " << why << " (" << n << " refused so far)";
    }
  }

  void answer(std::vector<zmq::message_t>& f) {
    // [version, request id, domain, address, routing id, mechanism, credentials...]
    std::string request_id = f.size() > 1 ? f[1].to_string() : std::string();
    std::string code = "400", text = "malformed ZAP request", user;
    if (f.size() >= 7 && f[0].to_string_view() == "1.0" && f[5].to_string_view() == "CURVE" && f[6].size() == 32) {
      char z85[41] = {};
      zmq_z85_encode(z85, static_cast<const uint8_t*>(f[6].data()), 32);
      const Keyring* ring = g_raw.load();
      const Identity* id = ring == nullptr ? nullptr : ring->find_by_key(z85);
      if (id != nullptr && id->role == Role::kClient && f[2].to_string_view() == "events") {
        text = "a tenant's client may not subscribe to KV events";
        refused(f[3].to_string(), id->describe() + ": " + text);
      } else if (id != nullptr) {
        code = "200";
        text = "OK";
        user = id->name;
      } else {
        text = "key not in the roster";
        refused(f[3].to_string(), std::string("CURVE key ") + z85 + " is not in the roster" +
                                      (ring != nullptr ? " of " + ring->dir() : std::string()));
      }
    } else if (f.size() >= 6) {
      text = "mechanism " + f[5].to_string() + " refused: this cluster requires CURVE";
      refused(f[3].to_string(), text);
    }
    std::vector<zmq::const_buffer> reply = {zmq::str_buffer("1.0"), zmq::buffer(request_id), zmq::buffer(code),
                                            zmq::buffer(text),      zmq::buffer(user),       zmq::str_buffer("")};
    zmq::send_multipart(socket_, reply);
  }

  zmq::socket_t socket_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::unique_ptr<ZapHandler>& zap_slot() {
  rpc::context();  // constructed first, so destroyed after the handler
  static std::unique_ptr<ZapHandler> slot;
  return slot;
}

// The policy table (docs/SECURITY.md "What each role may call"). A bit per role.
constexpr uint32_t bit(Role r) { return 1u << static_cast<unsigned>(r); }
constexpr uint32_t kAll = (1u << kRoleCount) - 1;
constexpr uint32_t kClient = bit(Role::kClient), kStorage = bit(Role::kStorage), kWorker = bit(Role::kWorker),
                   kConductor = bit(Role::kConductor), kMaster = bit(Role::kMaster);
constexpr uint32_t kPoolUsers = kClient | kWorker | kConductor;  // callers of the object API

struct Rule {
  std::string_view type;
  uint32_t roles;
};
constexpr Rule kRules[] = {
    {"hello", kAll},
    {"ping", kAll},
    {"stat", kAll},
    {"xfer.publish_segment", kStorage | kWorker | kClient | kMaster},  // the name is bound to its first publisher
    {"xfer.get_segment", kAll},
    {"store.mount", kStorage},
    {"store.unmount", kStorage},  // a node its own segments; admin any
    {"store.node_heartbeat", kStorage},
    {"store.node_report", kStorage},
    {"store.node_drain", kStorage},
    {"store.client_heartbeat", kPoolUsers},
    {"store.put_start", kPoolUsers},
    {"store.put_end", kPoolUsers},
    {"store.put_revoke", kPoolUsers},
    {"store.get_replicas", kPoolUsers},
    {"store.replica_end", kPoolUsers},
    {"store.exists", kPoolUsers},
    {"store.match_prefix", kPoolUsers},
    {"store.remove", kPoolUsers},
    {"store.ls", kPoolUsers},
    {"store.stat", kAll},
    {"store.info", kAll},
    {"store.pin", kPoolUsers},
    {"store.unpin", kPoolUsers},
    {"store.report_corrupt", kPoolUsers},
    {"store.replicate_near", kConductor},
    {"store.quota_set", 0},  // admin only (docs/SECURITY.md "Quotas (issue 51)")
    {"store.node.write", kPoolUsers},
    {"store.node.read", kPoolUsers},
    {"decode.reserve", kConductor},
    {"decode.release", kConductor},
    {"decode.abort", kWorker | kConductor},
    {"decode.kv_write", kWorker},
    {"decode.kv_commit", kWorker},
    {"worker.load", kWorker | kConductor},
    {"prefill.job", kConductor},
    {"prefill.cancel", kConductor},
    {"prefill.stage_hidden", kWorker},  // stage s -> s+1 of a pipelined prefill (DESIGN.md §18)
    {"prefill.stage_slot", kWorker},    // the same, through the transfer engine
    {"decode.cancel", kConductor},
    {"client.token_event", kWorker},
    {"client.request_done", kWorker},
    {"client.request_error", kWorker | kConductor},
    {"conductor.submit", kClient},
    {"conductor.cancel", kClient},  // the submitter's own requests only
    {"conductor.status", kClient | kWorker},
    {"conductor.register", kWorker},
    {"conductor.heartbeat", kWorker},
    {"conductor.job_report", kWorker},
    {"conductor.drain", kWorker},  // bound to the registered owner, like heartbeats
};

uint32_t roles_of(std::string_view type) {
  for (const Rule& r : kRules) {
    if (r.type == type) return r.roles | bit(Role::kAdmin);
  }
  return bit(Role::kAdmin);
}

}  // namespace

bool valid_name(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  for (const char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '.' || c == '-')) return false;
  }
  return true;
}

std::string_view role_name(Role role) { return kRoleNames[static_cast<int>(role)]; }

Result<Role> parse_role(std::string_view name) {
  for (int i = 0; i < kRoleCount; ++i) {
    if (name == kRoleNames[i]) return static_cast<Role>(i);
  }
  return Status(Code::kInvalidArgument,
                "unknown role '" + std::string(name) + "' (roles: client, storage, worker, conductor, master, admin)");
}

std::string Identity::describe() const {
  std::string s = name + " (" + std::string(role_name(role));
  if (role == Role::kClient) s += ", tenant " + tenant;
  return s + ")";
}

Result<KeyPair> make_key_pair() {
  char pub[41] = {}, sec[41] = {};
  if (zmq_curve_keypair(pub, sec) != 0) {
    return Status(Code::kInternal, std::string("cannot make a CURVE key pair: ") + zmq_strerror(zmq_errno()) +
                                       " (libzmq must be built with libsodium)");
  }
  return KeyPair{pub, sec};
}

Result<std::string> decode_key(std::string_view z85, std::string_view what) {
  if (z85.size() != 40) {
    return Status(Code::kInvalidArgument,
                  std::string(what) + ": a key is 40 Z85 characters, got " + std::to_string(z85.size()));
  }
  const std::string text(z85);
  uint8_t raw[32];
  if (zmq_z85_decode(raw, text.c_str()) == nullptr) {
    return Status(Code::kInvalidArgument, std::string(what) + ": not a Z85 key");
  }
  return std::string(reinterpret_cast<const char*>(raw), 32);
}

namespace {
// DIR/roster: one Identity per line (see auth.hpp); kInvalidArgument naming the file and line for a bad one, or for
// a name or key listed twice.
Result<std::vector<Identity>> parse_roster(const std::string& dir) {
  const std::string roster_path = dir + "/roster";
  Result<std::string> roster = read_text(roster_path);
  if (!roster.is_ok()) return roster.status();
  std::vector<Identity> out;
  std::unordered_map<std::string, int> names, keys;
  std::istringstream lines(roster.value());
  std::string line;
  int line_no = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    const std::string where = roster_path + ":" + std::to_string(line_no);
    std::istringstream words(line);
    Identity id;
    std::string role, shared;
    if (!(words >> id.name >> role >> id.tenant >> id.public_key)) {
      return Status(Code::kInvalidArgument, where + ": expected NAME ROLE TENANT PUBLIC_KEY [SHARED,...]");
    }
    words >> shared;
    if (!valid_name(id.name)) return Status(Code::kInvalidArgument, where + ": bad name '" + id.name + "'");
    Result<Role> r = parse_role(role);
    if (!r.is_ok()) return r.status().with_context(where);
    id.role = r.value();
    if (id.tenant != "-" && !valid_name(id.tenant)) {
      return Status(Code::kInvalidArgument, where + ": bad tenant '" + id.tenant + "'");
    }
    if (id.role == Role::kClient && id.tenant == "-") {
      return Status(Code::kInvalidArgument, where + ": a client names its tenant");
    }
    MC_RETURN_IF_ERROR(decode_key(id.public_key, where).status());
    for (size_t pos = 0; !shared.empty() && pos <= shared.size();) {
      const size_t comma = std::min(shared.find(',', pos), shared.size());
      std::string ns = shared.substr(pos, comma - pos);
      if (!valid_name(ns)) return Status(Code::kInvalidArgument, where + ": bad shared namespace '" + ns + "'");
      id.shared.push_back(std::move(ns));
      pos = comma + 1;
    }
    if (names[id.name]++ != 0 || keys[id.public_key]++ != 0) {
      return Status(Code::kInvalidArgument, where + ": name or key of '" + id.name + "' listed twice");
    }
    out.push_back(std::move(id));
  }
  return out;
}
}  // namespace

Result<std::shared_ptr<const Keyring>> Keyring::load(const std::string& dir, const std::string& name) {
  auto ring = std::make_shared<Keyring>();
  ring->dir_ = dir;
  const std::string roster_path = dir + "/roster";
  for (const std::string& p : {dir, dir + "/ids", roster_path, dir + "/cluster.pub"}) {
    MC_RETURN_IF_ERROR(check_key_mode(p, /*secret=*/false));
  }
  for (const std::string& p : {dir + "/ids/" + name + ".secret", dir + "/cluster.secret", dir + "/grant.key"}) {
    MC_RETURN_IF_ERROR(check_key_mode(p, /*secret=*/true));
  }
  MC_ASSIGN_OR_RETURN(ring->roster_, parse_roster(dir));
  for (size_t i = 0; i < ring->roster_.size(); ++i) {
    ring->by_name_[ring->roster_[i].name] = i;
    ring->by_key_[ring->roster_[i].public_key] = i;
  }
  const Identity* self = ring->find_by_name(name);
  if (self == nullptr) {
    return Status(Code::kNotFound,
                  "identity '" + name + "' is not in " + roster_path +
                      " (give --auth-name with a name of `mc-auth ls DIR`; identities are made by `mc-auth init`, and "
                      "--force there replaces every key of the cluster)");
  }
  ring->self_ = *self;
  Result<std::string> secret = read_text(dir + "/ids/" + name + ".secret");
  if (!secret.is_ok()) return secret.status();
  MC_RETURN_IF_ERROR(decode_key(secret.value(), dir + "/ids/" + name + ".secret").status());
  char pub[41] = {};
  if (zmq_curve_public(pub, secret->c_str()) != 0 || self->public_key != pub) {
    return Status(Code::kInvalidArgument,
                  dir + "/ids/" + name + ".secret does not match the roster's key of '" + name + "'");
  }
  ring->self_keys_ = KeyPair{pub, secret.value()};
  Result<std::string> cluster = read_text(dir + "/cluster.pub");
  if (!cluster.is_ok()) return cluster.status();
  MC_RETURN_IF_ERROR(decode_key(cluster.value(), dir + "/cluster.pub").status());
  ring->cluster_public_ = cluster.value();
  if (Result<std::string> cs = read_text(dir + "/cluster.secret"); cs.is_ok()) {
    MC_RETURN_IF_ERROR(decode_key(cs.value(), dir + "/cluster.secret").status());
    if (zmq_curve_public(pub, cs->c_str()) != 0 || ring->cluster_public_ != pub) {
      return Status(Code::kInvalidArgument, dir + "/cluster.secret does not match " + dir + "/cluster.pub");
    }
    ring->cluster_secret_ = cs.value();
  }
  // A tenant's client never mints data-plane grants (grant.hpp), even where it was handed the file.
  Result<std::string> gk = ring->self_.role == Role::kClient ? Result<std::string>(Status(Code::kNotFound, ""))
                                                             : read_text(dir + "/grant.key");
  if (gk.is_ok()) {
    Result<std::string> raw = unhex(gk.value(), dir + "/grant.key");
    if (!raw.is_ok()) return raw.status();
    if (raw->size() != 32) return Status(Code::kInvalidArgument, dir + "/grant.key: expected 32 bytes (64 hex)");
    ring->grant_key_ = raw.value();
  }
  return std::shared_ptr<const Keyring>(std::move(ring));
}

const Identity* Keyring::find_by_key(std::string_view public_z85) const {
  auto it = by_key_.find(std::string(public_z85));
  return it == by_key_.end() ? nullptr : &roster_[it->second];
}

const Identity* Keyring::find_by_name(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &roster_[it->second];
}

Result<std::vector<Identity>> init_dir(const InitOptions& options) {
  if (options.dir.empty()) return Status(Code::kInvalidArgument, "mc-auth init: no directory given");
  if (!options.force) {
    struct stat st {};
    if (::stat((options.dir + "/roster").c_str(), &st) == 0) {
      return Status(Code::kAlreadyExists,
                    options.dir + "/roster exists: keys are made once per cluster (give --force to replace them)");
    }
  }
  for (const std::string& d : {options.dir, options.dir + "/ids"}) {
    if (::mkdir(d.c_str(), 0700) != 0 && errno != EEXIST) {
      return Status(Code::kIo, "cannot create " + d + ": " + std::strerror(errno));
    }
    // An existing directory is made private too (Keyring::load refuses one other users can write).
    if (::chmod(d.c_str(), 0700) != 0) {
      return Status(Code::kIo, "cannot chmod 700 " + d + ": " + std::strerror(errno));
    }
  }
  if (sodium_init() < 0) return Status(Code::kInternal, "libsodium failed to initialise");
  // The etcd certificates first: a bad --etcd-host is refused before any key or roster is written.
  std::vector<std::string> etcd_hosts = {"127.0.0.1", "::1", "localhost"};
  for (const std::string& h : options.etcd_hosts) {
    if (std::find(etcd_hosts.begin(), etcd_hosts.end(), h) == etcd_hosts.end()) etcd_hosts.push_back(h);
  }
  MC_RETURN_IF_ERROR(etcd::write_tls_files(options.dir + "/etcd", etcd_hosts));
  std::vector<std::pair<std::string, std::pair<Role, std::string>>> want = {
      {"admin", {Role::kAdmin, "-"}},  {"conductor", {Role::kConductor, "-"}}, {"master", {Role::kMaster, "-"}},
      {"node", {Role::kStorage, "-"}}, {"worker", {Role::kWorker, "-"}},
  };
  std::vector<std::string> tenants = options.tenants.empty() ? std::vector<std::string>{"default"} : options.tenants;
  for (const auto& t : tenants) want.push_back({t, {Role::kClient, t}});
  for (const auto& w : options.workers) want.push_back({w, {Role::kWorker, "-"}});
  for (const auto& n : options.nodes) want.push_back({n, {Role::kStorage, "-"}});
  std::string shared;
  for (const auto& s : options.shared) {
    if (!valid_name(s)) return Status(Code::kInvalidArgument, "bad shared namespace '" + s + "'");
    shared += (shared.empty() ? "" : ",") + s;
  }
  std::vector<Identity> out;
  std::unordered_map<std::string, int> seen;
  for (const auto& [name, rt] : want) {
    if (!valid_name(name)) {
      return Status(Code::kInvalidArgument, "bad identity name '" + name + "' (letters, digits, _ . -; 1-64)");
    }
    if (seen[name]++ != 0) return Status(Code::kInvalidArgument, "identity '" + name + "' given twice");
    Result<KeyPair> kp = make_key_pair();
    if (!kp.is_ok()) return kp.status();
    Identity id{name, rt.first, rt.second, kp->public_z85, {}};
    if (id.role == Role::kClient && !shared.empty()) id.shared = options.shared;
    MC_RETURN_IF_ERROR(write_text(options.dir + "/ids/" + name + ".pub", kp->public_z85, 0644));
    MC_RETURN_IF_ERROR(write_text(options.dir + "/ids/" + name + ".secret", kp->secret_z85, 0600));
    out.push_back(std::move(id));
  }
  Result<KeyPair> cluster = make_key_pair();
  if (!cluster.is_ok()) return cluster.status();
  MC_RETURN_IF_ERROR(write_text(options.dir + "/cluster.pub", cluster->public_z85, 0644));
  MC_RETURN_IF_ERROR(write_text(options.dir + "/cluster.secret", cluster->secret_z85, 0600));
  std::string grant(32, '\0');
  randombytes_buf(grant.data(), grant.size());
  MC_RETURN_IF_ERROR(write_text(options.dir + "/grant.key", hex(grant), 0600));
  std::string roster = "# mc roster: NAME ROLE TENANT PUBLIC_KEY [SHARED,...] (docs/SECURITY.md)\n";
  for (const auto& id : out) {
    roster += id.name + " " + std::string(role_name(id.role)) + " " + id.tenant + " " + id.public_key;
    if (!id.shared.empty()) roster += " " + shared;
    roster += "\n";
  }
  roster.pop_back();
  MC_RETURN_IF_ERROR(write_text(options.dir + "/roster", roster, 0644));
  return out;
}

namespace {
Status print_identities(const std::vector<Identity>& ids, bool json, std::ostream& out) {
  if (json) {
    nlohmann::json doc = nlohmann::json::array();
    for (const auto& id : ids) {
      doc.push_back({{"name", id.name},
                     {"role", std::string(role_name(id.role))},
                     {"tenant", id.tenant},
                     {"public_key", id.public_key},
                     {"shared", id.shared}});
    }
    out << nlohmann::json{{"identities", doc}}.dump(2) << "\n";
    return Status::ok();
  }
  std::vector<std::vector<std::string>> rows = {{"NAME", "ROLE", "TENANT", "PUBLIC_KEY", "SHARED"}};
  for (const auto& id : ids) {
    std::string shared;
    for (const auto& s : id.shared) shared += (shared.empty() ? "" : ",") + s;
    rows.push_back({id.name, std::string(role_name(id.role)), id.tenant, id.public_key, shared.empty() ? "-" : shared});
  }
  report::print_table(out, rows);
  return Status::ok();
}
}  // namespace

Status run_init_command(const InitOptions& options, bool json, std::ostream& out) {
  Result<std::vector<Identity>> ids = init_dir(options);
  if (!ids.is_ok()) return report::print_error(json, out, ids.status());
  return print_identities(ids.value(), json, out);
}

Status run_ls_command(const std::string& dir, bool json, std::ostream& out) {
  Result<std::vector<Identity>> ids = parse_roster(dir);
  if (!ids.is_ok()) return report::print_error(json, out, ids.status());
  return print_identities(ids.value(), json, out);
}

Status Claims::check(const Identity* caller, const std::string& name, bool bind) {
  if (caller == nullptr || caller->role == Role::kAdmin) return Status::ok();
  auto it = owners_.find(name);
  if (it == owners_.end()) {
    if (!bind) return Status::ok();
    if (owners_.size() >= max_names_) {
      return Status(Code::kResourceExhausted, what_ + " '" + name + "' from " + caller->describe() + ": " +
                                                  std::to_string(owners_.size()) + " are bound, the limit");
    }
    owners_.emplace(name, caller->name);
    return Status::ok();
  }
  if (it->second == caller->name) return Status::ok();
  return Status(Code::kPermissionDenied, what_ + " '" + name + "' from " + caller->describe() +
                                             ": it is bound to the key of '" + it->second +
                                             "' that claimed it first (give this one its own name)");
}

bool may_call(Role role, std::string_view type) { return (roles_of(type) & bit(role)) != 0; }

std::string allowed_roles(std::string_view type) {
  const uint32_t roles = roles_of(type);
  std::string out;
  for (int i = 0; i < kRoleCount; ++i) {
    if ((roles & (1u << i)) != 0) out += (out.empty() ? "" : ", ") + std::string(kRoleNames[i]);
  }
  return out;
}

Status set_process_keyring(std::shared_ptr<const Keyring> keyring) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (keyring && sodium_init() < 0) return Status(Code::kInternal, "libsodium failed to initialise");
  if (g_keyring) g_retired.push_back(g_keyring);
  g_keyring = std::move(keyring);
  g_raw.store(g_keyring.get());
  if (g_keyring && !zap_slot()) {
    try {
      zap_slot() = std::make_unique<ZapHandler>();
    } catch (const zmq::error_t& e) {
      return Status(Code::kInternal, std::string("cannot start the ZeroMQ authenticator: ") + e.what());
    }
  }
  return Status::ok();
}

std::shared_ptr<const Keyring> process_keyring() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_keyring;
}

const Keyring* keyring() { return g_raw.load(); }

void set_allow_unauthenticated(bool allow) { g_allow_unauthenticated.store(allow); }
bool allow_unauthenticated() { return g_allow_unauthenticated.load(); }

namespace {
bool loopback_host(std::string_view host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0 || host == "[::1]";
}
}  // namespace

Status check_listen_plain(std::string_view service, std::string_view host) {
  if (loopback_host(host) || g_allow_unauthenticated.load()) return Status::ok();
  return Status(Code::kFailedPrecondition, std::string(service) + ": refusing to listen on " + std::string(host) +
                                               ": this port has no authentication (keys do not cover it); listen on "
                                               "127.0.0.1, or accept the risk with --allow-unauthenticated");
}

Status check_listen(std::string_view service, std::string_view host) {
  if (keyring() != nullptr) return Status::ok();
  const bool loopback = loopback_host(host);
  if (!loopback && !g_allow_unauthenticated.load()) {
    return Status(Code::kFailedPrecondition,
                  std::string(service) + ": refusing to listen on " + std::string(host) +
                      " without authentication: give --auth-dir DIR (keys from `mc-auth init DIR`), listen on "
                      "127.0.0.1, or accept the risk with --allow-unauthenticated");
  }
  if (!g_warned.exchange(true)) {
    MC_LOG_WARN << service << " runs unauthenticated (no --auth-dir): any local process may call it"
                << (loopback ? "" : ", and any host that reaches it");
  }
  return Status::ok();
}

uint64_t zap_refused() { return g_zap_refused.load(); }

}  // namespace mc::auth
