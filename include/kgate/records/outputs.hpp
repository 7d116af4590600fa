// Every output of a recorded cell, kept as nbformat outputs in the order it came
// (docs/dev/records.md "Outputs"): stream text with stdout and stderr interleaved as they
// arrived, display_data and execute_result with every MIME type, update_display_data applied by
// display_id (across the kernel's cells), clear_output (wait=True too), and errors.
//
// A MIME value larger than `inline_bytes` is not kept in memory but in a content-addressed file
// (BlobStore: <dir>/<sha-256>, 0600, written once and shared by every output with the same bytes).
// Bounded per output, per cell and per kernel on disk: what is past a limit is replaced by a note
// (a stderr stream output starting "[kgate]") that says what was dropped and why, never silently.
//
// Not thread-safe: the JobStore calls it under its own lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kgate {

using json = nlohmann::json;

// Defaults are in config/kgate.toml ([records] output_bytes, cell_output_bytes,
// kernel_output_disk_bytes) and docs/dev/limits.md.
struct OutputLimits {
  std::size_t output_bytes = 16u << 20;        // one output's data (all its MIME values)
  std::size_t cell_bytes = 64u << 20;          // every rich output of one cell
  std::size_t kernel_disk_bytes = 256u << 20;  // the files one kernel's outputs refer to
  std::size_t inline_bytes = 8u << 10;         // a MIME value past this is kept in a file
};

// Content-addressed values: one file per distinct value, reference-counted.  With an empty
// directory the values are kept in memory (records that are not persisted).
class BlobStore {
 public:
  explicit BlobStore(std::filesystem::path dir = {});
  BlobStore(const BlobStore&) = delete;
  BlobStore& operator=(const BlobStore&) = delete;

  // Keeps `bytes` (or adds a reference to the same bytes kept before); returns its id, the
  // SHA-256 in hex.  Throws std::runtime_error when the file cannot be written.
  std::string put(std::string_view bytes);
  // Another reference to a value already kept (an output read back from disk); false when there
  // is no such value.
  bool hold(const std::string& id);
  std::optional<std::string> get(const std::string& id) const;
  // One reference less; the value (its file) goes with the last.
  void release(const std::string& id);
  // Removes the folder's files no reference holds (and unfinished writes); returns how many.
  std::size_t collect();
  std::size_t count() const { return refs_.size(); }
  std::size_t bytes() const { return bytes_; }

 private:
  std::filesystem::path dir_;
  struct Entry {
    std::size_t refs = 0;
    std::size_t size = 0;
  };
  std::map<std::string, Entry> refs_;
  std::map<std::string, std::string> memory_;  // the values, without a directory
  std::size_t bytes_ = 0;
  bool dir_ready_ = false;
};

// The outputs of the cells of all kernels, by job number.
class OutputStore {
 public:
  explicit OutputStore(OutputLimits limits = {}, std::filesystem::path blob_dir = {});

  // Stream text of job `job` (of `kernel`): bytes [from, to) of the job's stream text (which the
  // record keeps, the tail, in its TailText), from stderr or stdout.  Consecutive chunks of one
  // stream are one output.
  void stream(const std::string& kernel, std::uint64_t job, bool is_stderr, std::size_t from, std::size_t to);
  // display_data, execute_result, error, update_display_data or clear_output of job `job`, with
  // its content as the kernel sent it.  Other message types are ignored.
  void message(const std::string& kernel, std::uint64_t job, std::string_view msg_type, json content);
  // The job's outputs as nbformat 4 outputs, files read back: `stream_text` is the job's kept
  // stream text, `stream_cut` how many bytes were cut from its front.
  json nbformat(std::uint64_t job, std::string_view stream_text, std::size_t stream_cut) const;
  bool has(std::uint64_t job) const { return cells_.count(job) != 0; }
  // The job's outputs as its record on disk keeps them (files by id), and read back: a value
  // whose file is gone becomes a note.
  json save(std::uint64_t job) const;
  void load(const std::string& kernel, std::uint64_t job, const json& saved);
  // Removes the files of the folder that no output refers to; returns how many.
  std::size_t collect() { return blobs_.collect(); }
  // The job's record went: its outputs go, and the files no other output refers to.
  void drop(std::uint64_t job);
  std::size_t kernel_disk_bytes(const std::string& kernel) const;
  std::size_t memory_bytes() const { return memory_bytes_; }
  const BlobStore& blobs() const { return blobs_; }
  const OutputLimits& limits() const { return limits_; }

 private:
  struct Out {
    enum class Kind { stream, rich } kind = Kind::rich;
    bool is_stderr = false;
    std::size_t from = 0, to = 0;  // stream: bytes of the job's stream text
    json output;                   // rich: the nbformat output, big values as {"kgate_blob": id}
    std::string display_id;
    std::size_t bytes = 0;         // rich: its data's bytes, files included
    std::size_t held = 0;          // rich: what of it is kept in memory (memory_bytes)
  };
  struct Cell {
    std::string kernel;
    std::vector<Out> outs;
    bool clear_pending = false;    // clear_output(wait=True): cleared at the next output
    std::size_t rich_bytes = 0;
    bool cell_note = false;        // the per-cell limit's note is in
  };
  struct Kernel {
    std::size_t disk = 0;
    bool disk_note = false;
    std::map<std::string, std::set<std::uint64_t>> displays;  // display_id -> jobs showing it
  };

  Cell& cell(const std::string& kernel, std::uint64_t job);
  void apply_clear(Cell& c);
  // The output's big values into files (counted against the kernel's disk); `bytes` its data's
  // size, `held` what stays in memory. False with `why` when a limit stops it (no file is kept).
  bool store_data(Cell& c, Kernel& k, json& data, std::size_t& bytes, std::size_t& held, std::string& why);
  // Adds `o` to the cell, counting what it holds in memory.
  void keep(Cell& c, Out o);
  // Gives back what `o` holds: its files, its bytes in the cell's and the kernel's counts.
  void release(Cell& c, Kernel& k, Out& o);
  void note(Cell& c, const std::string& text);
  void update_display(const std::string& kernel, const std::string& display_id, const json& content);

  OutputLimits limits_;
  BlobStore blobs_;
  std::map<std::uint64_t, Cell> cells_;
  std::map<std::string, Kernel> kernels_;
  std::size_t memory_bytes_ = 0;
};

}  // namespace kgate
