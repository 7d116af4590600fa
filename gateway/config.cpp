// kgate.toml: reads the config file into GatewayOptions (CLI flags are applied after it).
#include "config.hpp"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "kgate/connection.hpp"

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
    if (!sec) r.fail(section, "must be a table ([server], [limits], [kernel], [records], [discovery], [culling] or [pool])");
    if (section != "server" && section != "limits" && section != "kernel" && section != "records" &&
        section != "discovery" && section != "culling" && section != "pool")
      r.fail(section, "unknown section (expected [server], [limits], [kernel], [records], [discovery], [culling] or [pool])");
    for (auto& entry : *sec) {
      const toml::node& node = entry.second;  // not a structured binding: lambdas below capture it
      std::string key(entry.first.str());
      std::string full = section + "." + key;
      if (section == "server") {
        if (key == "ip") opts.ip = r.str(node, full);
        else if (key == "port") opts.port = int(r.integer(node, full, 0, 65535));
        else if (key == "token") opts.token = r.str(node, full);
        else if (key == "token_file") {
          std::string file = r.str(node, full);
          std::ifstream in(file);
          if (!in) r.fail(full, "cannot read " + file);
          std::string line;
          std::getline(in, line);
          while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
          if (line.empty()) r.fail(full, file + " is empty: its first line must be the token");
          opts.token = line;
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
        else if (key == "shutdown_grace_ms") ms(opts.kernel.shutdown_grace);
        else if (key == "terminate_grace_ms") ms(opts.kernel.terminate_grace);
        else if (key == "heartbeat_interval_ms") ms(opts.kernel.heartbeat_interval);
        else if (key == "heartbeat_misses") opts.kernel.heartbeat_misses = int(r.integer(node, full, 1, 1000));
        else if (key == "launch_attempts") opts.kernel.launch_attempts = int(r.integer(node, full, 1, 100));
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

}  // namespace kgate::gw
