// kgate-mcp's TLS client context (src/client/tls_stream.cpp) against a real TLS server on 127.0.0.1:
// many handshakes at once on one context, as fetch_all makes them.  Under scripts/tsan.sh this
// is also the regression test for the CA extension-cache race (openssl/openssl#32609).
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include "support.hpp"
#include "kgate/client/http_client.hpp"
#include "kgate/client/tls_stream.hpp"

namespace kgate::client {
namespace {

using tcp = boost::asio::ip::tcp;
namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;

struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct CertFree {
  void operator()(X509* x) const { X509_free(x); }
};

// A self-signed certificate for 127.0.0.1 with the extensions `openssl req -x509` gives
// (subject and authority key identifiers among them: the fields the race was on).
struct SelfSigned {
  std::unique_ptr<EVP_PKEY, KeyFree> key;
  std::unique_ptr<X509, CertFree> cert;
};

SelfSigned make_self_signed() {
  SelfSigned out;
  out.key.reset(EVP_EC_gen("P-256"));
  if (!out.key) throw std::runtime_error("EVP_EC_gen failed");
  out.cert.reset(X509_new());
  X509* x = out.cert.get();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
  X509_gmtime_adj(X509_getm_notBefore(x), -60);
  X509_gmtime_adj(X509_getm_notAfter(x), 3600);
  X509_set_pubkey(x, out.key.get());
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("127.0.0.1"), -1, -1, 0);
  X509_set_issuer_name(x, name);
  X509V3_CTX v3;
  X509V3_set_ctx_nodb(&v3);
  X509V3_set_ctx(&v3, x, x, nullptr, nullptr, 0);
  const std::pair<int, const char*> exts[] = {
      {NID_basic_constraints, "critical,CA:TRUE"},
      {NID_subject_key_identifier, "hash"},
      {NID_authority_key_identifier, "keyid:always"},
      {NID_subject_alt_name, "IP:127.0.0.1"},
  };
  for (auto [nid, value] : exts) {
    X509_EXTENSION* e = X509V3_EXT_conf_nid(nullptr, &v3, nid, value);
    if (!e || !X509_add_ext(x, e, -1)) throw std::runtime_error(std::string("extension ") + value);
    X509_EXTENSION_free(e);
  }
  if (!X509_sign(x, out.key.get(), EVP_sha256())) throw std::runtime_error("X509_sign failed");
  return out;
}

void write_pem(const SelfSigned& c, const std::filesystem::path& path) {
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  PEM_write_X509(f, c.cert.get());
  std::fclose(f);
}

// One round: a fresh client context (so a fresh, never-used CA certificate) and kClients
// handshakes released together; returns each client's outcome.
std::vector<std::string> parallel_handshakes(const SelfSigned& cert, const std::filesystem::path& ca_file) {
  constexpr int kClients = 8;
  // The server: one thread accepts, one thread per connection handshakes.
  ssl::context server_ctx(ssl::context::tls_server);
  SSL_CTX_use_certificate(server_ctx.native_handle(), cert.cert.get());
  SSL_CTX_use_PrivateKey(server_ctx.native_handle(), cert.key.get());
  net::io_context server_ioc;
  tcp::acceptor acceptor(server_ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
  const unsigned short port = acceptor.local_endpoint().port();
  std::vector<std::string> results(kClients);
  Endpoint ep;
  std::string error;
  std::shared_ptr<ssl::context> ctx;
  if (!parse_endpoint_url("https://127.0.0.1:" + std::to_string(port), ep, error)) {
    results.assign(kClients, "url: " + error);
  } else {
    ep.ca_file = ca_file.string();
    ctx = tls::client_context(ep, error);
    if (!ctx) results.assign(kClients, "context: " + error);
  }
  if (!ctx) return results;
  std::vector<std::thread> server_threads;
  std::thread accepting([&] {
    for (int i = 0; i < kClients; ++i) {
      auto sock = std::make_shared<tcp::socket>(server_ioc);
      boost::system::error_code ec;
      acceptor.accept(*sock, ec);
      if (ec) return;
      server_threads.emplace_back([sock, &server_ctx] {
        ssl::stream<tcp::socket&> s(*sock, server_ctx);
        boost::system::error_code hec;
        s.handshake(ssl::stream_base::server, hec);
        if (!hec) s.shutdown(hec);
      });
    }
  });

  std::latch start(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      net::io_context ioc;
      boost::system::error_code ec;
      tls::TlsStream s(ioc, *ctx);
      beast::get_lowest_layer(s).socket().connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port), ec);
      std::string perr;
      if (ec) results[i] = "connect: " + ec.message();
      else if (!tls::set_peer(s, ep, perr)) results[i] = perr;
      start.arrive_and_wait();  // every handshake begins together
      if (!results[i].empty()) return;
      s.handshake(ssl::stream_base::client, ec);
      results[i] = ec ? "handshake: " + ec.message() : "ok";
    });
  }
  for (auto& t : clients) t.join();
  accepting.join();
  for (auto& t : server_threads) t.join();
  return results;
}

TEST(TlsClientContext, ParallelHandshakesOnOneContextAllVerify) {
  test::TempDir dir("kgate-tls");
  SelfSigned cert = make_self_signed();
  write_pem(cert, dir.path() / "ca.pem");
  for (int round = 0; round < 30; ++round) {
    auto results = parallel_handshakes(cert, dir.path() / "ca.pem");
    for (std::size_t i = 0; i < results.size(); ++i) EXPECT_EQ(results[i], "ok") << "round " << round << " client " << i;
  }
}

TEST(TlsClientContext, AnotherCertificateIsRefused) {
  test::TempDir dir("kgate-tls");
  SelfSigned served = make_self_signed(), trusted = make_self_signed();
  write_pem(trusted, dir.path() / "ca.pem");
  ssl::context server_ctx(ssl::context::tls_server);
  ASSERT_EQ(SSL_CTX_use_certificate(server_ctx.native_handle(), served.cert.get()), 1);
  ASSERT_EQ(SSL_CTX_use_PrivateKey(server_ctx.native_handle(), served.key.get()), 1);
  net::io_context server_ioc;
  tcp::acceptor acceptor(server_ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
  const unsigned short port = acceptor.local_endpoint().port();
  std::thread server([&] {
    tcp::socket sock(server_ioc);
    boost::system::error_code ec;
    acceptor.accept(sock, ec);
    if (ec) return;
    ssl::stream<tcp::socket&> s(sock, server_ctx);
    s.handshake(ssl::stream_base::server, ec);
  });

  Endpoint ep;
  std::string error;
  ASSERT_TRUE(parse_endpoint_url("https://127.0.0.1:" + std::to_string(port), ep, error)) << error;
  ep.ca_file = (dir.path() / "ca.pem").string();
  auto ctx = tls::client_context(ep, error);
  ASSERT_TRUE(ctx) << error;
  net::io_context ioc;
  tls::TlsStream s(ioc, *ctx);
  boost::system::error_code ec;
  beast::get_lowest_layer(s).socket().connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port), ec);
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_TRUE(tls::set_peer(s, ep, error)) << error;
  s.handshake(ssl::stream_base::client, ec);
  EXPECT_TRUE(ec);
  EXPECT_NE(tls::handshake_message(ep, s, ec, std::chrono::milliseconds(1000)).find("certificate verify failed"),
            std::string::npos);
  server.join();
}

}  // namespace
}  // namespace kgate::client
