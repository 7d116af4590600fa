// The job records on disk (see record_log.hpp and DEV.md §4e).
#include "kgate/record_log.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "kgate/connection.hpp"
#include "kgate/process.hpp"

namespace kgate {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormat = "kgate-records";
constexpr const char* kSuffix = ".log";
// How long the thread lets appends gather after the first one wakes it: what a kill -9 of kgate
// can lose at most, beside what a power loss can (sync_interval).
constexpr std::chrono::milliseconds kGather{2};

std::string header_line(const std::string& kernel) {
  return json{{"format", kFormat}, {"version", RecordLog::kVersion}, {"kernel", kernel}}.dump();
}

// A kernel id that is safe as a file name (kgate's are UUIDs; a client may choose its own).
bool usable_id(const std::string& id) {
  return !id.empty() && id.size() <= 200 && id.front() != '.' && id.find('/') == std::string::npos &&
         id.find('\0') == std::string::npos;
}

bool write_all(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = ::write(fd, s.data(), s.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    s.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

}  // namespace

RecordLog::RecordLog(Options opts) : opts_(std::move(opts)) {
  if (enabled())
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "kgate-records");
      block_async_signals_in_this_thread();  // SIGTERM and SIGHUP are the Asio thread's
      run();
    });
}

RecordLog::~RecordLog() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();  // it applies and syncs the queue before it ends
  for (auto& [_, f] : files_) ::close(f.fd);
}

fs::path RecordLog::path_of(const std::string& kernel) const { return opts_.dir / (kernel + kSuffix); }

void RecordLog::ensure_dir() {
  if (dir_ready_) return;
  ensure_private_dir(opts_.dir);  // throws with the reason
  dir_ready_ = true;
}

bool RecordLog::append(const std::string& kernel, std::string_view line) {
  if (!enabled() || !usable_id(kernel)) return false;
  bool wake;
  {
    std::lock_guard lk(mu_);
    wake = queue_.empty();
    if (!queue_.empty() && queue_.back().kind == Op::append && queue_.back().kernel == kernel) {
      queue_.back().text.append(line);  // one write for a burst
      queue_.back().text.push_back('\n');
    } else {
      std::string text;
      text.reserve(line.size() + 1);
      text.append(line);
      text.push_back('\n');
      queue_.push_back(Op{Op::append, kernel, std::move(text)});
      ++queued_;
    }
    auto [it, fresh] = sizes_.try_emplace(kernel, 0);
    if (fresh) it->second = header_line(kernel).size() + 1;
    it->second += line.size() + 1;
  }
  if (wake) cv_.notify_one();
  return true;
}

bool RecordLog::rewrite(const std::string& kernel, const std::vector<std::string>& lines) {
  if (!enabled() || !usable_id(kernel)) return false;
  std::string text = header_line(kernel) + "\n";
  for (const auto& l : lines) {
    text += l;
    text += '\n';
  }
  {
    std::lock_guard lk(mu_);
    sizes_[kernel] = text.size();
    queue_.push_back(Op{Op::rewrite, kernel, std::move(text)});
    ++queued_;
  }
  cv_.notify_one();
  return true;
}

void RecordLog::remove(const std::string& kernel) {
  if (!enabled() || !usable_id(kernel)) return;
  {
    std::lock_guard lk(mu_);
    sizes_.erase(kernel);
    queue_.push_back(Op{Op::remove, kernel, {}});
    ++queued_;
  }
  cv_.notify_one();
}

std::uint64_t RecordLog::size(const std::string& kernel) const {
  std::lock_guard lk(mu_);
  auto it = sizes_.find(kernel);
  return it == sizes_.end() ? 0 : it->second;
}

void RecordLog::save_counter(std::uint64_t counter) {
  if (!enabled()) return;
  try {
    ensure_private_dir(opts_.dir);
    write_file_atomically(opts_.dir / "counter",
                          json{{"format", "kgate-records-counter"}, {"version", kVersion}, {"last_job", counter}}.dump() +
                              "\n");
  } catch (const std::exception& e) {
    spdlog::warn("records: cannot save the job counter ({}); a later kgate may number jobs again from an "
                 "earlier one",
                 e.what());
  }
}

void RecordLog::flush() {
  if (!enabled()) return;
  std::unique_lock lk(mu_);
  const std::uint64_t target = queued_;
  flush_wanted_ = true;
  cv_.notify_one();
  done_cv_.wait(lk, [&] { return applied_ >= target; });
}

void RecordLog::fail(const std::string& kernel, const std::string& why) {
  if (failed_.insert(kernel).second)
    spdlog::warn("kernel {}: its records are not kept on disk ({}); a later kgate will not have them", kernel, why);
}

void RecordLog::close_file(const std::string& kernel) {
  if (auto it = files_.find(kernel); it != files_.end()) {
    if (it->second.dirty) ::fdatasync(it->second.fd);
    ::close(it->second.fd);
    files_.erase(it);
  }
}

void RecordLog::apply(std::vector<Op>& ops) {
  for (auto& op : ops) {
    const fs::path path = path_of(op.kernel);
    try {
      if (op.kind == Op::append) {
        auto it = files_.find(op.kernel);
        if (it == files_.end()) {
          ensure_dir();
          const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
          if (fd < 0) throw std::runtime_error("cannot open " + path.string() + ": " + std::strerror(errno));
          it = files_.emplace(op.kernel, File{fd, false}).first;
          if (::lseek(fd, 0, SEEK_END) == 0) op.text.insert(0, header_line(op.kernel) + "\n");
        }
        it->second.dirty = true;
        if (!write_all(it->second.fd, op.text))
          throw std::runtime_error("cannot write " + path.string() + ": " + std::strerror(errno));
      } else if (op.kind == Op::rewrite) {
        close_file(op.kernel);
        ensure_dir();
        write_file_atomically(path, op.text);
        failed_.erase(op.kernel);
      } else {
        close_file(op.kernel);
        std::error_code ec;
        fs::remove(path, ec);
        failed_.erase(op.kernel);
      }
    } catch (const std::exception& e) {
      fail(op.kernel, e.what());
    }
  }
}

void RecordLog::sync_files() {
  for (auto& [_, f] : files_)
    if (f.dirty) {
      ::fdatasync(f.fd);
      f.dirty = false;
    }
}

void RecordLog::run() {
  using Clock = std::chrono::steady_clock;
  auto next_sync = Clock::now() + opts_.sync_interval;
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait_until(lk, next_sync, [this] { return stop_ || flush_wanted_ || !queue_.empty(); });
    // A cell's lines come in a burst (created, began, ended within a few ms): gather it into one
    // pass, one wake-up and one write, rather than one each.
    if (!stop_ && !flush_wanted_ && !queue_.empty())
      cv_.wait_for(lk, kGather, [this] { return stop_ || flush_wanted_; });
    std::vector<Op> ops;
    ops.swap(queue_);
    const std::uint64_t upto = queued_;
    const bool stopping = stop_, flushing = flush_wanted_;
    flush_wanted_ = false;
    lk.unlock();
    apply(ops);
    const auto now = Clock::now();
    const bool synced = stopping || flushing || now >= next_sync;
    if (synced) {
      sync_files();
      next_sync = now + opts_.sync_interval;
    }
    lk.lock();
    if (synced) {
      applied_ = upto;
      done_cv_.notify_all();
    }
    if (stopping && queue_.empty()) return;
  }
}

RecordLog::Loaded RecordLog::load(const std::set<std::string>& keep) {
  Loaded out;
  if (!enabled()) return out;
  std::error_code ec;
  if (!fs::is_directory(opts_.dir, ec)) return out;
  {
    std::ifstream in(opts_.dir / "counter");
    std::stringstream ss;
    ss << in.rdbuf();
    json c = json::parse(ss.str(), nullptr, false);
    if (in && c.is_object() && c.value("format", "") == "kgate-records-counter") {
      auto it = c.find("last_job");
      if (it != c.end() && it->is_number_unsigned()) out.counter = it->get<std::uint64_t>();
    }
  }
  for (const auto& entry : fs::directory_iterator(opts_.dir, ec)) {
    const fs::path path = entry.path();
    if (path.extension() != kSuffix || !entry.is_regular_file(ec)) continue;
    const std::string id = path.stem().string();
    if (!keep.count(id)) {
      fs::remove(path, ec);  // its kernel is not in the kernel table: it is gone
      continue;
    }
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    auto set_aside = [&](const std::string& why) {
      out.problems.push_back(path.string() + ": " + why + "; set aside as " + path.filename().string() + ".bad");
      fs::rename(path, fs::path(path.string() + ".bad"), ec);
    };
    std::size_t nl = text.find('\n');
    json head = json::parse(text.substr(0, nl), nullptr, false);
    if (nl == std::string::npos || !head.is_object() || head.value("format", "") != kFormat ||
        head.value("kernel", "") != id) {
      set_aside("not a kgate records log (its first line is not a header)");
      continue;
    }
    auto v = head.find("version");
    if (v == head.end() || !v->is_number_integer() || v->get<int>() < 1 || v->get<int>() > kVersion) {
      set_aside("a records log of another version (this kgate reads 1 to " + std::to_string(kVersion) + ")");
      continue;
    }
    auto& lines = out.logs[id];
    std::size_t at = nl + 1;
    while (at < text.size()) {
      std::size_t end = text.find('\n', at);
      if (end == std::string::npos) {
        out.problems.push_back(path.string() + ": its last line was cut short (kgate was killed while writing "
                               "it); that record is dropped");
        break;
      }
      if (end > at) lines.emplace_back(text, at, end - at);
      at = end + 1;
    }
  }
  return out;
}

}  // namespace kgate
