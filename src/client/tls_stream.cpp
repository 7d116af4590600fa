// TLS for https:// gateways (see tls.hpp).
#include "kgate/client/tls_stream.hpp"

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <set>

#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <openssl/x509_vfy.h>
#include <spdlog/spdlog.h>

namespace kgate::client::tls {

namespace {

// A gateways.toml entry, rather than the default gateway or a URL (which take the environment's
// settings).
bool named_entry(const Endpoint& ep) {
  return !ep.is_default && !ep.name.empty() && ep.name.find("://") == std::string::npos;
}

std::string where(const Endpoint& ep) {
  return (ep.host.find(':') != std::string::npos ? "[" + ep.host + "]" : ep.host) + ":" + ep.port;
}

// What to set when a certificate is not trusted.
std::string verify_advice(const Endpoint& ep) {
  if (named_entry(ep))
    return ep.ca_file.empty()
               ? "set ca_file, or verify = false in gateways.toml for [gateways." + ep.name + "]"
               : "check that ca_file (" + ep.ca_file + ") holds the CA or certificate the server uses, or set "
                 "verify = false in gateways.toml for [gateways." + ep.name + "]";
  return ep.ca_file.empty()
             ? "set $KGATE_CA_FILE to a PEM file that holds the server's CA or certificate, or KGATE_TLS_VERIFY=0 "
               "(or name the gateway in gateways.toml with ca_file or verify = false)"
             : "check that $KGATE_CA_FILE (" + ep.ca_file + ") holds the CA or certificate the server uses, or set "
               "KGATE_TLS_VERIFY=0";
}

// OpenSSL's reason without Boost's " (SSL routines)" suffix.
std::string reason(const beast::error_code& ec) {
  std::string m = ec.message();
  if (auto p = m.find(" (SSL routines)"); p != std::string::npos) m.erase(p);
  return m;
}

void warn_unverified(const Endpoint& ep) {
  static std::mutex mu;
  static std::set<std::string> warned;
  std::lock_guard lk(mu);
  if (!warned.insert(ep.name + "\n" + ep.url).second) return;
  spdlog::warn("{}: TLS certificate checks are off ({}): the connection is encrypted but not authenticated, so "
               "anyone on the path can pose as the server and read the token",
               ep.url, named_entry(ep) ? "verify = false in [gateways." + ep.name + "]" : std::string("KGATE_TLS_VERIFY=0"));
}

// OpenSSL fills a certificate's extension cache on first use.  Two handshakes running at once
// on one context (fetch_all's parallel GETs) can both find the trusted CA's cache empty and
// both fill it, one rewriting what the other is comparing (openssl/openssl#32609; TSan found
// it here).  Filling it now, while the context is still this thread's alone, leaves the
// handshakes only reading.  CAs looked up lazily from a hashed directory are not covered.
void fill_certificate_caches(SSL_CTX* ctx) {
  STACK_OF(X509_OBJECT)* objects = X509_STORE_get0_objects(SSL_CTX_get_cert_store(ctx));
  for (int i = 0; i < sk_X509_OBJECT_num(objects); ++i)
    if (X509* cert = X509_OBJECT_get0_X509(sk_X509_OBJECT_value(objects, i))) X509_check_purpose(cert, -1, 0);
}

}  // namespace

std::shared_ptr<ssl::context> client_context(const Endpoint& ep, std::string& error) {
  if (ep.scheme != "https") return nullptr;
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
  SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
  if (!ep.verify) {
    ctx->set_verify_mode(ssl::verify_none);
    warn_unverified(ep);
    return ctx;
  }
  ctx->set_verify_mode(ssl::verify_peer);
  beast::error_code ec;
  if (ep.ca_file.empty()) {
    ctx->set_default_verify_paths(ec);
    if (ec) error = "TLS: cannot load the system's CA certificates (" + reason(ec) + ")";
  } else {
    std::error_code fec;
    if (!std::filesystem::is_regular_file(ep.ca_file, fec)) error = "TLS: ca_file " + ep.ca_file + " is not a file";
    else if (ctx->load_verify_file(ep.ca_file, ec); ec)
      error = "TLS: cannot load ca_file " + ep.ca_file + " (" + reason(ec) + "): it must hold PEM certificates";
  }
  if (!error.empty()) return nullptr;
  fill_certificate_caches(ctx->native_handle());
  return ctx;
}

bool set_peer(TlsStream& s, const Endpoint& ep, std::string& error) {
  SSL* ssl = s.native_handle();
  boost::system::error_code not_ip;
  net::ip::make_address(ep.host, not_ip);
  if (not_ip && !SSL_set_tlsext_host_name(ssl, ep.host.c_str())) {
    error = "TLS: cannot send the server name " + ep.host;
    return false;
  }
  if (!ep.verify) return true;
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  int ok = not_ip ? X509_VERIFY_PARAM_set1_host(param, ep.host.c_str(), 0)
                  : X509_VERIFY_PARAM_set1_ip_asc(param, ep.host.c_str());
  if (!ok) {
    error = "TLS: cannot check the certificate against " + ep.host;
    return false;
  }
  return true;
}

std::string handshake_message(const Endpoint& ep, TlsStream& s, const beast::error_code& ec,
                              std::chrono::milliseconds timeout) {
  long result = SSL_get_verify_result(s.native_handle());
  if (ep.verify && (result == X509_V_ERR_HOSTNAME_MISMATCH || result == X509_V_ERR_IP_ADDRESS_MISMATCH))
    return "TLS: certificate verify failed for " + where(ep) + " (" + X509_verify_cert_error_string(result) +
           "): the certificate is for another name; put the name it was issued for in the URL, or " +
           (named_entry(ep) ? "set verify = false in gateways.toml for [gateways." + ep.name + "]"
                            : std::string("set KGATE_TLS_VERIFY=0"));
  if (ep.verify && result != X509_V_OK)
    return "TLS: certificate verify failed for " + where(ep) + " (" + X509_verify_cert_error_string(result) +
           "): " + verify_advice(ep);
  std::string plain = ep.url;
  plain.replace(0, plain.find("://"), "http");
  std::string why = ec == beast::error::timeout
                        ? "no answer within " + std::to_string(std::max<long long>(1, timeout.count() / 1000)) + " s"
                        : reason(ec);
  return "TLS: handshake failed with " + where(ep) + " (" + why +
         "): is it an https server? If it serves plain http, use " + plain;
}

}  // namespace kgate::client::tls
