// kgate.toml: reads the config file into GatewayOptions (CLI flags are applied after it).
#include "config.hpp"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include <arpa/inet.h>

#include <algorithm>

#include <toml++/toml.h>

#include "http/request.hpp"  // is_loopback_address
#include "kgate/jupyter/connection.hpp"

namespace kgate::gw {

std::filesystem::path default_config_path() { return kgate_config_dir() / "kgate.toml"; }

namespace {

struct Reader {
  const std::filesystem::path& file;
  std::string where(const std::string& key) const { return file.string() + ": " + key; }

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw std::runtime_error(where(key) + ": " + what);
  }
  std::string str(const toml::node& n, const std::string& key) const {
    if (auto v = n.value<std::string>()) return *v;
    fail(key, "must be a string");
  }
  std::int64_t integer(const toml::node& n, const std::string& key, std::int64_t lo, std::int64_t hi) const {
    // value<int64_t>() would also convert booleans and floats: insist on an integer.
    auto v = n.is_integer() ? n.value<std::int64_t>() : std::nullopt;
    if (!v) fail(key, "must be an integer");
    if (*v < lo || *v > hi) fail(key, "must be between " + std::to_string(lo) + " and " + std::to_string(hi));
    return *v;
  }
  bool boolean(const toml::node& n, const std::string& key) const {
    if (auto v = n.is_boolean() ? n.value<bool>() : std::nullopt) return *v;
    fail(key, "must be true or false");
  }
  std::vector<std::string> strings(const toml::node& n, const std::string& key) const {
    auto arr = n.as_array();
    if (!arr) fail(key, "must be an array of strings");
    std::vector<std::string> out;
    for (auto& e : *arr) out.push_back(str(e, key));
    return out;
  }
};

// [launchers.NAME]: kind = "slurm" (or "ssh", not launchable yet), the sbatch options,
// sbatch_args, kgate_path, connection_dir, allow_override.
void read_launcher(const Reader& r, const std::string& name, const toml::node& node, GatewayOptions& opts) {
  const std::string base = "launchers." + name;
  auto t = node.as_table();
  if (!t) r.fail(base, "must be a table: [launchers." + name + "] with kind = \"slurm\"");
  if (name == "local" || name.empty() || name.size() > 64 ||
      !std::all_of(name.begin(), name.end(), [](unsigned char c) { return std::isalnum(c) || c == '-' || c == '_'; }))
    r.fail(base, "a launcher's name is 1 to 64 letters, digits, - or _, and not \"local\" (the default)");
  auto l = std::make_shared<LauncherConfig>();
  l->name = name;
  std::error_code ec;
  l->kgate_path = std::filesystem::read_symlink("/proc/self/exe", ec);
  bool have_kind = false;
  for (auto& entry : *t) {
    const toml::node& v = entry.second;
    std::string key(entry.first.str());
    std::string full = base + "." + key;
    if (key == "kind") {
      std::string k = r.str(v, full);
      if (k == "slurm") l->kind = LauncherConfig::Kind::slurm;
      else if (k == "ssh") l->kind = LauncherConfig::Kind::ssh;
      else r.fail(full, "must be \"slurm\" or \"ssh\"");
      have_kind = true;
    } else if (std::find(LauncherConfig::slurm_keys().begin(), LauncherConfig::slurm_keys().end(), key) !=
               LauncherConfig::slurm_keys().end()) {
      if (key == "cpus") l->slurm[key] = std::to_string(r.integer(v, full, 1, 100000));
      else l->slurm[key] = r.str(v, full);
    } else if (key == "sbatch_args") l->sbatch_args = r.strings(v, full);
    else if (key == "host") {
      l->host = r.str(v, full);
      if (l->host.empty() || l->host[0] == '-') r.fail(full, "must be a host name or address");
    } else if (key == "user") {
      l->user = r.str(v, full);
      if (!l->user.empty() && l->user[0] == '-') r.fail(full, "must be a user name");
    } else if (key == "port") l->port = int(r.integer(v, full, 1, 65535));
    else if (key == "identity_file") l->identity_file = r.str(v, full);
    else if (key == "ssh_options") l->ssh_options = r.strings(v, full);
    else if (key == "forward") l->forward = r.boolean(v, full);
    else if (key == "bind_ip") {
      l->bind_ip = r.str(v, full);
      in_addr a{};
      if (::inet_pton(AF_INET, l->bind_ip.c_str(), &a) != 1) r.fail(full, "must be an IPv4 address of the host");
    }
    else if (key == "kgate_path") l->kgate_path = r.str(v, full);
    else if (key == "connection_dir") l->connection_dir = r.str(v, full);
    else if (key == "allow_override") {
      l->allow_override = r.strings(v, full);
      for (const auto& o : l->allow_override)
        if (std::find(LauncherConfig::slurm_keys().begin(), LauncherConfig::slurm_keys().end(), o) ==
            LauncherConfig::slurm_keys().end())
          r.fail(full, "\"" + o + "\" cannot be overridden (these can: partition, time, gres, account, cpus, mem)");
    } else r.fail(full, "unknown key");
  }
  if (!have_kind) r.fail(base, "needs kind = \"slurm\" (or \"ssh\")");
  const bool ssh = l->kind == LauncherConfig::Kind::ssh;
  if (ssh && l->host.empty()) r.fail(base, "an ssh launcher needs host = \"...\"");
  if (ssh && (!l->slurm.empty() || !l->sbatch_args.empty() || !l->allow_override.empty()))
    r.fail(base, "partition, time, gres, account, cpus, mem, sbatch_args and allow_override are for kind = \"slurm\"");
  if (!ssh && (!l->host.empty() || !l->user.empty() || l->port || !l->identity_file.empty() ||
               !l->ssh_options.empty() || l->forward))
    r.fail(base, "host, user, port, identity_file, ssh_options and forward are for kind = \"ssh\"");
  opts.launchers[name] = std::move(l);
}

}  // namespace

void load_config_file(const std::filesystem::path& path, GatewayOptions& opts) {
  toml::table tbl;
  try {
    tbl = toml::parse_file(path.string());
  } catch (const toml::parse_error& e) {
    std::ostringstream ss;
    ss << path.string() << ":" << e.source().begin.line << ":" << e.source().begin.column << ": "
       << e.description();
    throw std::runtime_error(ss.str());
  }
  Reader r{path};
  const std::int64_t big = std::int64_t(1) << 40;
  for (auto& [section_key, section_node] : tbl) {
    std::string section(section_key.str());
    auto sec = section_node.as_table();
    if (!sec) r.fail(section, "must be a table ([server], [limits], [kernel], [records], [discovery], [culling], [pool], [remote] or [launchers.NAME])");
    if (section == "launchers") {
      for (auto& [lname, lnode] : *sec) read_launcher(r, std::string(lname.str()), lnode, opts);
      continue;
    }
    if (section != "server" && section != "limits" && section != "kernel" && section != "records" &&
        section != "discovery" && section != "culling" && section != "pool" && section != "remote")
      r.fail(section, "unknown section (expected [server], [limits], [kernel], [records], [discovery], [culling], [pool], [remote] or [launchers.NAME])");
    for (auto& entry : *sec) {
      const toml::node& node = entry.second;  // not a structured binding: lambdas below capture it
      std::string key(entry.first.str());
      std::string full = section + "." + key;
      if (section == "server") {
        if (key == "ip") opts.ip = r.str(node, full);
        else if (key == "port") opts.port = int(r.integer(node, full, 0, 65535));
        else if (key == "token") {
          opts.token = r.str(node, full);  // "" = serve without a token
          opts.token_source = opts.token.empty() ? TokenSource::none : TokenSource::given;
        }
        else if (key == "token_file") {
          std::string file = r.str(node, full);
          std::ifstream in(file);
          if (!in) r.fail(full, "cannot read " + file);
          std::string line;
          std::getline(in, line);
          while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
          if (line.empty()) r.fail(full, file + " is empty: its first line must be the token");
          opts.token = line;
          opts.token_source = TokenSource::given;
        } else if (key == "base_url") opts.base_url = r.str(node, full);
        else if (key == "runtime_dir") opts.runtime_dir = r.str(node, full);
        else if (key == "state_dir") {
          opts.state_dir = r.str(node, full);
          if (opts.state_dir.empty()) r.fail(full, "must not be empty (leave it out for the default)");
        }
        else if (key == "root_dir") opts.root_dir = r.str(node, full);
        else if (key == "default_kernel") opts.default_kernel = r.str(node, full);
        else if (key == "allow_origins") opts.allow_origins = r.strings(node, full);
        else if (key == "allow_hosts") opts.allow_hosts = r.strings(node, full);
        else if (key == "env_policy") {
          auto v = r.str(node, full);
          if (v == "auto") opts.env_policy = EnvPolicy::automatic;
          else if (v == "all") opts.env_policy = EnvPolicy::all;
          else if (v == "filtered") opts.env_policy = EnvPolicy::filtered;
          else r.fail(full, "must be \"auto\", \"all\" or \"filtered\"");
        } else if (key == "env_allow") opts.env_allow = r.strings(node, full);
        else if (key == "tcp") opts.tcp = r.boolean(node, full);
        else if (key == "unix_socket") {
          // true: the default path; false: none; a string: that path.
          if (node.is_boolean()) {
            opts.unix_socket = r.boolean(node, full);
            opts.unix_path.clear();
          } else {
            std::string p = r.str(node, full);
            if (p.empty()) r.fail(full, "must be a path, or true for the default path");
            opts.unix_socket = true;
            opts.unix_path = p;
          }
        } else if (key == "unix_allow_uids") {
          auto arr = node.as_array();
          if (!arr) r.fail(full, "must be an array of uids (integers)");
          opts.unix_allow_uids.clear();
          for (auto& e : *arr) opts.unix_allow_uids.push_back(uid_t(r.integer(e, full, 0, 4294967294)));
        } else if (key == "certfile") opts.certfile = r.str(node, full);
        else if (key == "keyfile") opts.keyfile = r.str(node, full);
        else r.fail(full, "unknown key");
      } else if (section == "limits") {
        if (key == "max_body_bytes") opts.max_body_bytes = std::size_t(r.integer(node, full, 1024, big));
        else if (key == "max_header_bytes") opts.max_header_bytes = std::size_t(r.integer(node, full, 1024, 1 << 24));
        else if (key == "max_connections") opts.max_connections = std::size_t(r.integer(node, full, 16, 1 << 20));
        else if (key == "max_unauthenticated_connections")
          opts.max_unauthenticated_connections = std::size_t(r.integer(node, full, 1, 1 << 20));
        else if (key == "max_ws_message_bytes") opts.max_ws_message_bytes = std::size_t(r.integer(node, full, 1024, big));
        else if (key == "client_queue_bytes") opts.client_queue_bytes = std::size_t(r.integer(node, full, 1024, big));
        else if (key == "client_queue_messages") opts.client_queue_messages = std::size_t(r.integer(node, full, 1, big));
        else if (key == "replay_bytes") opts.replay_bytes = std::size_t(r.integer(node, full, 0, big));
        else if (key == "replay_messages") opts.replay_messages = std::size_t(r.integer(node, full, 0, big));
        else if (key == "replay_ttl_seconds") opts.replay_ttl = std::chrono::seconds(r.integer(node, full, 0, big));
        else if (key == "sessionless_window_seconds") opts.sessionless_window = std::chrono::seconds(r.integer(node, full, 0, big));
        else if (key == "max_detached_sessions") opts.max_detached_sessions = std::size_t(r.integer(node, full, 0, 1 << 20));
        else if (key == "max_pending_requests") opts.kernel.max_pending = std::size_t(r.integer(node, full, 1, big));
        else if (key == "max_held_messages") opts.kernel.max_held = std::size_t(r.integer(node, full, 0, big));
        else if (key == "max_kernels") opts.max_kernels = std::size_t(r.integer(node, full, 0, 100000));
        // The legacy websocket format has 32-bit offsets: a message must stay under 4 GiB.
        else if (key == "max_kernel_message_bytes") opts.kernel.max_message_bytes = std::size_t(r.integer(node, full, 1024, (std::int64_t(1) << 32) - 1));
        else r.fail(full, "unknown key");
      } else if (section == "kernel") {
        auto ms = [&](std::chrono::milliseconds& dst) { dst = std::chrono::milliseconds(r.integer(node, full, 0, big)); };
        if (key == "ready_timeout_ms") ms(opts.kernel.ready_timeout);
        else if (key == "close_grace_ms") ms(opts.kernel.close_grace);
        else if (key == "shutdown_grace_ms") ms(opts.kernel.shutdown_grace);
        else if (key == "terminate_grace_ms") ms(opts.kernel.terminate_grace);
        else if (key == "heartbeat_interval_ms") ms(opts.kernel.heartbeat_interval);
        else if (key == "iopub_batch_ms")
          opts.kernel.iopub_batch = std::chrono::milliseconds(r.integer(node, full, 0, 1000));
        else if (key == "heartbeat_misses") opts.kernel.heartbeat_misses = int(r.integer(node, full, 1, 1000));
        else if (key == "launch_attempts") opts.kernel.launch_attempts = int(r.integer(node, full, 1, 100));
        else if (key == "transport") {
          opts.kernel.transport = r.str(node, full);
          if (opts.kernel.transport != "ipc" && opts.kernel.transport != "tcp")
            r.fail(full, "must be \"ipc\" or \"tcp\"");
        } else if (key == "tcp_kernelspecs") opts.kernel.tcp_kernelspecs = r.strings(node, full);
        else if (key == "orphan_timeout_seconds")
          opts.kernel.orphan_timeout = std::chrono::seconds(r.integer(node, full, 0, 30 * 86400));
        else r.fail(full, "unknown key");
      } else if (section == "records") {
        auto& rl = opts.records;
        if (key == "enabled") rl.enabled = r.boolean(node, full);
        else if (key == "max_jobs") rl.max_jobs = std::size_t(r.integer(node, full, 1, big));
        else if (key == "job_output_bytes") rl.job_output_bytes = std::size_t(r.integer(node, full, 1024, big));
        else if (key == "job_code_bytes") rl.job_code_bytes = std::size_t(r.integer(node, full, 1024, big));
        else if (key == "budget_bytes") rl.budget_bytes = std::size_t(r.integer(node, full, 1 << 16, big));
        else if (key == "max_unseen_jobs") rl.max_unseen_jobs = std::size_t(r.integer(node, full, 1, big));
        else if (key == "claim_grace_seconds") rl.claim_grace = std::chrono::seconds(r.integer(node, full, 0, 86400));
        else if (key == "reply_grace_ms") rl.reply_grace = std::chrono::milliseconds(r.integer(node, full, 0, 600000));
        else if (key == "persist") rl.persist = r.boolean(node, full);
        else if (key == "sync_interval_ms") rl.sync_interval = std::chrono::milliseconds(r.integer(node, full, 10, 60000));
        else if (key == "max_waiters") opts.max_waiters = std::size_t(r.integer(node, full, 1, 1 << 20));
        else if (key == "output_bytes") rl.outputs.output_bytes = std::size_t(r.integer(node, full, 1024, big));
        else if (key == "cell_output_bytes") rl.outputs.cell_bytes = std::size_t(r.integer(node, full, 1024, big));
        else if (key == "kernel_output_disk_bytes")
          rl.outputs.kernel_disk_bytes = std::size_t(r.integer(node, full, 0, big));
        else r.fail(full, "unknown key");
      } else if (section == "discovery") {
        auto& d = opts.discovery;
        auto ms = [&](std::chrono::milliseconds& dst, std::int64_t lo) {
          dst = std::chrono::milliseconds(r.integer(node, full, lo, 86400000));
        };
        if (key == "interpreters") d.interpreters = r.boolean(node, full);
        else if (key == "watch_interval_ms") ms(d.watch_interval, 100);
        else if (key == "rescan_seconds") d.rescan_interval = std::chrono::seconds(r.integer(node, full, 1, 86400));
        else if (key == "probe_timeout_ms") ms(d.probe_timeout, 100);
        else if (key == "request_wait_ms") ms(d.request_wait, 0);
        else r.fail(full, "unknown key");
      } else if (section == "culling") {
        auto& c = opts.culling;
        if (key == "cull_idle_timeout") c.idle_timeout = std::chrono::seconds(r.integer(node, full, 0, 31536000));
        else if (key == "cull_interval") c.interval = std::chrono::seconds(r.integer(node, full, 1, 86400));
        else if (key == "cull_connected") c.connected = r.boolean(node, full);
        else if (key == "cull_busy") c.busy = r.boolean(node, full);
        else if (key == "auto_kernel_grace_seconds")
          c.auto_kernel_grace = std::chrono::seconds(r.integer(node, full, 0, 86400));
        else r.fail(full, "unknown key");
      } else if (section == "remote") {
        if (key == "registration_ip") {
          opts.kernel.registration_ip = r.str(node, full);
          in_addr a{};
          if (::inet_pton(AF_INET, opts.kernel.registration_ip.c_str(), &a) != 1)
            r.fail(full, "must be an IPv4 address of this host that the nodes reach");
        } else if (key == "registration_port") opts.kernel.registration_port = int(r.integer(node, full, 0, 65535));
        else if (key == "registration_timeout_seconds")
          opts.kernel.registration_timeout = std::chrono::seconds(r.integer(node, full, 5, 86400));
        else if (key == "link_timeout_seconds")
          opts.kernel.link_timeout = std::chrono::seconds(r.integer(node, full, 5, 86400));
        else if (key == "scheduler_poll_ms")
          opts.kernel.scheduler_poll = std::chrono::milliseconds(r.integer(node, full, 200, 600000));
        else r.fail(full, "unknown key");
      } else if (section == "pool") {
        using Pool = GatewayOptions::Pool;
        if (key == "size") opts.pool.size = std::size_t(r.integer(node, full, 0, Pool::kMaxPerSpec));
        else if (key == "kernels") {
          auto t = node.as_table();
          if (!t) r.fail(full, "must be a table of kernelspec name = number of warm kernels");
          opts.pool.kernels.clear();
          for (auto& [name, n] : *t)
            opts.pool.kernels[std::string(name.str())] =
                std::size_t(r.integer(n, full + "." + std::string(name.str()), 0, Pool::kMaxPerSpec));
        } else r.fail(full, "unknown key");
      } else {
        r.fail(section, "unknown section (expected [server], [limits], [kernel], [records], [discovery], [culling] or [pool])");
      }
    }
  }
  std::size_t total = opts.pool.size;
  for (auto& [name, n] : opts.pool.kernels) total += n;
  if (total > GatewayOptions::Pool::kMaxTotal)
    r.fail("pool", "asks for " + std::to_string(total) + " warm kernels in all; at most " +
                       std::to_string(GatewayOptions::Pool::kMaxTotal));
}

std::string unsafe_settings(const GatewayOptions& opts) {
  if (opts.token_source != TokenSource::none) return "";
  if (opts.tcp && !is_loopback_address(opts.ip))
    return "refusing to listen on " + opts.ip +
           " without a token: anyone who can reach it could run code as you. Leave out --no-token "
           "(and token = \"\" in kgate.toml), or bind 127.0.0.1";
  for (const auto& o : opts.allow_origins) {
    if (o == "*")
      return "refusing allow_origins = [\"*\"] without a token: any web page could run code as you. "
             "Leave out --no-token (and token = \"\"), or list the origins";
    // A sandboxed iframe, a data: URL or a file page sends `Origin: null`: any page can be one.
    if (o == "null")
      return "refusing allow_origins = [\"null\"] without a token: any web page can send Origin: null "
             "(from a sandboxed iframe), so it is as open as \"*\". Leave out --no-token (and token = \"\"), "
             "or list the origins";
  }
  return "";
}

}  // namespace kgate::gw
