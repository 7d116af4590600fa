// The job records on disk (see record_log.hpp and docs/dev/readoption.md).
#include "kgate/records/record_log.hpp"

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

#include "kgate/jupyter/connection.hpp"
#include "kgate/process/process.hpp"
#include "kgate/jupyter/wire.hpp"

namespace kgate {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormat = "kgate-records";
constexpr const char* kSuffix = ".log";

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

RecordLog::File::~File() {
  if (fd >= 0) ::close(fd);
}

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
  if (thread_.joinable()) thread_.join();
  sync();
}

fs::path RecordLog::path_of(const std::string& kernel) const { return opts_.dir / (kernel + kSuffix); }

void RecordLog::fail_locked(const std::string& kernel, const std::string& why) {
  if (failed_.insert(kernel).second)
    spdlog::warn("kernel {}: its records are not kept on disk ({}); a later kgate will not have them", kernel, why);
}

// The open log of `kernel`; `fresh`: the file was just renamed into place (do not add a header).
std::shared_ptr<RecordLog::File> RecordLog::open_locked(const std::string& kernel, bool fresh) {
  if (!fresh)
    if (auto it = files_.find(kernel); it != files_.end()) return it->second;
  if (!dir_ready_) {
    ensure_private_dir(opts_.dir);  // throws with the reason
    dir_ready_ = true;
  }
  const fs::path path = path_of(kernel);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error("cannot open " + path.string() + ": " + std::strerror(errno));
  auto f = std::make_shared<File>();
  f->fd = fd;
  const off_t end = ::lseek(fd, 0, SEEK_END);
  f->size = end > 0 ? static_cast<std::uint64_t>(end) : 0;
  if (f->size == 0) {
    std::string head = header_line(kernel) + "\n";
    if (!write_all(fd, head)) throw std::runtime_error("cannot write " + path.string() + ": " + std::strerror(errno));
    f->size = head.size();
    f->dirty = true;
    dir_dirty_ = true;
  }
  files_[kernel] = f;
  return f;
}

bool RecordLog::append(const std::string& kernel, std::string_view line) {
  if (!enabled() || !usable_id(kernel)) return false;
  std::string buf;
  buf.reserve(line.size() + 1);
  buf.append(line);
  buf.push_back('\n');
  std::lock_guard lk(mu_);
  try {
    auto f = open_locked(kernel, false);
    if (!write_all(f->fd, buf))
      throw std::runtime_error("cannot write " + path_of(kernel).string() + ": " + std::strerror(errno));
    f->size += buf.size();
    f->dirty = true;
    return true;
  } catch (const std::exception& e) {
    fail_locked(kernel, e.what());
    return false;
  }
}

bool RecordLog::rewrite(const std::string& kernel, const std::vector<std::string>& lines) {
  if (!enabled() || !usable_id(kernel)) return false;
  std::string text = header_line(kernel) + "\n";
  for (const auto& l : lines) {
    text += l;
    text += '\n';
  }
  std::lock_guard lk(mu_);
  const fs::path path = path_of(kernel);
  const fs::path tmp = opts_.dir / ("." + kernel + kSuffix + "." + new_hex_id() + ".tmp");
  try {
    if (!dir_ready_) {
      ensure_private_dir(opts_.dir);
      dir_ready_ = true;
    }
    // No fsync here: a kill -9 cannot lose what write(2) took; a power loss is the thread's
    // (it syncs the new file and the directory at its next pass).
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) throw std::runtime_error("cannot create " + tmp.string() + ": " + std::strerror(errno));
    const bool ok = write_all(fd, text);
    const int err = errno;
    ::close(fd);
    if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
      const int e2 = ok ? errno : err;
      ::unlink(tmp.c_str());
      throw std::runtime_error("cannot write " + path.string() + ": " + std::strerror(e2));
    }
    auto f = open_locked(kernel, true);
    f->dirty = true;
    dir_dirty_ = true;
    failed_.erase(kernel);
    return true;
  } catch (const std::exception& e) {
    files_.erase(kernel);
    fail_locked(kernel, e.what());
    return false;
  }
}

void RecordLog::remove(const std::string& kernel) {
  if (!enabled() || !usable_id(kernel)) return;
  std::lock_guard lk(mu_);
  files_.erase(kernel);  // the thread may still hold it to sync: the fd closes after that
  failed_.erase(kernel);
  std::error_code ec;
  fs::remove(path_of(kernel), ec);
}

std::uint64_t RecordLog::size(const std::string& kernel) const {
  std::lock_guard lk(mu_);
  if (auto it = files_.find(kernel); it != files_.end()) return it->second->size;
  std::error_code ec;
  auto n = fs::file_size(path_of(kernel), ec);
  return ec ? 0 : n;
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

void RecordLog::sync() {
  std::vector<std::shared_ptr<File>> dirty;
  bool dir = false;
  {
    std::lock_guard lk(mu_);
    for (auto& [_, f] : files_)
      if (f->dirty) {
        f->dirty = false;
        dirty.push_back(f);
      }
    std::swap(dir, dir_dirty_);
  }
  for (auto& f : dirty) ::fdatasync(f->fd);  // the shared_ptr keeps the fd open meanwhile
  if (dir)
    if (const int dfd = ::open(opts_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
}

void RecordLog::run() {
  std::unique_lock lk(mu_);
  while (!stop_) {
    cv_.wait_for(lk, opts_.sync_interval, [this] { return stop_; });
    if (stop_) break;
    lk.unlock();
    sync();
    lk.lock();
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
