// Who may talk to whom (docs/SECURITY.md): a cluster's keys, its roster of identities, the role policy of every
// message, and the process-wide key ring that the transports (rpc.hpp, fast_rpc.hpp) read.
//
// Keys are CURVE (Curve25519) key pairs in ZeroMQ's Z85 text (40 characters, zmq_curve_keypair), made by
// `mc-auth init DIR` (init_dir below). The directory:
//   DIR/cluster.pub, DIR/cluster.secret   the key pair every mc daemon serves with (its CURVE server key)
//   DIR/grant.key                          32 random bytes (hex): the MAC key of data-plane grants
//   DIR/ids/NAME.pub, DIR/ids/NAME.secret  one key pair per identity (a role, an instance, a tenant's client)
//   DIR/roster                             one identity per line: "NAME ROLE TENANT PUBLIC_KEY [SHARED,...]"
// Secrets are written 0600. A deployment copies to each host the roster, cluster.pub, the host's own ids/ files,
// and cluster.secret and grant.key only to daemons (never to a tenant's client).
//
// A caller is known by the public key it proves it holds (CURVE on ZeroMQ, the fast path's handshake); the roster
// maps that key to an Identity: its name, role and tenant. The server then admits a message only when the role
// may call it (may_call), and handlers scope what the call touches by the identity (tenants, bound instance ids).
//
// Without a key ring (no --auth-dir) a daemon runs unauthenticated, as before, but listens only on loopback
// unless told otherwise (check_listen), and says so once.
//
// Thread-safety: a Keyring is immutable once loaded and shared read-only (shared_ptr<const Keyring>); the process
// key ring is set once by main before any socket opens (set_process_keyring) and read from any thread after.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "mc/common/status.hpp"

namespace mc::auth {

// What an identity is for (docs/SECURITY.md "Roles"). kAdmin may call everything.
enum class Role : uint8_t { kClient, kStorage, kWorker, kConductor, kMaster, kAdmin };
inline constexpr int kRoleCount = 6;
std::string_view role_name(Role role);  // "client", "storage", "worker", "conductor", "master", "admin"
// kInvalidArgument naming the word and the roles for anything else.
Result<Role> parse_role(std::string_view name);

// A roster name, tenant or shared namespace: [A-Za-z0-9_.-]{1,64}.
bool valid_name(std::string_view s);

struct Identity {
  std::string name;                 // [A-Za-z0-9_.-]{1,64}, unique in the roster
  Role role = Role::kClient;        //
  std::string tenant;               // a client's tenant; "-" for the other roles
  std::string public_key;           // Z85, 40 characters
  std::vector<std::string> shared;  // shared key namespaces this tenant opted into (e.g. "public")
  std::string describe() const;     // "alice (client, tenant alice)"
};

struct KeyPair {
  std::string public_z85, secret_z85;
};
// A fresh CURVE key pair (zmq_curve_keypair; kInternal when libzmq has no CURVE).
Result<KeyPair> make_key_pair();
// The 32 raw bytes of a Z85 key; kInvalidArgument naming `what` unless it is 40 valid Z85 characters.
Result<std::string> decode_key(std::string_view z85, std::string_view what);

class Keyring {
 public:
  // Loads DIR as the identity `name` (its ids/NAME.secret must match its roster key). kNotFound naming the file
  // and the remedy (mc-auth init) for a missing one; kInvalidArgument naming the file and line for a bad one.
  static Result<std::shared_ptr<const Keyring>> load(const std::string& dir, const std::string& name);

  const std::string& dir() const { return dir_; }
  const Identity& self() const { return self_; }
  const KeyPair& self_keys() const { return self_keys_; }
  const std::string& cluster_public() const { return cluster_public_; }
  // Empty when this host was not given DIR/cluster.secret (a tenant's client): it cannot serve with the cluster key.
  const std::string& cluster_secret() const { return cluster_secret_; }
  // 32 raw bytes (grant.hpp); empty when DIR/grant.key is absent or this identity is a client (role kClient).
  const std::string& grant_key() const { return grant_key_; }
  // The roster's identity with this Z85 public key / name; nullptr when none.
  const Identity* find_by_key(std::string_view public_z85) const;
  const Identity* find_by_name(std::string_view name) const;
  size_t size() const { return by_name_.size(); }
  const std::vector<Identity>& identities() const { return roster_; }

 private:
  std::string dir_;
  Identity self_;
  KeyPair self_keys_;
  std::string cluster_public_, cluster_secret_, grant_key_;
  std::vector<Identity> roster_;
  std::unordered_map<std::string, size_t> by_name_, by_key_;
};

// ---- mc-auth init ----
struct InitOptions {
  std::string dir;
  std::vector<std::string> tenants;  // one client identity each, named after its tenant (default: "default")
  std::vector<std::string> workers;  // one worker identity per prefill/decode instance id
  std::vector<std::string> nodes;    // one storage identity per storage node
  std::vector<std::string> shared;   // shared namespaces every tenant made here opts into
  bool force = false;                // overwrite an existing roster
  // etcd's server certificate names these hosts besides 127.0.0.1, ::1 and localhost (--etcd-host: the addresses
  // or DNS names the members' client URLs use)
  std::vector<std::string> etcd_hosts{};
};
// Writes DIR as above, with the identities "admin", "conductor", "master", "node" (storage), "worker", one client
// per tenant, and one per --worker / --node name, and DIR/etcd: the cluster's etcd certificates
// (etcd::write_tls_files; a process given --auth-dir DIR reaches etcd over TLS with them). Returns the identities
// written. kAlreadyExists when DIR/roster exists (unless force); kInvalidArgument for a bad --etcd-host; kIo naming
// the path and strerror.
Result<std::vector<Identity>> init_dir(const InitOptions& options);

// `mc-auth init`: init_dir, then the identities written as a table (NAME ROLE TENANT PUBLIC_KEY) or JSON on `out`.
Status run_init_command(const InitOptions& options, bool json, std::ostream& out);
// `mc-auth ls DIR`: the roster of DIR as the same table or JSON (reads DIR/roster only; no secret is needed).
Status run_ls_command(const std::string& dir, bool json, std::ostream& out);

// ---- The policy: which roles may call which message (docs/SECURITY.md "What each role may call") ----
// True when `role` may send a request of `type` to a server (kAdmin: every type). Unknown types: admin only.
bool may_call(Role role, std::string_view type);
// The roles that may call `type`, as "client, worker" (for refusal messages).
std::string allowed_roles(std::string_view type);

// First-claim bindings (docs/SECURITY.md "Trusted registration"): a name (an instance id, a storage node id, a
// segment) belongs to the identity that first claimed it, for the owner's process life; a claim or use under it by
// any other identity is refused. A daemon keeps one per kind of name; not thread-safe (the serving thread's).
class Claims {
 public:
  // `what` names the kind in messages ("instance id", "segment"). At most `max_names` names are bound.
  Claims(std::string what, size_t max_names) : what_(std::move(what)), max_names_(max_names) {}
  // Ok when `caller` is nullptr (no key ring), an admin, or the owner of `name`; when `name` is unbound, binds it to
  // `caller` if `bind` (else ok: the caller's handler answers as for any unknown name). kPermissionDenied naming the
  // caller, the name and its owner otherwise; kResourceExhausted when max_names are bound.
  Status check(const Identity* caller, const std::string& name, bool bind);
  size_t size() const { return owners_.size(); }

 private:
  std::string what_;
  size_t max_names_;
  std::unordered_map<std::string, std::string> owners_;  // name -> owner's roster name
};

// ---- The process ----
// Sets the key ring every socket of this process uses (nullptr: unauthenticated). Call once from main, before any
// socket opens. Starts the ZAP handler (the ZeroMQ authenticator thread that maps a CURVE key to its identity).
Status set_process_keyring(std::shared_ptr<const Keyring> keyring);
std::shared_ptr<const Keyring> process_keyring();
const Keyring* keyring();  // process_keyring().get()
// Lets an unauthenticated process listen on a non-loopback address (--allow-unauthenticated).
void set_allow_unauthenticated(bool allow);
bool allow_unauthenticated();
// The rule for a port that carries no authentication even with a key ring (HTTP: mc-gateway, /metrics): loopback
// only (127.0.0.0/8, ::1, localhost) unless --allow-unauthenticated; kFailedPrecondition naming the service, the
// host and the remedy otherwise.
Status check_listen_plain(std::string_view service, std::string_view host);

// Whether `service` may listen on `host` (an endpoint's host: "127.0.0.1", "*", "10.0.0.2"): always with a key
// ring; without one only loopback (127.0.0.0/8, ::1, localhost), unless set_allow_unauthenticated(true).
// kFailedPrecondition naming the service, the host and both remedies otherwise. Without a key ring it logs once per
// process that the daemon runs unauthenticated.
Status check_listen(std::string_view service, std::string_view host);

// Refusals by the ZAP handler (CURVE keys not in the roster), for stat counters.
uint64_t zap_refused();

}  // namespace mc::auth
