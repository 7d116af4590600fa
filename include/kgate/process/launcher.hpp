// Remote launchers (docs/dev/remote-launchers.md): kernels started as Slurm jobs or on SSH hosts, by a node-side
// launcher (`kgate node-launch`) that picks the ports, writes the connection file, starts the
// kernel under a supervisor loop and registers back with one signed message.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kgate/jupyter/wire.hpp"

namespace kgate {

// One [launchers.NAME] of kgate.toml.  `local` (the default) is none of these.
struct LauncherConfig {
  enum class Kind { slurm, ssh };
  std::string name;
  Kind kind = Kind::slurm;
  // Slurm: sbatch's --partition, --time, --gres, --account, --cpus-per-task, --mem, and more
  // arguments as given.  Empty = sbatch's (the cluster's) default.
  std::map<std::string, std::string> slurm;  // key (partition, time, ...) -> value
  std::vector<std::string> sbatch_args;
  // The kgate binary on the node (a node that shares kgate's filesystem: this one's path).
  std::filesystem::path kgate_path;
  // Where the node writes the kernel's connection file ("" = the node's Jupyter runtime dir).
  std::filesystem::path connection_dir;
  // Keys a POST may override with "kgate_launcher_options".
  std::vector<std::string> allow_override;
  // SSH: the system's OpenSSH client, always with BatchMode=yes (no prompt: an unknown host key
  // fails the start, as StrictHostKeyChecking in the user's ssh config says).
  std::string host, user;
  int port = 0;                          // 0 = ssh's (the ssh config's)
  std::filesystem::path identity_file;   // "" = ssh's
  std::vector<std::string> ssh_options;  // more -o options ("UserKnownHostsFile=...")
  // How kgate reaches the kernel's ports: false = directly at the host's address (the node
  // binds bind_ip); true = through the SSH connection's port forwarding (the node binds
  // 127.0.0.1; kgate keeps an `ssh -N -L ...` per kernel, and restarts it when it drops).
  bool forward = false;
  std::string bind_ip = "0.0.0.0";

  static const std::vector<std::string>& slurm_keys();  // partition, time, gres, ...
  std::string kind_name() const { return kind == Kind::slurm ? "slurm" : "ssh"; }
};
using LauncherPtr = std::shared_ptr<const LauncherConfig>;

// A launcher as the kernel table keeps it (the configuration it was started with).
json launcher_to_json(const LauncherConfig& l);
// Throws std::runtime_error when `j` is not what launcher_to_json wrote.
LauncherPtr launcher_from_json(const json& j);

// Applies a POST's "kgate_launcher_options" over a launcher: a copy with those keys changed.
// Throws std::invalid_argument naming the key when a key is not in allow_override, or a value
// is not a non-empty string of at most 256 printable characters.
LauncherPtr with_overrides(const LauncherConfig& base, const json& options);

// Whether a launcher can be used now (sbatch found, squeue answers), and why not.  Runs the
// scheduler's commands: blocks up to ~10 s.
struct LauncherStatus {
  bool usable = false;
  std::string reason;
};
LauncherStatus probe_launcher(const LauncherConfig& l);

// The sbatch command line that starts `kgate node-launch SPEC` as a job.
std::vector<std::string> sbatch_argv(const LauncherConfig& l, const std::string& kernel_id,
                                     const std::filesystem::path& spec_file,
                                     const std::filesystem::path& log_file);

// ssh's arguments for this launcher up to the host (BatchMode, port, identity, user, options).
std::vector<std::string> ssh_argv(const LauncherConfig& l);
// `ssh ... host -- KGATE node-launch -` (the launch spec goes on its stdin).
std::vector<std::string> ssh_launch_argv(const LauncherConfig& l);
// `ssh -N ... -L 127.0.0.1:local:127.0.0.1:remote ... host`: the forwards for one kernel.
std::vector<std::string> ssh_tunnel_argv(const LauncherConfig& l, const std::vector<int>& local,
                                         const std::vector<int>& remote);
// Runs ssh_launch_argv() with `spec_file` as stdin: the node launcher's report line, or why not.
struct SshLaunchResult {
  std::string line, error;
};
SshLaunchResult ssh_launch(const LauncherConfig& l, const std::filesystem::path& spec_file);
// The IPv4 address of `host` (getaddrinfo), or "" (then `why`).
std::string resolve_ipv4(const std::string& host, std::string* why = nullptr);

// Runs sbatch_argv(): the job id, or the error (sbatch's own message).
struct SubmitResult {
  std::string job_id, error;
};
SubmitResult slurm_submit(const std::vector<std::string>& argv);

// Where a Slurm job is: squeue's state (PENDING, RUNNING, ...), reason and node list.
struct SlurmJobState {
  std::string job_id, state, reason, node;
};
// One squeue call for these jobs; jobs squeue no longer lists are missing from the result.
// nullopt when squeue itself failed (then `why` says how).
std::optional<std::vector<SlurmJobState>> slurm_query(const std::vector<std::string>& job_ids,
                                                     std::string* why = nullptr);
// After a job ended: `scontrol show job` state and reason ("TIMEOUT (TimeLimit)"), or "".
std::string slurm_end_reason(const std::string& job_id);
// scancel; returns stderr on failure, "" on success.
std::string slurm_cancel(const std::string& job_id);

// ---- The registration (docs/dev/remote-launchers.md "Registration") ----
//
// kgate writes a launch spec (0600, on the shared filesystem or through the SSH channel) with
// the kernel's id, its connection key, a one-time registration secret and kgate's registration
// address.  The node launcher answers with one Jupyter-wire message on a DEALER to that address,
// msg_type "kgate_register", signed (HMAC-SHA256) with the secret: its header's msg_id is the
// nonce and its date must be fresh; content has ip, the five ports, control_port (the TCP
// control link), pid, start_time, hostname and the Slurm job id.  kgate answers
// "kgate_register_reply" {status: ok|error, reason}, signed with the same secret.
inline constexpr const char* kRegisterType = "kgate_register";
inline constexpr const char* kRegisterReplyType = "kgate_register_reply";
// A registration whose header.date is further than this from kgate's clock is refused as late.
inline constexpr std::chrono::seconds kRegistrationMaxSkew{60};

// The node side: `kgate node-launch SPEC_FILE` (a hidden subcommand).  Returns the exit code.
int node_launch(const std::filesystem::path& spec_file);

}  // namespace kgate
