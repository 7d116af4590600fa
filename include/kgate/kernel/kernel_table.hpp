// The kernel table: one file per kernel in <state dir>/kernels/, so that a later kgate can
// re-adopt kernels that outlived this one (docs/dev/readoption.md).
//
// Each file is <id>.json, 0600, written to a temporary file, fsync'd and renamed over the old
// one: a kill -9 at any instant leaves either the old entry or the new one.  A file that does
// not parse, or that a newer kgate wrote (a higher "version"), is reported and set aside as
// <id>.json.bad, never fatal.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kgate/jupyter/connection.hpp"
#include "kgate/jupyter/kernelspec.hpp"

namespace kgate {

struct KernelTableEntry {
  static constexpr int kVersion = 1;

  std::string id;
  bool pooled = false;                       // a warm-pool kernel not yet handed out
  KernelSpec spec;
  ConnectionInfo conn;
  std::filesystem::path connection_file;
  int pid = 0;                               // the kernel process
  unsigned long long pid_start = 0;          // its start time: a reused pid never matches
  std::string supervisor;                    // its kgate-supervise's abstract socket name
  int supervisor_pid = 0;                    // that kgate-supervise's pid (0: not recorded, an older entry)
  std::optional<std::chrono::milliseconds> cull_idle_timeout;
  // The agent whose conversation made it as its auto kernel ("" for none): the next kgate stops it
  // once that agent is gone, as this one would have (README "The end of a conversation").
  std::string conversation;
  std::int64_t created_unix_ms = 0;          // when the kernel was started (wall clock)
  // Its last activity, saved when kgate left it running (SIGTERM); 0 = not known (a kgate that
  // was killed saved none): the next kgate's cull clock then starts at the re-adoption.
  std::int64_t last_activity_unix_ms = 0;
  // A remote launcher's kernel (docs/dev/remote-launchers.md), null for a local one: the launcher as it was
  // configured ("launcher"), "slurm_job", "registered" (false: its job was still queued),
  // "control_link_port" and "placement".
  nlohmann::json remote;

  nlohmann::json to_json() const;
  // Throws std::runtime_error naming the field that is missing or of the wrong type.
  static KernelTableEntry from_json(const nlohmann::json& j);
};

class KernelTable {
 public:
  // `dir` is created 0700 on the first save.  An empty dir makes a table that keeps nothing.
  explicit KernelTable(std::filesystem::path dir) : dir_(std::move(dir)) {}

  bool enabled() const { return !dir_.empty(); }
  const std::filesystem::path& dir() const { return dir_; }

  // Throws std::runtime_error with the path and the reason.
  void save(const KernelTableEntry& e) const;
  // Removes the entry; nothing if there is none.
  void remove(const std::string& id) const;

  struct Loaded {
    std::vector<KernelTableEntry> entries;
    std::vector<std::string> problems;  // one sentence per file set aside
  };
  Loaded load() const;

 private:
  std::filesystem::path dir_;
};

}  // namespace kgate
