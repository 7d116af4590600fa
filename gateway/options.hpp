// The daemon's settings: one plain struct, filled in main from kgate.toml and the CLI.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "kgate/records/jobs.hpp"
#include "kgate/kernel/kernel.hpp"

namespace kgate::gw {

// How the env of POST /api/kernels is applied (see DEV.md, "Kernel environment").
enum class EnvPolicy {
  automatic,  // loopback and Unix-socket clients: whole env; others: filtered
  all,        // always the whole env
  filtered,   // always KERNEL_* plus env_allow
};

// Where the token comes from (docs/dev/security.md, "The token").
enum class TokenSource {
  automatic,  // kgate's own, kept in the state dir (StateDir::token); not asked on the Unix socket
  given,      // --token, $KGATE_TOKEN, token or token_file in kgate.toml; asked everywhere
  none,       // --no-token or token = "": no auth (refused for a non-loopback bind)
};

struct GatewayOptions {
  std::string ip = "127.0.0.1";
  int port = 8787;
  TokenSource token_source = TokenSource::automatic;
  std::string token;  // empty only with TokenSource::none (Server fills in the automatic one)
  std::string base_url = "/";
  std::filesystem::path runtime_dir;  // default: jupyter_runtime_dir()
  std::filesystem::path state_dir;    // default: default_state_dir(), $XDG_STATE_HOME/kgate
  std::filesystem::path root_dir;     // POST path= is relative to this; default: cwd
  std::string default_kernel = "python3";

  std::vector<std::string> allow_origins;  // extra allowed Origins; "*" allows every origin
  std::vector<std::string> allow_hosts;    // extra allowed Host names for a loopback bind

  EnvPolicy env_policy = EnvPolicy::automatic;
  std::vector<std::string> env_allow = {"LANG", "LC_ALL", "LC_CTYPE", "TZ", "JPY_SESSION_NAME"};

  // Limits.
  std::size_t max_body_bytes = 16u << 20;           // HTTP request body
  std::size_t max_header_bytes = 64u << 10;         // HTTP request header
  // Connections held at once (HTTP and websockets), and those of them that have not passed the
  // token check (http/connection_gate.hpp, docs/dev/limits.md "Connections").
  std::size_t max_connections = 1024;
  std::size_t max_unauthenticated_connections = 128;
  std::size_t max_ws_message_bytes = 256u << 20;    // one websocket message from a client
  std::size_t client_queue_bytes = 128u << 20;      // unsent output queued for one websocket
  std::size_t client_queue_messages = 200000;
  std::size_t replay_bytes = 64u << 20;             // replay buffer of one detached session
  std::size_t replay_messages = 100000;
  std::chrono::seconds replay_ttl{600};             // a detached session's buffer lives this long
  std::chrono::seconds sessionless_window{30};      // replay window for sessionless clients
  std::size_t max_detached_sessions = 256;          // per kernel; the oldest goes first

  std::size_t max_waiters = 1000;                   // HTTP requests waiting on jobs (503 past it)
  // Kernels at once, starts still pending included (503 + Retry-After past it); 0 = no limit.
  // Pooled kernels not yet handed out are not counted (docs/dev/kernel-lifecycle.md "Warm pool").
  std::size_t max_kernels = 64;

  KernelOptions kernel;
  RecordLimits records;

  // Remote launchers (docs/dev/remote-launchers.md), [launchers.NAME] of kgate.toml; "local" is implicit.
  std::map<std::string, LauncherPtr> launchers;

  // Kernel discovery (DEV.md "Kernel discovery").
  struct Discovery {
    bool interpreters = true;                          // offer each Python env with ipykernel
    std::chrono::milliseconds watch_interval{2000};    // kernelspec dirs checked for changes
    std::chrono::milliseconds rescan_interval{60000};  // full rediscovery (new envs)
    std::chrono::milliseconds probe_timeout{10000};    // one interpreter probe
    std::chrono::milliseconds request_wait{3000};      // a request waits this long for the first discovery
  } discovery;

  // Idle culling, jupyter_server's MappingKernelManager.cull_* (docs/dev/kernel-lifecycle.md "Idle culling").
  struct Culling {
    std::chrono::seconds idle_timeout{0};  // cull_idle_timeout: idle this long -> culled; 0 = off
    std::chrono::seconds interval{300};    // cull_interval: how often kernels are checked (>= 1)
    bool connected = false;                // cull_connected: also kernels with websocket clients
    bool busy = false;                     // cull_busy: also busy kernels
    // auto_kernel_grace_seconds: a conversation's auto kernel (POST "kgate_conversation") is
    // stopped this long after its agent is gone (kgate-mcp killed, say), unless a client is
    // connected to it; 0 = never.
    std::chrono::seconds auto_kernel_grace{60};
  } culling;

  // Listeners and TLS (DEV.md "Threads and sockets" and "Security").
  bool tcp = true;                          // serve on ip:port (false: only on the Unix socket)
  bool unix_socket = false;                 // also serve on a Unix socket
  std::filesystem::path unix_path;          // its path; "" = default_unix_socket_path()
  std::vector<uid_t> unix_allow_uids;       // Unix peers served besides kgate's own uid
  std::filesystem::path certfile, keyfile;  // both set: https and wss on the TCP listener

  // The warm pool (docs/dev/kernel-lifecycle.md "Warm pool"): ready kernels handed to POST /api/kernels.
  struct Pool {
    std::size_t size = 1;                          // for the default kernelspec; 0 = none
    std::map<std::string, std::size_t> kernels;    // per kernelspec name (overrides size)
    static constexpr std::size_t kMaxPerSpec = 16;
    static constexpr std::size_t kMaxTotal = 64;
  } pool;
};

}  // namespace kgate::gw
