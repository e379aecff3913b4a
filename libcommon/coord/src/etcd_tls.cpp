// The etcd PKI of a cluster's keys (etcd.hpp "TLS"; docs/SECURITY.md "etcd"): a CA and, signed by it, etcd's server
// certificate and the client certificate mc's processes present, made with OpenSSL's X.509 API (ECDSA P-256,
// SHA-256). Certificates follow what etcd (Go's crypto/tls) checks: the server's names are subjectAltNames, the CA
// has basicConstraints CA:TRUE and keyCertSign, the server certificate carries serverAuth and clientAuth (etcd's JSON
// gateway dials etcd's own gRPC port with the server certificate as a client certificate when client certificates
// are required), the client certificate clientAuth only. The client certificate has no CommonName: etcd's gateway
// refuses one that has (etcd PR #10392).
#include <arpa/inet.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mc/common/fd.hpp"
#include "mc/coord/etcd.hpp"

namespace mc::etcd {
namespace {

struct Free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(BIGNUM* p) const { BN_free(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Free>;
using Cert = std::unique_ptr<X509, Free>;

// OpenSSL's queued errors as text (and the queue cleared), for messages.
std::string openssl_errors() {
  std::string text;
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    text += (text.empty() ? "" : "; ") + std::string(buf);
  }
  return text.empty() ? "no detail from OpenSSL" : text;
}

Status ssl_error(const std::string& what) {
  return Status(Code::kInternal, "etcd certificates: " + what + " failed: " + openssl_errors());
}

Result<std::string> pem_of(const Key& key) {
  std::unique_ptr<BIO, Free> bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_PrivateKey(bio.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return ssl_error("writing a private key");
  }
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

Result<std::string> pem_of(const Cert& cert) {
  std::unique_ptr<BIO, Free> bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509(bio.get(), cert.get()) != 1) return ssl_error("writing a certificate");
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

Status add_extension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  std::unique_ptr<X509_EXTENSION, Free> ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str()));
  if (!ext || X509_add_ext(cert, ext.get(), -1) != 1) {
    return ssl_error(std::string("the extension ") + OBJ_nid2sn(nid) + " = " + value);
  }
  return Status::ok();
}

// One certificate for `key`, named `what`, signed by `ca_key` (issuer `ca`; nullptr: self-signed), valid `days`.
Result<Cert> make_cert(const Key& key, const std::string& what, bool cn, X509* ca, const Key& ca_key, int days,
                       const std::vector<std::pair<int, std::string>>& extensions) {
  Cert cert(X509_new());
  if (!cert) return ssl_error("X509_new");
  std::unique_ptr<BIGNUM, Free> serial(BN_new());
  if (!serial || BN_rand(serial.get(), 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1 ||
      BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())) == nullptr) {
    return ssl_error("a random serial number");
  }
  if (X509_set_version(cert.get(), 2) != 1 || X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(days) * 86400L) == nullptr ||
      X509_set_pubkey(cert.get(), key.get()) != 1) {
    return ssl_error("the certificate of " + what);
  }
  // O=mc, OU=<what>, and CN=<what> unless `cn` is false: etcd refuses a request through its JSON gateway whose
  // client certificate has a CommonName when client certificates are required (its gateway cannot pass the name on
  // to the permission check, so it refuses rather than ignore it).
  X509_NAME* name = X509_get_subject_name(cert.get());
  auto add = [&](const char* field, const std::string& value) {
    return X509_NAME_add_entry_by_txt(name, field, MBSTRING_ASC, reinterpret_cast<const unsigned char*>(value.c_str()),
                                      -1, -1, 0) == 1;
  };
  if (!add("O", "mc") || !add("OU", what) || (cn && !add("CN", what))) return ssl_error("the subject of " + what);
  X509* issuer = ca != nullptr ? ca : cert.get();
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(issuer)) != 1) return ssl_error("the issuer of " + what);
  for (const auto& [nid, value] : extensions) MC_RETURN_IF_ERROR(add_extension(cert.get(), issuer, nid, value));
  if (X509_sign(cert.get(), ca_key.get(), EVP_sha256()) <= 0) return ssl_error("signing the certificate of " + what);
  return cert;
}

Result<Key> make_key() {
  Key key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  if (!key) return ssl_error("an ECDSA P-256 key");
  return key;
}

// "IP:127.0.0.1,IP:::1,DNS:localhost" from host names and addresses; kInvalidArgument for an empty or odd one.
Result<std::string> subject_alt_names(const std::vector<std::string>& hosts) {
  std::string san;
  for (const std::string& h : hosts) {
    unsigned char addr[16];
    const bool ip = ::inet_pton(AF_INET, h.c_str(), addr) == 1 || ::inet_pton(AF_INET6, h.c_str(), addr) == 1;
    const bool dns =
        !h.empty() && h.size() <= 253 && h.front() != '-' && h.front() != '.' &&
        h.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") == std::string::npos;
    if (!ip && !dns) {
      return Status(Code::kInvalidArgument,
                    "etcd host '" + h.substr(0, 80) + "' is neither an IPv4/IPv6 address nor a DNS name (--etcd-host)");
    }
    san += (san.empty() ? "" : ",") + std::string(ip ? "IP:" : "DNS:") + h;
  }
  if (san.empty()) return Status(Code::kInvalidArgument, "etcd certificates: no host for the server certificate");
  return san;
}

std::mutex& default_mu() {
  static std::mutex mu;
  return mu;
}
TlsFiles& default_files() {
  static TlsFiles files;
  return files;
}

}  // namespace

void set_default_tls(TlsFiles files) {
  std::lock_guard<std::mutex> lock(default_mu());
  default_files() = std::move(files);
}

TlsFiles default_tls() {
  std::lock_guard<std::mutex> lock(default_mu());
  return default_files();
}

TlsFiles tls_files_in(const std::string& dir) {
  return TlsFiles{dir + "/ca.pem", dir + "/client.pem", dir + "/client.key"};
}

Status write_tls_files(const std::string& dir, const std::vector<std::string>& server_hosts, int valid_days) {
  if (valid_days < 1 || valid_days > 36500) {
    return Status(Code::kInvalidArgument,
                  "etcd certificates: validity " + std::to_string(valid_days) + " days is outside [1, 36500]");
  }
  MC_ASSIGN_OR_RETURN(std::string san, subject_alt_names(server_hosts));
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status(Code::kIo, "cannot create " + dir + ": " + std::strerror(errno));
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() ||
      ::chmod(dir.c_str(), 0700) != 0) {
    return Status(Code::kIo, dir + " is not a directory of this user that can be made private (mode 0700): remove it");
  }
  MC_ASSIGN_OR_RETURN(Key ca_key, make_key());
  MC_ASSIGN_OR_RETURN(Cert ca, make_cert(ca_key, "mc etcd CA", true, nullptr, ca_key, valid_days,
                                         {{NID_basic_constraints, "critical,CA:TRUE"},
                                          {NID_key_usage, "critical,keyCertSign,cRLSign"},
                                          {NID_subject_key_identifier, "hash"}}));
  const std::vector<std::pair<int, std::string>> client_ext = {
      {NID_basic_constraints, "critical,CA:FALSE"},
      {NID_key_usage, "critical,digitalSignature,keyAgreement"},
      {NID_ext_key_usage, "clientAuth"},
      {NID_subject_key_identifier, "hash"},
      {NID_authority_key_identifier, "keyid"}};
  std::vector<std::pair<int, std::string>> server_ext = client_ext;
  server_ext[2].second = "serverAuth,clientAuth";
  server_ext.emplace_back(NID_subject_alt_name, san);
  MC_ASSIGN_OR_RETURN(Key server_key, make_key());
  MC_ASSIGN_OR_RETURN(Cert server,
                      make_cert(server_key, "mc etcd server", true, ca.get(), ca_key, valid_days, server_ext));
  MC_ASSIGN_OR_RETURN(Key client_key, make_key());
  MC_ASSIGN_OR_RETURN(Cert client,
                      make_cert(client_key, "mc etcd client", false, ca.get(), ca_key, valid_days, client_ext));
  struct Out {
    const char* name;
    Result<std::string> text;
    mode_t mode;
  };
  Out files[] = {{"ca.pem", pem_of(ca), 0644},         {"ca.key", pem_of(ca_key), 0600},
                 {"server.pem", pem_of(server), 0644}, {"server.key", pem_of(server_key), 0600},
                 {"client.pem", pem_of(client), 0644}, {"client.key", pem_of(client_key), 0600}};
  for (Out& f : files) {
    if (!f.text.is_ok()) return f.text.status();
    MC_RETURN_IF_ERROR(write_file_replacing(dir + "/" + f.name, f.text.value(), f.mode));
  }
  return Status::ok();
}

}  // namespace mc::etcd
