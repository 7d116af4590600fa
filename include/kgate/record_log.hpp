// The job records on disk: one append-only log per kernel in <state dir>/records/, so that a later
// kgate that re-adopts the kernel has its records too (DEV.md §4e).
//
// A log is lines of JSON: a header line ({"format": "kgate-records", "version": 1, "kernel": id})
// and then the lines the job store appends (JobStore says what they hold).  Callers only queue
// their appends, rewrites and removals (a copy under a mutex); the kgate-records thread applies
// them in order at once: one write(2) per log per pass, straight into the page cache, so a
// kill -9 of kgate loses only what was still queued (microseconds' worth).  It fdatasync()s the
// logs it wrote to every sync_interval, so a power loss loses at most that much.  A kill -9 in
// the middle of a write leaves a torn last line: load() reports and drops it.  A rewrite replaces
// a log whole (temp file, fsync, rename): the store compacts a log with it once it has grown
// well past what it describes.
//
// Thread safety: every member may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <map>
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
  ~RecordLog();  // applies and syncs what was queued, then stops the thread
  RecordLog(const RecordLog&) = delete;
  RecordLog& operator=(const RecordLog&) = delete;

  bool enabled() const { return !opts_.dir.empty(); }
  const std::filesystem::path& dir() const { return opts_.dir; }

  // Queues `line` (one line of JSON, no newline) for `kernel`'s log, created with its header.
  // False for a kernel id that cannot be a file name.  A failed write is logged once per kernel
  // (the records in memory are unaffected).
  bool append(const std::string& kernel, std::string_view line);
  // Queues the replacement of `kernel`'s log by `lines` (each one line, no newline).
  bool rewrite(const std::string& kernel, const std::vector<std::string>& lines);
  // Queues the removal of `kernel`'s log.
  void remove(const std::string& kernel);
  // Bytes in `kernel`'s log once the queue is applied.
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

  // Returns once everything queued before the call is written and fdatasync'd.
  void flush();

 private:
  struct Op {
    enum Kind { append, rewrite, remove } kind;
    std::string kernel;
    std::string text;  // append: lines with their newlines; rewrite: the whole file
  };
  struct File {
    int fd = -1;
    bool dirty = false;  // written since the last fdatasync
  };
  std::filesystem::path path_of(const std::string& kernel) const;
  void ensure_dir();
  void run();
  void apply(std::vector<Op>& ops);
  void sync_files();
  void close_file(const std::string& kernel);
  void fail(const std::string& kernel, const std::string& why);

  const Options opts_;
  mutable std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  bool stop_ = false;
  bool flush_wanted_ = false;
  std::vector<Op> queue_;
  std::uint64_t queued_ = 0, applied_ = 0;      // ops queued / applied and synced (flush)
  std::map<std::string, std::uint64_t> sizes_;  // each log's size once the queue is applied
  // The thread's own: open logs, failures logged, whether the directory exists.
  std::map<std::string, File> files_;
  std::set<std::string> failed_;
  bool dir_ready_ = false;
  std::thread thread_;
};

}  // namespace kgate
