// Connection files, Jupyter directories and the random identifiers kernels are named with.
#pragma once

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kgate {

// Every field of a Jupyter connection file.
struct ConnectionInfo {
  std::string transport = "tcp";  // "tcp" or "ipc"
  std::string ip = "127.0.0.1";
  int shell_port = 0;
  int iopub_port = 0;
  int stdin_port = 0;
  int control_port = 0;
  int hb_port = 0;
  std::string key;  // HMAC key (UTF-8 bytes are the key; empty = unsigned)
  std::string signature_scheme = "hmac-sha256";
  std::string kernel_name;
  std::string jupyter_session;  // optional; written only when non-empty

  // "tcp://ip:port", or "ipc://ip-port" for the ipc transport.
  std::string endpoint(int port) const;
  nlohmann::json to_json() const;
  // Throws std::runtime_error naming the missing or mistyped field.
  static ConnectionInfo from_json(const nlohmann::json& j);
};

// The ipc transport's socket paths ("<ip>-<port>" for each of the five ports, ipykernel's and
// jupyter_client's rule); empty for tcp.
std::vector<std::filesystem::path> ipc_socket_paths(const ConnectionInfo& c);
// Unlinks those of ipc_socket_paths(c) that are Unix sockets (nothing else is touched): a kernel
// that was killed leaves its own.  A no-op for tcp.
void remove_ipc_sockets(const ConnectionInfo& c);
// The longest path a Unix socket can be bound at (sockaddr_un's sun_path, less its NUL).
inline constexpr std::size_t kMaxUnixSocketPath = 107;

// Reads a connection file.  Throws std::runtime_error with the path and the reason.
ConnectionInfo load_connection_info(const std::filesystem::path& path);
// Writes a connection file atomically with mode 0600 (temp file + rename in the same dir).
// Throws std::runtime_error on failure.
void write_connection_file(const std::filesystem::path& path, const ConnectionInfo& info);

// Writes `text` to `path` as mode 0600, atomically: a temp file beside it, fsync, rename, and an
// fsync of the directory.  Throws std::runtime_error with the path and the reason.
void write_file_atomically(const std::filesystem::path& path, const std::string& text);

// The start time of process `pid` (Linux: /proc/<pid>/stat, clock ticks since boot); 0 when it
// does not exist or the platform cannot tell.  With the pid it names one process, reuse or not.
unsigned long long process_start_time(int pid);

// Which kgate owns kernel `id`'s connection file: `<runtime_dir>/.kgate-owner-<id>.json`
// (0600) holds this process's pid and start time.  It is a file of its own because ipykernel
// rewrites the connection file it is given, dropping keys it does not know.
void write_owner_file(const std::filesystem::path& runtime_dir, const std::string& id);
void remove_owner_file(const std::filesystem::path& runtime_dir, const std::string& id);

// For every owner file in `runtime_dir` whose kgate is gone (no such process, a zombie, or a
// pid since reused: another start time), removes kernel-<id>.json, pool-<id>.json and the owner
// file: a kgate that was killed (kill -9, a crash) cannot remove its own.  Files of a live kgate,
// and connection files without an owner file (other programs'), are left alone.  Returns the
// connection files removed.  Kernels whose id is in `keep` (the kernel table's: they outlived
// their kgate and are re-adopted) are spared.
std::vector<std::string> remove_stale_connection_files(const std::filesystem::path& runtime_dir,
                                                       const std::set<std::string>& keep = {});

// $HOME when it is an absolute path, else the password database's home directory, else "/".
std::filesystem::path home_dir();
// $XDG_CONFIG_HOME when it is an absolute path (the XDG base directory spec ignores a relative
// one), else home_dir()/.config.
std::filesystem::path config_home();
// config_home()/kgate: kgate.toml, gateways.toml, kgate.env.
std::filesystem::path kgate_config_dir();
// $XDG_STATE_HOME when it is an absolute path, else home_dir()/.local/state (the same rule).
std::filesystem::path state_home();
// $JUPYTER_DATA_DIR, else ${XDG_DATA_HOME:-~/.local/share}/jupyter.
std::filesystem::path jupyter_data_dir();
// $JUPYTER_RUNTIME_DIR, else jupyter_data_dir()/runtime (jupyter_core's rule).
std::filesystem::path jupyter_runtime_dir();
// Creates `dir` (and parents) if needed and makes it mode 0700.  Throws on failure, and for a
// directory owned by another uid.
// Every folder above it must be root's or this user's and writable by no one else (check_parents).
void ensure_private_dir(const std::filesystem::path& dir);
// Throws unless every folder on the way to `dir` (its real path: symlinks resolved) is owned by
// root or this user and writable by no other user (a sticky folder of root's, /tmp, excepted: no
// one can move what is not theirs there; group write is allowed for this user's own group), so
// that no one else can swap a folder or a symlink on the way after the check.  `dir` itself is
// the caller's to check.
void check_parents(const std::filesystem::path& dir);
// The kernelspec search path is kernelspec_search_dirs() in discovery.hpp.

// Binds `n` TCP sockets on `ip` (loopback if it is not an IPv4 address) to port 0 together, so
// the ports are distinct, reads the ports and closes them.  Ports in `avoid` are skipped.  The
// kernel binds them shortly after; a collision in that window shows up as an early exit, which
// relaunches on fresh ports.  Throws std::runtime_error when it cannot.
std::vector<int> pick_ports(const std::string& ip, std::size_t n, const std::set<int>& avoid = {});

// Whether something accepts TCP connections on ip:port (IPv4): a probe, connected and closed.
bool tcp_accepts(const std::string& ip, int port);

// The local TCP ports (IPv4 and IPv6) listened on: `own` by a process of session `sid`, `others`
// by any other socket (Linux: the socket inodes in /proc/<pid>/fd of each process whose session
// is `sid`, matched against the LISTEN entries of /proc/net/tcp and tcp6).  A kernel runs in a
// session of its own, so this tells its listeners from another process's on a port it was given,
// without connecting to either.  Processes this user cannot read count as others; `readable` is
// false when /proc/net/tcp cannot be read (both sets are empty then).
struct TcpListeners {
  std::set<int> own, others;
  bool readable = false;
};
TcpListeners session_tcp_listeners(int sid);

// A random dashed uuid4 ("9078f9cc-81b1-4a03-95af-2ea4ca17b4b3"), from getrandom(2).
std::string new_uuid();
// A random uuid4 without dashes (32 hex digits).
std::string new_hex_id();
// `bytes` bytes of getrandom(2) as lowercase hex (2 digits a byte): keys, and names others must
// not guess.
std::string random_hex(std::size_t bytes);

}  // namespace kgate
