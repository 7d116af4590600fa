// SessionStore (sessions.hpp): the sessions and their file.
#include "sessions.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "kgate/jupyter/connection.hpp"

namespace kgate::gw {

namespace {

using json = nlohmann::json;
constexpr int kFileVersion = 1;

json to_json(const Session& s) {
  return {{"id", s.id},     {"path", s.path},           {"name", s.name},
          {"type", s.type}, {"kernel_id", s.kernel_id}, {"started_kernel", s.started_kernel}};
}

}  // namespace

SessionStore::SessionStore(std::filesystem::path file) : file_(std::move(file)) {
  if (file_.empty()) return;
  writer_ = std::thread([this] { write_loop(); });
  std::error_code ec;
  if (!std::filesystem::exists(file_, ec)) return;
  std::ifstream in(file_);
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  try {
    if (j.is_discarded() || !j.is_object() || j.value("version", 0) != kFileVersion || !j["sessions"].is_array())
      throw std::runtime_error("not a kgate sessions file of version " + std::to_string(kFileVersion));
    for (const auto& e : j["sessions"]) {
      Session s;
      s.id = e.at("id").get<std::string>();
      s.path = e.at("path").get<std::string>();
      s.name = e.at("name").get<std::string>();
      s.type = e.at("type").get<std::string>();
      s.kernel_id = e.at("kernel_id").get<std::string>();
      s.started_kernel = e.value("started_kernel", false);
      if (sessions_.size() < kMaxSessions && bytes_of(s) <= 3 * kMaxFieldBytes && bytes_ + bytes_of(s) <= kMaxTotalBytes) {
        bytes_ += bytes_of(s);
        sessions_.push_back(std::move(s));
      }
    }
  } catch (const std::exception& e) {
    sessions_.clear();
    bytes_ = 0;
    auto bad = file_;
    bad += ".bad";
    std::filesystem::rename(file_, bad, ec);
    spdlog::warn("sessions file {} could not be read ({}); set aside as {}, starting with no sessions",
                 file_.string(), e.what(), bad.string());
  }
}

std::size_t SessionStore::prune(const std::function<bool(const std::string&)>& alive) {
  auto before = sessions_.size();
  sessions_.erase(std::remove_if(sessions_.begin(), sessions_.end(),
                                 [&](const Session& s) {
                                   bool gone = !alive(s.kernel_id);
                                   if (gone)
                                     spdlog::info("session {} ({}) ended: its kernel {} is gone", s.id, s.path,
                                                  s.kernel_id);
                                   return gone;
                                 }),
                  sessions_.end());
  auto dropped = before - sessions_.size();
  if (dropped) {
    recount();
    save();
  }
  return dropped;
}

const Session* SessionStore::find(const std::string& id) const {
  for (const auto& s : sessions_)
    if (s.id == id) return &s;
  return nullptr;
}

const Session* SessionStore::find_path(const std::string& path) const {
  for (const auto& s : sessions_)
    if (s.path == path) return &s;
  return nullptr;
}

bool SessionStore::kernel_shared(const std::string& kernel_id, const std::string& except) const {
  for (const auto& s : sessions_)
    if (s.kernel_id == kernel_id && s.id != except) return true;
  return false;
}

void SessionStore::add(Session s) {
  bytes_ += bytes_of(s);
  sessions_.push_back(std::move(s));
  save();
}

void SessionStore::update(const Session& s) {
  for (auto& mine : sessions_)
    if (mine.id == s.id) mine = s;
  recount();
  save();
}

void SessionStore::remove(const std::string& id) {
  sessions_.erase(std::remove_if(sessions_.begin(), sessions_.end(), [&](const Session& s) { return s.id == id; }),
                  sessions_.end());
  recount();
  save();
}

void SessionStore::recount() {
  bytes_ = 0;
  for (const auto& s : sessions_) bytes_ += bytes_of(s);
}

void SessionStore::save() {
  if (file_.empty()) return;
  json list = json::array();
  for (const auto& s : sessions_) list.push_back(to_json(s));
  std::string text = json{{"version", kFileVersion}, {"sessions", list}}.dump();
  {
    std::lock_guard lock(mu_);
    pending_ = std::move(text);  // an older snapshot not yet written is superseded
  }
  wake_.notify_one();
}

void SessionStore::write_loop() {
  std::unique_lock lock(mu_);
  while (true) {
    wake_.wait(lock, [this] { return stop_ || pending_; });
    if (!pending_) return;  // stopping, nothing left
    std::string text = std::move(*pending_);
    pending_.reset();
    lock.unlock();
    try {
      write_file_atomically(file_, text);
    } catch (const std::exception& e) {
      // The sessions still work in memory; only a restart of kgate would lose them.
      spdlog::warn("sessions not saved: {}", e.what());
    }
    lock.lock();
  }
}

SessionStore::~SessionStore() {
  if (!writer_.joinable()) return;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_one();
  writer_.join();
}

}  // namespace kgate::gw
