// The Unix socket file, the peer check and the server's TLS context (see listener.hpp).
#include "http/listener.hpp"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <boost/asio/ssl.hpp>
#include <openssl/ssl.h>

namespace kgate::gw {

namespace fs = std::filesystem;

namespace {

std::string errno_text(int e) { return std::strerror(e); }

// What connect() says about the socket at `path`: 0 (someone accepts), or the errno.
int probe_socket(const fs::path& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return errno;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.native().size());
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  // A full backlog (EAGAIN) or a connect still going on is someone listening too.
  int e = rc == 0 || errno == EAGAIN || errno == EINPROGRESS ? 0 : errno;
  ::close(fd);
  return e;
}

// OpenSSL's reason without Boost's " (SSL routines)" suffix.
std::string reason(const boost::system::error_code& ec) {
  std::string m = ec.message();
  if (auto p = m.find(" ("); p != std::string::npos) m.erase(p);
  return m;
}

bool file_mentions(const fs::path& file, const std::string& word) {
  std::ifstream in(file);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str().find(word) != std::string::npos;
}

void check_readable(const fs::path& file, const char* what) {
  std::error_code ec;
  if (fs::is_directory(file, ec)) throw std::runtime_error(std::string(what) + " " + file.string() + " is a directory");
  std::ifstream in(file);
  if (!in) throw std::runtime_error(std::string("cannot read ") + what + " " + file.string() + ": " + errno_text(errno));
}

}  // namespace

fs::path default_unix_socket_path(const fs::path& runtime_dir) {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  if (!xdg || !*xdg) return runtime_dir / "kgate.sock";
  fs::path dir = fs::path(xdg) / "kgate";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create " + dir.string() + " for the Unix socket: " + ec.message());
  if (::chmod(dir.c_str(), 0700) != 0)
    throw std::runtime_error("cannot make " + dir.string() + " private (chmod 0700): " + errno_text(errno));
  return dir / "kgate.sock";
}

void UnixListener::listen(const fs::path& path) {
  close();
  // sun_path holds 108 bytes with its NUL on Linux (104 on macOS).
  if (path.native().size() >= sizeof(sockaddr_un{}.sun_path))
    throw std::runtime_error("the Unix socket path " + path.string() + " is too long (" +
                             std::to_string(path.native().size()) + " bytes; at most " +
                             std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) + "): choose a shorter --unix path");
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      throw std::runtime_error(path.string() + " exists and is not a socket: remove it or choose another --unix path");
    int e = probe_socket(path);
    if (e == 0) throw std::runtime_error("another kgate is serving on " + path.string() +
                                         " (it accepts connections): stop it, or choose another --unix path");
    if (e != ECONNREFUSED)
      throw std::runtime_error("cannot tell whether the socket " + path.string() + " is in use (connect: " +
                               errno_text(e) + "): remove it, or choose another --unix path");
    // Stale: left behind by a kgate that did not exit cleanly.
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      throw std::runtime_error("cannot remove the stale socket " + path.string() + ": " + errno_text(errno));
  } else if (errno != ENOENT) {
    throw std::runtime_error("cannot check " + path.string() + ": " + errno_text(errno));
  }

  auto fail = [&](const std::string& what, const boost::system::error_code& ec) {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    if (owned_) ::unlink(path.c_str());
    owned_ = false;
    throw std::runtime_error("cannot listen on unix:" + path.string() + ": " + what + ": " + ec.message());
  };
  boost::system::error_code ec;
  net::local::stream_protocol::endpoint ep(path.string());
  acceptor_.open(ep.protocol(), ec);
  if (ec) fail("socket", ec);
  acceptor_.bind(ep, ec);
  if (ec) fail("bind", ec);
  owned_ = true;
  // Not yet listening, so nobody can connect while the mode is still the umask's.
  if (::chmod(path.c_str(), 0600) != 0) fail("chmod 0600", {errno, boost::system::system_category()});
  if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_uid != ::geteuid() ||
      (st.st_mode & 0777) != 0600)
    fail("the socket file changed under kgate", net::error::access_denied);
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  acceptor_.listen(net::socket_base::max_listen_connections, ec);
  if (ec) fail("listen", ec);
  path_ = path;
}

void UnixListener::close() {
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  if (!owned_) return;
  owned_ = false;
  // Another kgate may have replaced a file it took for stale: remove only ours.
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) ::unlink(path_.c_str());
}

std::optional<uid_t> unix_peer_uid(int fd) {
#ifdef SO_PEERCRED
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof cred) return std::nullopt;
  return cred.uid;
#else
  uid_t uid = 0;
  gid_t gid = 0;
  if (::getpeereid(fd, &uid, &gid) != 0) return std::nullopt;
  return uid;
#endif
}

bool unix_peer_allowed(uid_t uid, const std::vector<uid_t>& allowed) {
  return uid == ::geteuid() || std::find(allowed.begin(), allowed.end(), uid) != allowed.end();
}

std::shared_ptr<net::ssl::context> server_tls_context(const fs::path& certfile, const fs::path& keyfile) {
  check_readable(certfile, "certfile");
  check_readable(keyfile, "keyfile");
  auto ctx = std::make_shared<net::ssl::context>(net::ssl::context::tls_server);
  SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
  ctx->set_options(net::ssl::context::default_workarounds | net::ssl::context::single_dh_use);
  // An encrypted key would make OpenSSL prompt on the terminal: fail instead.
  ctx->set_password_callback([](std::size_t, net::ssl::context::password_purpose) { return std::string(); });
  boost::system::error_code ec;
  ctx->use_certificate_chain_file(certfile.string(), ec);
  if (ec)
    throw std::runtime_error("certfile " + certfile.string() + " is not a PEM certificate (" + reason(ec) + ")");
  ctx->use_private_key_file(keyfile.string(), net::ssl::context::pem, ec);
  if (ec) {
    std::string why = reason(ec);
    if (why.find("mismatch") != std::string::npos)
      throw std::runtime_error("keyfile " + keyfile.string() + " does not match the certificate in certfile " +
                               certfile.string() + ": give the key the certificate was made for");
    if (file_mentions(keyfile, "ENCRYPTED"))
      throw std::runtime_error("keyfile " + keyfile.string() +
                               " is encrypted and kgate cannot ask for its passphrase: decrypt it "
                               "(openssl pkey -in KEY -out KEY2) and keep it mode 0600");
    throw std::runtime_error("keyfile " + keyfile.string() + " is not a PEM private key (" + why + ")");
  }
  if (SSL_CTX_check_private_key(ctx->native_handle()) != 1)
    throw std::runtime_error("keyfile " + keyfile.string() + " does not match the certificate in certfile " +
                             certfile.string() + ": give the key the certificate was made for");
  return ctx;
}

}  // namespace kgate::gw
