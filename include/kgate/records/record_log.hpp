// The job records on disk: one append-only log per kernel in <state dir>/records/, so that a later
// kgate that re-adopts the kernel has its records too (docs/dev/readoption.md).
//
// A log is lines of JSON: a header line ({"format": "kgate-records", "version": 1, "kernel": id})
// and then the lines the job store appends (JobStore says what they hold).  Each append is one
// write(2) on the caller's thread, straight into the page cache, so a kill -9 of kgate loses
// nothing appended before it; the kgate-records thread fdatasync()s the logs written to every
// sync_interval (and the directory after a log was created or replaced), so a power loss loses
// at most that much, and no caller waits on the disk.  A kill -9 in the middle of a write
// leaves a torn last line: load() reports and drops it.  rewrite() replaces a log whole (a
// temporary file renamed over it; synced by the thread like an append): the store compacts a
// log with it once it has grown well past what it describes.
//
// Thread safety: every member may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace kgate {

class RecordLog {
 public:
  static constexpr int kVersion = 1;

  struct Options {
    std::filesystem::path dir;  // empty: a log that keeps nothing
    std::chrono::milliseconds sync_interval{500};
  };
  explicit RecordLog(Options opts);
  ~RecordLog();  // syncs what was written, and stops the thread
  RecordLog(const RecordLog&) = delete;
  RecordLog& operator=(const RecordLog&) = delete;

  bool enabled() const { return !opts_.dir.empty(); }
  const std::filesystem::path& dir() const { return opts_.dir; }

  // Appends `line` (one line of JSON, no newline) to `kernel`'s log, created with its header.
  // False for a kernel id that cannot be a file name, or when the write failed (logged once per
  // kernel; the records in memory are unaffected).
  bool append(const std::string& kernel, std::string_view line);
  // Replaces `kernel`'s log with `lines` (each one line, no newline), atomically.
  bool rewrite(const std::string& kernel, const std::vector<std::string>& lines);
  // Removes `kernel`'s log.
  void remove(const std::string& kernel);
  // Bytes in `kernel`'s log.
  std::uint64_t size(const std::string& kernel) const;

  // The highest job number handed out, kept in <dir>/counter so that job numbers continue even
  // when the logs that held the last ones are gone.  Written at once.
  void save_counter(std::uint64_t counter);

  struct Loaded {
    std::map<std::string, std::vector<std::string>> logs;  // kernel id -> its lines, header dropped
    std::vector<std::string> problems;  // one sentence per log (or line) set aside
    std::uint64_t counter = 0;
  };
  // Reads every log (before the first append).  A log with no valid header, or of a newer
  // version, is set aside as <id>.log.bad and reported; a torn last line is dropped and
  // reported.  Logs of kernels not in `keep` are removed (their kernels are gone).
  Loaded load(const std::set<std::string>& keep);

  // fdatasync()s every log written to, now (the thread does it every sync_interval).
  void sync();

 private:
  struct File {
    int fd = -1;
    std::uint64_t size = 0;
    bool dirty = false;  // written since the last fdatasync (guarded by mu_)
    ~File();
  };
  std::filesystem::path path_of(const std::string& kernel) const;
  std::shared_ptr<File> open_locked(const std::string& kernel, bool fresh);
  void fail_locked(const std::string& kernel, const std::string& why);
  void run();

  const Options opts_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool dir_ready_ = false;
  bool dir_dirty_ = false;  // a log was created or renamed into place since the last sync
  std::map<std::string, std::shared_ptr<File>> files_;
  std::set<std::string> failed_;  // kernels whose write failure was logged
  std::thread thread_;
};

}  // namespace kgate
