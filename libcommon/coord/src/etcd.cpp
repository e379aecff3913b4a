#include "mc/coord/etcd.hpp"

#include <curl/curl.h>
#include <sodium.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>
#include <utility>

#include <nlohmann/json.hpp>

#include "mc/common/endpoint.hpp"
#include "mc/common/log.hpp"

namespace mc::etcd {
namespace {

using json = nlohmann::json;

constexpr std::string_view kRemedy = "is etcd running? (--etcd / MC_ETCD)";

// ---- bytes <-> base64 (etcd's JSON carries keys and values as standard, padded base64) ----

std::string b64(std::string_view bytes) {
  std::string out(sodium_base64_ENCODED_LEN(bytes.size(), sodium_base64_VARIANT_ORIGINAL), '\0');
  sodium_bin2base64(out.data(), out.size(), reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(),
                    sodium_base64_VARIANT_ORIGINAL);
  out.resize(out.size() - 1);  // the terminating NUL
  return out;
}

bool unb64(std::string_view text, std::string* out) {
  out->assign(text.size() / 4 * 3 + 3, '\0');
  size_t len = 0;
  const char* end = nullptr;
  if (sodium_base642bin(reinterpret_cast<unsigned char*>(out->data()), out->size(), text.data(), text.size(), nullptr,
                        &len, &end, sodium_base64_VARIANT_ORIGINAL) != 0 ||
      end != text.data() + text.size()) {
    return false;
  }
  out->resize(len);
  return true;
}

// A key for messages: printable bytes as they are, others as \xNN, at most 80 bytes shown.
std::string shown(std::string_view key) {
  std::string out = "\"";
  const size_t n = std::min<size_t>(key.size(), 80);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (key.size() > n) out += "...";
  return out + "\"";
}

std::string shown_range(std::string_view key, std::string_view range_end) {
  if (range_end.empty()) return "key " + shown(key);
  return "keys [" + shown(key) + ", " + shown(range_end) + ")";
}

// etcd refuses an empty key; a range from the very first key starts at "\0".
std::string range_key(const std::string& key, const std::string& range_end) {
  if (key.empty() && !range_end.empty()) return std::string(1, '\0');
  return key;
}

// ---- proto3 JSON readers: int64 as strings, absent fields 0 / false / empty; never throw ----

int64_t i64(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const auto& s = it->get_ref<const std::string&>();
    int64_t v = 0;
    std::from_chars(s.data(), s.data() + s.size(), v);
    return v;
  }
  return 0;
}

bool flag(const json& obj, const char* name) {
  auto it = obj.find(name);
  return it != obj.end() && it->is_boolean() && it->get<bool>();
}

std::string str(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || !it->is_string()) return "";
  return it->get_ref<const std::string&>();
}

const json& member(const json& obj, const char* name) {
  static const json kEmpty = json::object();
  auto it = obj.find(name);
  return it == obj.end() ? kEmpty : *it;
}

int64_t header_revision(const json& reply) { return i64(member(reply, "header"), "revision"); }

bool parse_kv(const json& j, KeyValue* kv) {
  if (!unb64(str(j, "key"), &kv->key) || !unb64(str(j, "value"), &kv->value)) return false;
  kv->create_revision = i64(j, "create_revision");
  kv->mod_revision = i64(j, "mod_revision");
  kv->version = i64(j, "version");
  kv->lease = i64(j, "lease");
  return true;
}

bool parse_range(const json& j, RangeResult* r) {
  r->revision = header_revision(j);
  r->more = flag(j, "more");
  r->count = i64(j, "count");
  const json& kvs = member(j, "kvs");
  if (!kvs.is_array()) return kvs.is_object() && kvs.empty();
  r->kvs.reserve(kvs.size());
  for (const json& e : kvs) {
    KeyValue kv;
    if (!parse_kv(e, &kv)) return false;
    r->kvs.push_back(std::move(kv));
  }
  return true;
}

// etcd's gRPC status codes (google.golang.org/grpc/codes) as mc codes.
Code code_of_grpc(int64_t grpc) {
  switch (grpc) {
    case 1:
      return Code::kCancelled;
    case 3:
      return Code::kInvalidArgument;
    case 4:
      return Code::kTimeout;
    case 5:
      return Code::kNotFound;
    case 6:
      return Code::kAlreadyExists;
    case 7:
    case 16:
      return Code::kPermissionDenied;
    case 8:
      return Code::kResourceExhausted;
    case 9:
      return Code::kFailedPrecondition;
    case 10:
      return Code::kAborted;
    case 11:
      return Code::kOutOfRange;
    case 12:
      return Code::kUnimplemented;
    default:
      return Code::kUnavailable;
  }
}

std::string_view remedy_of(Code code) {
  switch (code) {
    case Code::kUnavailable:
    case Code::kTimeout:
      return "etcd has no leader or is overloaded: retry later";
    case Code::kResourceExhausted:
      return "etcd's backend quota is full: compact and defragment it (etcdctl compact / defrag / alarm disarm)";
    case Code::kOutOfRange:
      return "that revision is compacted or in the future: read again at the current revision";
    default:
      return "";
  }
}

// An etcd error reply (unary: {"error": "...", "message", "code"}; streaming: {"error": {"grpc_code", "message"}})
// as a Status; ok when `reply` is not an error.
Status etcd_error(const json& reply, const std::string& endpoint, const std::string& what) {
  auto it = reply.find("error");
  if (it == reply.end() || reply.contains("header") || reply.contains("result")) return Status::ok();
  std::string message;
  int64_t grpc = 2;
  if (it->is_object()) {
    message = str(*it, "message");
    grpc = i64(*it, "grpc_code");
  } else {
    message = str(reply, "message");
    if (message.empty()) message = it->is_string() ? it->get_ref<const std::string&>() : it->dump();
    grpc = i64(reply, "code");
  }
  const Code code = code_of_grpc(grpc);
  std::string text = "etcd " + endpoint + ": " + what + ": " + message;
  if (const std::string_view r = remedy_of(code); !r.empty()) text.append(" (").append(r).append(")");
  return Status(code, std::move(text));
}

// ---- libcurl ----

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    // base64 needs no initialisation, but libsodium asks for it before any use; its failure leaves base64 working.
    if (sodium_init() < 0) MC_LOG_WARN << "etcd: libsodium failed to initialise";
  });
}

struct Body {
  std::string data;
  bool too_large = false;
};

size_t write_body(char* ptr, size_t size, size_t nmemb, void* user) {
  auto* b = static_cast<Body*>(user);
  const size_t n = size * nmemb;
  if (b->data.size() + n > kMaxResponseBytes) {
    b->too_large = true;
    return 0;  // aborts the transfer (CURLE_WRITE_ERROR)
  }
  b->data.append(ptr, n);
  return n;
}

struct CurlList {
  curl_slist* list = nullptr;
  CurlList() {
    list = curl_slist_append(list, "Content-Type: application/json");
    list = curl_slist_append(list, "Expect:");  // no 100-continue round trip for large bodies
  }
  ~CurlList() { curl_slist_free_all(list); }
  CurlList(const CurlList&) = delete;
  CurlList& operator=(const CurlList&) = delete;
};

const curl_slist* json_headers() {
  static const CurlList headers;
  return headers.list;
}

// Options shared by unary calls and watches: a POST of `body` (which must outlive the transfer) to `url`.
void set_common(CURL* h, const std::string& url, const std::string& body, const Options& options, char* errbuf) {
  const int64_t timeout_ms = options.timeout_ms;
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  if (options.tls.enabled()) {
    // HTTPS only: the server's certificate chains to the cluster's CA and names the endpoint's host; this process
    // presents its client certificate.
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "https");
    curl_easy_setopt(h, CURLOPT_CAINFO, options.tls.ca_file.c_str());
    curl_easy_setopt(h, CURLOPT_CAPATH, nullptr);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
    curl_easy_setopt(h, CURLOPT_SSLVERSION, static_cast<long>(CURL_SSLVERSION_TLSv1_2));
    // No client certificate when none is named (a test's anonymous client), not an empty path curl would fail on.
    curl_easy_setopt(h, CURLOPT_SSLCERT, options.tls.cert_file.empty() ? nullptr : options.tls.cert_file.c_str());
    curl_easy_setopt(h, CURLOPT_SSLCERTTYPE, "PEM");
    curl_easy_setopt(h, CURLOPT_SSLKEY, options.tls.key_file.empty() ? nullptr : options.tls.key_file.c_str());
    curl_easy_setopt(h, CURLOPT_SSLKEYTYPE, "PEM");
  } else {
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http");
  }
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_POST, 1L);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, json_headers());
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(std::max<int64_t>(timeout_ms, 1)));
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 2L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 1L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  errbuf[0] = '\0';
}

// curl's text for a failed transfer; with TLS, what to check for the failures TLS causes (a refused handshake
// shows as a receive error under TLS 1.3, where the server checks the client certificate after the handshake).
std::string curl_text(CURLcode code, const char* errbuf, bool tls) {
  std::string text = errbuf[0] != '\0' ? std::string(errbuf) + " (" + curl_easy_strerror(code) + ")"
                                       : std::string(curl_easy_strerror(code));
  if (!tls) return text;
  switch (code) {
    case CURLE_PEER_FAILED_VERIFICATION:
      text +=
          "; TLS to etcd failed: etcd's certificate is not one of the CA of the cluster's keys, or does not name "
          "this endpoint's address (mc-auth init --etcd-host ADDR names more; docs/SECURITY.md \"etcd\")";
      break;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CLIENTCERT:
    case CURLE_RECV_ERROR:
    case CURLE_SSL_ENGINE_NOTFOUND:
    case CURLE_SSL_ENGINE_SETFAILED:
      text +=
          "; TLS to etcd failed: was etcd started with the server certificate and CA of the same cluster's keys "
          "(--cert-file, --trusted-ca-file), and can this process read the etcd/ files of its --auth-dir "
          "(docs/SECURITY.md \"etcd\")?";
      break;
    default:
      break;
  }
  return text;
}

// "http[s]://HOST:PORT" from an entry of Options::endpoints ("HOST:PORT" or with a scheme, maybe with a '/').
std::string base_url(std::string e, const TlsFiles& tls) {
  while (!e.empty() && e.back() == '/') e.pop_back();
  if (e.find("://") == std::string::npos) e = (tls.enabled() ? "https://" : "http://") + e;
  return e;
}

// The endpoint as shown in messages (without the scheme).
std::string shown_endpoint(std::string_view url) {
  const size_t p = url.find("://");
  return std::string(p == std::string_view::npos ? url : url.substr(p + 3));
}

json op_json(const Op& op) {
  const std::string key = op.kind == Op::Kind::kPut ? op.key : range_key(op.key, op.range_end);
  json body = {{"key", b64(key)}};
  switch (op.kind) {
    case Op::Kind::kPut:
      body["value"] = b64(op.value);
      if (op.lease != 0) body["lease"] = std::to_string(op.lease);
      return {{"request_put", std::move(body)}};
    case Op::Kind::kDelete:
      if (!op.range_end.empty()) body["range_end"] = b64(op.range_end);
      return {{"request_delete_range", std::move(body)}};
    case Op::Kind::kRange:
      if (!op.range_end.empty()) body["range_end"] = b64(op.range_end);
      return {{"request_range", std::move(body)}};
  }
  return json::object();
}

json compare_json(const Compare& c) {
  static constexpr const char* kTargets[] = {"VERSION", "CREATE", "MOD", "VALUE", "LEASE"};
  static constexpr const char* kResults[] = {"EQUAL", "GREATER", "LESS", "NOT_EQUAL"};
  json j = {{"key", b64(c.key)},
            {"target", kTargets[static_cast<int>(c.target)]},
            {"result", kResults[static_cast<int>(c.result)]}};
  switch (c.target) {
    case Compare::Target::kVersion:
      j["version"] = std::to_string(c.number);
      break;
    case Compare::Target::kCreateRevision:
      j["create_revision"] = std::to_string(c.number);
      break;
    case Compare::Target::kModRevision:
      j["mod_revision"] = std::to_string(c.number);
      break;
    case Compare::Target::kValue:
      j["value"] = b64(c.value);
      break;
    case Compare::Target::kLease:
      j["lease"] = std::to_string(c.number);
      break;
  }
  return j;
}

Status malformed(const std::string& what, std::string_view detail) {
  return Status(Code::kMalformedMessage, "etcd: " + what + ": unexpected reply (" + std::string(detail) +
                                             "): is this an etcd 3.4+ client URL? Please report if it is");
}

}  // namespace

// ---- free functions and Op ----

Op Op::put(std::string key, std::string value, int64_t lease) {
  Op op;
  op.kind = Kind::kPut;
  op.key = std::move(key);
  op.value = std::move(value);
  op.lease = lease;
  return op;
}

Op Op::del(std::string key, std::string range_end) {
  Op op;
  op.kind = Kind::kDelete;
  op.key = std::move(key);
  op.range_end = std::move(range_end);
  return op;
}

Op Op::get(std::string key, std::string range_end) {
  Op op;
  op.kind = Kind::kRange;
  op.key = std::move(key);
  op.range_end = std::move(range_end);
  return op;
}

Result<Options> parse_endpoints(std::string_view list) {
  Options o;
  o.tls = default_tls();
  const std::string whole(list);
  auto bad = [&](std::string_view entry, const std::string& why) {
    return Status(Code::kInvalidArgument, "etcd endpoints \"" + whole + "\": entry \"" + std::string(entry) +
                                              "\": " + why +
                                              " (expected HOST:PORT[,HOST:PORT...], e.g. "
                                              "127.0.0.1:2379,127.0.0.1:22379)");
  };
  size_t pos = 0;
  for (;;) {
    const size_t comma = list.find(',', pos);
    std::string_view entry = list.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    while (!entry.empty() && (entry.front() == ' ' || entry.front() == '\t')) entry.remove_prefix(1);
    while (!entry.empty() && (entry.back() == ' ' || entry.back() == '\t' || entry.back() == '/')) {
      entry.remove_suffix(1);
    }
    if (entry.empty()) return bad(entry, "empty entry");
    std::string_view rest = entry;
    if (rest.substr(0, 8) == "https://") {
      if (!o.tls.enabled()) {
        return bad(entry,
                   "https:// (TLS) needs the etcd certificates of the cluster's keys (--auth-dir DIR with DIR/etcd "
                   "from mc-auth init; docs/SECURITY.md \"etcd\")");
      }
      rest.remove_prefix(8);
    } else if (rest.substr(0, 7) == "http://") {
      if (o.tls.enabled()) {
        return bad(entry, "the cluster's keys hold etcd certificates (" + o.tls.ca_file +
                              "), so etcd is reached over https://: start etcd with them (docs/SECURITY.md \"etcd\")");
      }
      rest.remove_prefix(7);
    } else if (rest.find("://") != std::string_view::npos) {
      return bad(entry, "only http:// and https:// are supported");
    }
    auto ep = parse_tcp_endpoint(rest);
    if (!ep) return bad(entry, ep.status().message());
    if (ep->port == 0) return bad(entry, "port 0 is not an etcd client port");
    if (ep->host == "*") return bad(entry, "'*' is not an address to connect to");
    o.endpoints.push_back((o.tls.enabled() ? "https://" : "http://") + ep->host_port());
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return o;
}

std::string prefix_end(std::string_view prefix) {
  std::string end(prefix);
  for (size_t i = end.size(); i-- > 0;) {
    if (static_cast<unsigned char>(end[i]) < 0xff) {
      end[i] = static_cast<char>(static_cast<unsigned char>(end[i]) + 1);
      end.resize(i + 1);
      return end;
    }
  }
  return std::string(1, '\0');
}

// ---- Client ----

struct Client::Impl {
  Options options;
  std::vector<std::string> urls;  // "http://HOST:PORT", one per endpoint
  std::atomic<size_t> preferred{0};
  std::mutex mu;
  std::vector<CURL*> idle;  // handles keep their connections between calls

  explicit Impl(Options o) : options(std::move(o)) {
    global_init();
    for (const auto& e : options.endpoints) urls.push_back(base_url(e, options.tls));
  }
  ~Impl() {
    for (CURL* h : idle) curl_easy_cleanup(h);
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  CURL* take() {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!idle.empty()) {
        CURL* h = idle.back();
        idle.pop_back();
        return h;
      }
    }
    return curl_easy_init();
  }
  void give(CURL* h) {
    curl_easy_reset(h);
    std::lock_guard<std::mutex> lock(mu);
    if (idle.size() < 8) {
      idle.push_back(h);
      return;
    }
    curl_easy_cleanup(h);
  }

  // One POST of `body` to every endpoint in turn (from the preferred one) until one answers; the answer parsed as
  // JSON, or the Status. `write`: a request that changes state (not retried elsewhere once it may have been sent).
  Result<json> call(const char* path, const json& request, bool write, const std::string& what) {
    if (urls.empty()) {
      return Status(Code::kInvalidArgument, "etcd: " + what + ": no etcd endpoints configured (--etcd / MC_ETCD)");
    }
    std::string body;
    try {
      body = request.dump();
    } catch (const std::exception& e) {
      return Status(Code::kInternal, "etcd: " + what + ": cannot encode the request: " + e.what());
    }
    const size_t n = urls.size();
    const size_t first = preferred.load(std::memory_order_relaxed) % n;
    std::string failures;
    std::string last_error;
    for (size_t i = 0; i < n; ++i) {
      const size_t idx = (first + i) % n;
      const std::string& url = urls[idx];
      const std::string ep = shown_endpoint(url);
      CURL* h = take();
      if (h == nullptr) return Status(Code::kResourceExhausted, "etcd: " + what + ": curl_easy_init failed");
      Body reply;
      char errbuf[CURL_ERROR_SIZE];
      const std::string full = url + path;
      set_common(h, full, body, options, errbuf);
      curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(std::max<int64_t>(options.timeout_ms, 1)));
      curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_body);
      curl_easy_setopt(h, CURLOPT_WRITEDATA, &reply);
      const CURLcode rc = curl_easy_perform(h);
      long http = 0;
      long sent_bytes = 0;
      curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &http);
      curl_easy_getinfo(h, CURLINFO_REQUEST_SIZE, &sent_bytes);
      const std::string error = rc == CURLE_OK ? "" : curl_text(rc, errbuf, options.tls.enabled());
      give(h);
      if (reply.too_large) {
        return Status(Code::kMessageTooLarge, "etcd " + ep + ": " + what + ": reply over " +
                                                  std::to_string(kMaxResponseBytes >> 20) +
                                                  " MiB: ask for fewer keys at once (a limit or a narrower range)");
      }
      if (rc == CURLE_OK) {
        preferred.store(idx, std::memory_order_relaxed);
        return parse_reply(ep, http, reply.data, what);
      }
      last_error = error;
      failures += (failures.empty() ? "" : "; ") + ep + ": " + error;
      const bool never_sent = rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
                              rc == CURLE_COULDNT_RESOLVE_PROXY || sent_bytes == 0;
      if (write && !never_sent) {
        return Status(Code::kUnavailable, "etcd " + ep + ": " + what + ": " + error +
                                              " after the request was sent: it may or may not have been applied; "
                                              "read the key again before repeating it (" +
                                              std::string(kRemedy) + ")");
      }
      MC_LOG_DEBUG << "etcd " << ep << ": " << what << ": " << error << "; trying the next endpoint";
    }
    return Status(Code::kUnavailable,
                  "etcd: " + what + ": no endpoint answered (" + failures + "): " + std::string(kRemedy));
  }

  static Result<json> parse_reply(const std::string& ep, long http, const std::string& data, const std::string& what) {
    // A streaming endpoint (lease keepalive) may send several lines: the first one is the answer.
    const size_t nl = data.find('\n');
    const std::string_view first =
        nl == std::string::npos ? std::string_view(data) : std::string_view(data).substr(0, nl);
    json j = json::parse(first, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      const std::string head(first.substr(0, 200));
      return Status(Code::kProtocolMismatch, "etcd " + ep + ": " + what + ": HTTP " + std::to_string(http) +
                                                 " with a reply that is not etcd's JSON (\"" + head + "\"): is " + ep +
                                                 " an etcd 3.4+ client URL?");
    }
    MC_RETURN_IF_ERROR(etcd_error(j, ep, what));
    if (http != 200) {
      return Status(Code::kProtocolMismatch, "etcd " + ep + ": " + what + ": HTTP " + std::to_string(http) + " (\"" +
                                                 std::string(first.substr(0, 200)) + "\"): is " + ep +
                                                 " an etcd 3.4+ client URL?");
    }
    return j;
  }

  // Runs `fn(reply)` (the parsing) without letting an exception out of the library.
  template <typename T, typename Fn>
  static Result<T> parsed(const std::string& what, Fn&& fn) {
    try {
      return fn();
    } catch (const std::exception& e) {
      return Status(Code::kMalformedMessage, "etcd: " + what + ": unexpected reply: " + e.what());
    }
  }
};

Client::Client(Options options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Client::~Client() = default;

const Options& Client::options() const { return impl_->options; }

Result<RangeResult> Client::range(const std::string& key, const std::string& range_end, int64_t revision,
                                  int64_t limit) {
  const std::string what = "range " + shown_range(key, range_end);
  json req = {{"key", b64(range_key(key, range_end))}};
  if (!range_end.empty()) req["range_end"] = b64(range_end);
  if (revision != 0) req["revision"] = std::to_string(revision);
  if (limit != 0) req["limit"] = std::to_string(limit);
  MC_ASSIGN_OR_RETURN(json reply, impl_->call("/v3/kv/range", req, false, what));
  return Impl::parsed<RangeResult>(what, [&]() -> Result<RangeResult> {
    RangeResult r;
    if (!parse_range(reply, &r)) return malformed(what, "bad kvs");
    return r;
  });
}

Result<int64_t> Client::put(const std::string& key, const std::string& value, int64_t lease) {
  const std::string what = "put key " + shown(key);
  json req = {{"key", b64(key)}, {"value", b64(value)}};
  if (lease != 0) req["lease"] = std::to_string(lease);
  MC_ASSIGN_OR_RETURN(json reply, impl_->call("/v3/kv/put", req, true, what));
  return header_revision(reply);
}

Result<int64_t> Client::del(const std::string& key, const std::string& range_end) {
  const std::string what = "delete " + shown_range(key, range_end);
  json req = {{"key", b64(range_key(key, range_end))}};
  if (!range_end.empty()) req["range_end"] = b64(range_end);
  MC_ASSIGN_OR_RETURN(json reply, impl_->call("/v3/kv/deleterange", req, true, what));
  return header_revision(reply);
}

Result<TxnResult> Client::txn(const std::vector<Compare>& compare, const std::vector<Op>& success,
                              const std::vector<Op>& failure) {
  std::string what = "txn";
  if (!compare.empty()) what += " on key " + shown(compare.front().key);
  json req = json::object();
  json& cmp = req["compare"] = json::array();
  for (const Compare& c : compare) cmp.push_back(compare_json(c));
  json& ok = req["success"] = json::array();
  for (const Op& op : success) ok.push_back(op_json(op));
  json& ko = req["failure"] = json::array();
  for (const Op& op : failure) ko.push_back(op_json(op));
  MC_ASSIGN_OR_RETURN(json reply, impl_->call("/v3/kv/txn", req, true, what));
  return Impl::parsed<TxnResult>(what, [&]() -> Result<TxnResult> {
    TxnResult t;
    t.succeeded = flag(reply, "succeeded");
    t.revision = header_revision(reply);
    const json& responses = member(reply, "responses");
    if (!responses.is_array()) return t;
    for (const json& r : responses) {
      auto it = r.find("response_range");
      if (it == r.end()) continue;
      RangeResult rr;
      if (!parse_range(*it, &rr)) return malformed(what, "bad kvs in response_range");
      t.ranges.push_back(std::move(rr));
    }
    return t;
  });
}

Result<int64_t> Client::lease_grant(int64_t ttl_s) {
  const std::string what = "grant a lease of " + std::to_string(ttl_s) + " s";
  MC_ASSIGN_OR_RETURN(json reply, impl_->call("/v3/lease/grant", json{{"TTL", std::to_string(ttl_s)}}, true, what));
  const int64_t id = i64(reply, "ID");
  if (id == 0) {
    std::string err = str(reply, "error");
    return Status(Code::kUnavailable, "etcd: " + what + ": no lease granted" + (err.empty() ? "" : ": " + err));
  }
  return id;
}

Result<int64_t> Client::lease_keepalive(int64_t lease) {
  const std::string what = "keep lease " + std::to_string(lease) + " alive";
  MC_ASSIGN_OR_RETURN(json reply, impl_->call("/v3/lease/keepalive", json{{"ID", std::to_string(lease)}}, false, what));
  const int64_t ttl = i64(member(reply, "result"), "TTL");
  if (ttl <= 0) {
    return Status(
        Code::kNotFound,
        "etcd: " + what + ": the lease is gone (expired or revoked): grant a new one and write its keys again");
  }
  return ttl;
}

Status Client::lease_revoke(int64_t lease) {
  const std::string what = "revoke lease " + std::to_string(lease);
  auto reply = impl_->call("/v3/lease/revoke", json{{"ID", std::to_string(lease)}}, true, what);
  return reply.status();
}

Status Client::compact(int64_t revision) {
  const std::string what = "compact at revision " + std::to_string(revision);
  auto reply = impl_->call("/v3/kv/compaction", json{{"revision", std::to_string(revision)}}, true, what);
  return reply.status();
}

// ---- Watch ----

struct Watch::State {
  Options options;
  std::vector<std::string> urls;
  std::string key, range_end;
  int64_t next_revision = 0;  // where a (re)connection starts; 0: now (nothing created yet)
  EventsFn on_events;
  ErrorFn on_error;
  std::string what;
  std::atomic<bool> stopping{false};
  std::atomic<bool> running{true};
  std::mutex mu;
  std::condition_variable cv;
  std::mutex join_mu;  // stop() from two threads at once joins once
  CURLM* multi = nullptr;

  // One connection's stream.
  std::string buffer;
  bool created = false;
  Status fatal;         // set by the stream: the watch ends with on_error(fatal)
  std::string dropped;  // why the stream was given up (a reconnect follows)

  ~State() {
    if (multi != nullptr) curl_multi_cleanup(multi);
  }

  void sleep_ms(int64_t ms) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::milliseconds(ms), [&] { return stopping.load(); });
  }

  // One complete line of the stream. False: abort this connection (fatal or dropped says why).
  bool on_line(std::string_view line, const std::string& ep) {
    if (line.empty()) return true;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      dropped = "a line that is not JSON (\"" + std::string(line.substr(0, 200)) + "\")";
      return false;
    }
    if (Status s = etcd_error(j, ep, what); !s.is_ok()) {
      dropped = s.message();
      return false;
    }
    const json& r = member(j, "result");
    if (flag(r, "canceled")) {
      const int64_t compacted = i64(r, "compact_revision");
      if (compacted > 0) {
        fatal = Status(Code::kDataLoss, "etcd " + ep + ": " + what + " from revision " + std::to_string(next_revision) +
                                            ": history compacted at revision " + std::to_string(compacted) +
                                            ": reload with a range and start a new watch from its revision + 1");
      } else {
        std::string reason = str(r, "cancel_reason");
        fatal = Status(Code::kFailedPrecondition, "etcd " + ep + ": " + what + " was cancelled by etcd" +
                                                      (reason.empty() ? "" : ": " + reason) +
                                                      ": reload with a range and start a new watch");
      }
      return false;
    }
    const int64_t revision = header_revision(r);
    if (flag(r, "created")) {
      created = true;
      if (next_revision == 0) next_revision = revision + 1;
    }
    const json& events = member(r, "events");
    if (!events.is_array() || events.empty()) return true;
    std::vector<WatchEvent> batch;
    batch.reserve(events.size());
    for (const json& e : events) {
      WatchEvent ev;
      ev.type = str(e, "type") == "DELETE" ? WatchEvent::Type::kDelete : WatchEvent::Type::kPut;
      if (!parse_kv(member(e, "kv"), &ev.kv)) {
        dropped = "an event with bad base64";
        return false;
      }
      // A reconnection starts at next_revision, so nothing before it can come again; skip it if it does.
      if (ev.kv.mod_revision < next_revision) continue;
      batch.push_back(std::move(ev));
    }
    if (batch.empty()) return true;
    next_revision = batch.back().kv.mod_revision + 1;
    if (on_events) on_events(batch, revision);
    return !stopping.load();
  }

  static size_t write_stream(char* ptr, size_t size, size_t nmemb, void* user) {
    auto* p = static_cast<std::pair<State*, const std::string*>*>(user);
    State* s = p->first;
    const size_t n = size * nmemb;
    s->buffer.append(ptr, n);
    size_t nl;
    while ((nl = s->buffer.find('\n')) != std::string::npos) {
      std::string line = s->buffer.substr(0, nl);
      s->buffer.erase(0, nl + 1);
      if (!s->on_line(line, *p->second)) return 0;
    }
    if (s->buffer.size() > kMaxResponseBytes) {
      s->dropped = "a message over " + std::to_string(kMaxResponseBytes >> 20) + " MiB";
      return 0;
    }
    return n;
  }

  // One connection to `url`, until it ends, fails, is given up or the watch stops.
  void stream(const std::string& url) {
    buffer.clear();
    created = false;
    dropped.clear();
    const std::string ep = shown_endpoint(url);
    json create = {{"key", b64(range_key(key, range_end))}};
    if (!range_end.empty()) create["range_end"] = b64(range_end);
    if (next_revision != 0) create["start_revision"] = std::to_string(next_revision);
    const std::string body = json{{"create_request", std::move(create)}}.dump();
    CURL* h = curl_easy_init();
    if (h == nullptr) {
      dropped = "curl_easy_init failed";
      return;
    }
    char errbuf[CURL_ERROR_SIZE];
    const std::string full = url + "/v3/watch";
    set_common(h, full, body, options, errbuf);
    std::pair<State*, const std::string*> ctx{this, &ep};
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_stream);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &ctx);
    curl_multi_add_handle(multi, h);
    const auto created_by = std::chrono::steady_clock::now() + std::chrono::milliseconds(options.timeout_ms);
    CURLcode result = CURLE_OK;
    bool done = false;
    while (!done && !stopping.load()) {
      int still = 0;
      if (curl_multi_perform(multi, &still) != CURLM_OK) {
        dropped = "curl_multi_perform failed";
        break;
      }
      int left = 0;
      while (CURLMsg* m = curl_multi_info_read(multi, &left)) {
        if (m->msg == CURLMSG_DONE && m->easy_handle == h) {
          result = m->data.result;
          done = true;
        }
      }
      if (done || !fatal.is_ok()) break;
      if (!created && std::chrono::steady_clock::now() > created_by) {
        dropped = "no answer to the watch request within " + std::to_string(options.timeout_ms) + " ms";
        break;
      }
      curl_multi_poll(multi, nullptr, 0, 100, nullptr);
    }
    long http = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &http);
    curl_multi_remove_handle(multi, h);
    curl_easy_cleanup(h);
    if (stopping.load() || !fatal.is_ok() || !dropped.empty()) return;
    if (!done) return;
    if (result != CURLE_OK) {
      dropped = curl_text(result, errbuf, options.tls.enabled());
    } else if (http != 200) {
      dropped = "HTTP " + std::to_string(http) + " (\"" + buffer.substr(0, 200) + "\"): is it an etcd 3.4+ client URL?";
    } else {
      dropped = "the stream ended";
    }
  }

  void run() {
    int64_t backoff_ms = 50;
    uint64_t failures = 0;
    size_t idx = 0;
    while (!stopping.load()) {
      const std::string& url = urls[idx % urls.size()];
      stream(url);
      if (stopping.load()) break;
      if (!fatal.is_ok()) {
        if (on_error) on_error(fatal);
        break;
      }
      if (created) backoff_ms = 50;  // it worked for a while: start over from the shortest pause
      ++failures;
      if (log::nth_worth_logging(failures)) {
        MC_LOG_WARN << "etcd " << shown_endpoint(url) << ": " << what << ": " << dropped
                    << "; reconnecting to the next endpoint from revision " << next_revision << " in " << backoff_ms
                    << " ms (" << kRemedy << ")";
      }
      ++idx;
      sleep_ms(backoff_ms);
      backoff_ms = std::min<int64_t>(backoff_ms * 2, 1000);
    }
    running.store(false);
  }
};

Watch::Watch(Options options, std::string key, std::string range_end, int64_t start_revision, EventsFn on_events,
             ErrorFn on_error)
    : state_(std::make_shared<State>()) {
  global_init();
  State& s = *state_;
  s.options = std::move(options);
  for (const auto& e : s.options.endpoints) s.urls.push_back(base_url(e, s.options.tls));
  s.key = std::move(key);
  s.range_end = std::move(range_end);
  s.next_revision = start_revision;
  s.on_events = std::move(on_events);
  s.on_error = std::move(on_error);
  s.what = "watch on " + shown_range(s.key, s.range_end);
  s.multi = curl_multi_init();
  if (s.urls.empty() || s.multi == nullptr) {
    s.running.store(false);
    const Status st = s.urls.empty() ? Status(Code::kInvalidArgument,
                                              "etcd: " + s.what + ": no etcd endpoints configured (--etcd / MC_ETCD)")
                                     : Status(Code::kResourceExhausted, "etcd: " + s.what + ": curl_multi_init failed");
    if (s.on_error) s.on_error(st);
    return;
  }
  thread_ = std::thread([st = state_] { st->run(); });
}

Watch::~Watch() { stop(); }

void Watch::stop() {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.stopping.store(true);
  }
  s.cv.notify_all();
  if (s.multi != nullptr) curl_multi_wakeup(s.multi);
  if (thread_.get_id() == std::this_thread::get_id()) return;  // from a callback: the thread ends by itself
  std::lock_guard<std::mutex> lock(s.join_mu);
  if (thread_.joinable()) thread_.join();
}

bool Watch::running() const { return state_->running.load(); }

}  // namespace mc::etcd
