// The outputs of recorded cells (outputs.hpp): nbformat outputs in order, big values in
// content-addressed files, every limit answered by a note.
#include "kgate/records/outputs.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include <openssl/evp.h>

#include "kgate/jupyter/connection.hpp"

namespace kgate {

namespace fs = std::filesystem;

namespace {

std::string sha256_hex(std::string_view bytes) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned int len = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), md.data(), &len, EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("SHA-256 failed");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * len);
  for (unsigned i = 0; i < len; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 0x0f]);
  }
  return out;
}

bool is_blob_id(const std::string& id) {
  if (id.size() != 64) return false;
  for (char c : id)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

std::string human_bytes(std::size_t n) {
  char buf[32];
  if (n >= (std::size_t{1} << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", double(n) / double(1 << 20));
  else if (n >= 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", double(n) / 1024.0);
  else std::snprintf(buf, sizeof buf, "%zu bytes", n);
  return buf;
}

// The bytes of one MIME value as kept: a string as it is, anything else as its JSON.
std::size_t value_bytes(const json& v) { return v.is_string() ? v.get_ref<const std::string&>().size() : v.dump().size(); }

std::string mime_list(const json& data) {
  std::string out;
  if (!data.is_object()) return out;
  for (auto it = data.begin(); it != data.end(); ++it) out += (out.empty() ? "" : ", ") + it.key();
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// BlobStore

BlobStore::BlobStore(fs::path dir) : dir_(std::move(dir)) {}

std::string BlobStore::put(std::string_view bytes) {
  std::string id = sha256_hex(bytes);
  auto& e = refs_[id];
  if (e.refs++ > 0) return id;
  e.size = bytes.size();
  bytes_ += e.size;
  if (dir_.empty()) {
    memory_[id] = std::string(bytes);
    return id;
  }
  try {
    if (!dir_ready_) {  // once: it checks every folder on the way (check_parents)
      ensure_private_dir(dir_);
      dir_ready_ = true;
    }
    const fs::path file = dir_ / id;
    struct stat st {};
    if (::lstat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode) && std::size_t(st.st_size) == bytes.size())
      return id;  // written before (a value read back, or kept across a restart): the same bytes
    const fs::path tmp = dir_ / ("." + id + "." + new_hex_id() + ".tmp");
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) throw std::runtime_error("cannot create " + tmp.string() + ": " + std::strerror(errno));
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        throw std::runtime_error("cannot write " + tmp.string() + ": " + std::strerror(err));
      }
      done += std::size_t(n);
    }
    ::close(fd);
    if (::rename(tmp.c_str(), file.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      throw std::runtime_error("cannot rename " + tmp.string() + ": " + std::strerror(err));
    }
  } catch (...) {
    bytes_ -= e.size;
    refs_.erase(id);
    throw;
  }
  return id;
}

bool BlobStore::hold(const std::string& id) {
  if (auto it = refs_.find(id); it != refs_.end()) {
    ++it->second.refs;
    return true;
  }
  if (dir_.empty() || !is_blob_id(id)) return false;
  struct stat st {};
  if (::lstat((dir_ / id).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  auto& e = refs_[id];
  e.refs = 1;
  e.size = std::size_t(st.st_size);
  bytes_ += e.size;
  return true;
}

std::optional<std::string> BlobStore::get(const std::string& id) const {
  if (!refs_.count(id)) return std::nullopt;
  if (dir_.empty()) {
    auto it = memory_.find(id);
    return it == memory_.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
  const int fd = ::open((dir_ / id).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, std::size_t(n));
  }
  ::close(fd);
  return out;
}

void BlobStore::release(const std::string& id) {
  auto it = refs_.find(id);
  if (it == refs_.end() || --it->second.refs > 0) return;
  bytes_ -= it->second.size;
  refs_.erase(it);
  if (dir_.empty()) memory_.erase(id);
  else ::unlink((dir_ / id).c_str());
}

std::size_t BlobStore::collect() {
  if (dir_.empty()) return 0;
  std::size_t n = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool ours = is_blob_id(name) || (name.size() > 4 && name.front() == '.' && name.rfind(".tmp") == name.size() - 4);
    if (!ours || refs_.count(name)) continue;
    if (::unlink(it->path().c_str()) == 0) ++n;
  }
  return n;
}

// ---------------------------------------------------------------------------------------
// OutputStore

OutputStore::OutputStore(OutputLimits limits, fs::path blob_dir) : limits_(limits), blobs_(std::move(blob_dir)) {}

OutputStore::Cell& OutputStore::cell(const std::string& kernel, std::uint64_t job) {
  auto& c = cells_[job];
  if (c.kernel.empty()) c.kernel = kernel;
  return c;
}

void OutputStore::release(Cell& c, Kernel& k, Out& o) {
  if (o.kind != Out::Kind::rich) return;
  if (auto d = o.output.find("data"); d != o.output.end() && d->is_object())
    for (auto& [mime, v] : d->items())
      if (v.is_object() && v.contains("kgate_blob") && v["kgate_blob"].is_string()) {
        k.disk -= std::min(k.disk, std::size_t(v.value("bytes", std::size_t{0})));
        blobs_.release(v["kgate_blob"].get<std::string>());
      }
  c.rich_bytes -= std::min(c.rich_bytes, o.bytes);
  memory_bytes_ -= std::min(memory_bytes_, o.held);
  o.bytes = 0;
  o.held = 0;
}

void OutputStore::keep(Cell& c, Out o) {
  memory_bytes_ += o.held;
  c.outs.push_back(std::move(o));
}

void OutputStore::apply_clear(Cell& c) {
  c.clear_pending = false;
  auto& k = kernels_[c.kernel];
  for (auto& o : c.outs) release(c, k, o);
  c.outs.clear();
}

void OutputStore::note(Cell& c, const std::string& text) {
  Out o;
  o.kind = Out::Kind::rich;
  o.output = {{"output_type", "stream"}, {"name", "stderr"}, {"text", "[kgate] " + text + "\n"}};
  o.held = text.size();
  keep(c, std::move(o));
}

bool OutputStore::store_data(Cell& c, Kernel& k, json& data, std::size_t& bytes, std::size_t& held,
                             std::string& why) {
  bytes = held = 0;
  if (!data.is_object()) data = json::object();
  std::size_t to_disk = 0;
  std::vector<std::size_t> sizes;  // each value's, in the object's order
  for (auto& [mime, v] : data.items()) {
    sizes.push_back(value_bytes(v));
    bytes += sizes.back();
    (sizes.back() > limits_.inline_bytes ? to_disk : held) += sizes.back();
  }
  if (bytes > limits_.output_bytes) {
    why = "past the limit of one output (" + human_bytes(limits_.output_bytes) + ", [records] output_bytes)";
    return false;
  }
  if (c.rich_bytes + bytes > limits_.cell_bytes) {
    why = "past the limit of one cell's outputs (" + human_bytes(limits_.cell_bytes) +
          ", [records] cell_output_bytes)";
    return false;
  }
  if (k.disk + to_disk > limits_.kernel_disk_bytes) {
    why = "this kernel's outputs on disk reached their limit (" + human_bytes(limits_.kernel_disk_bytes) +
          ", [records] kernel_output_disk_bytes)";
    return false;
  }
  std::vector<std::string> kept;  // the files put so far: given back if a later one fails
  std::size_t i = 0;
  for (auto& [mime, v] : data.items()) {
    const std::size_t n = sizes[i++];
    if (n <= limits_.inline_bytes) continue;
    const bool is_json = !v.is_string();
    try {
      kept.push_back(blobs_.put(is_json ? v.dump() : v.get_ref<const std::string&>()));
    } catch (const std::exception& e) {
      for (const auto& id : kept) blobs_.release(id);
      why = std::string("it could not be kept on disk: ") + e.what();
      return false;
    }
    v = json{{"kgate_blob", kept.back()}, {"bytes", n}};
    if (is_json) v["json"] = true;
  }
  k.disk += to_disk;
  c.rich_bytes += bytes;
  return true;
}

void OutputStore::stream(const std::string& kernel, std::uint64_t job, bool is_stderr, std::size_t from, std::size_t to) {
  if (to <= from) return;
  Cell& c = cell(kernel, job);
  if (c.clear_pending) apply_clear(c);
  if (!c.outs.empty()) {
    Out& last = c.outs.back();
    if (last.kind == Out::Kind::stream && last.is_stderr == is_stderr && last.to == from) {
      last.to = to;
      return;
    }
  }
  Out o;
  o.kind = Out::Kind::stream;
  o.is_stderr = is_stderr;
  o.from = from;
  o.to = to;
  c.outs.push_back(std::move(o));
}

void OutputStore::message(const std::string& kernel, std::uint64_t job, std::string_view msg_type, json content) {
  if (!content.is_object()) return;
  if (msg_type == "clear_output") {
    Cell& c = cell(kernel, job);
    const auto w = content.find("wait");
    if (w != content.end() && w->is_boolean() && w->get<bool>()) c.clear_pending = true;
    else apply_clear(c);
    return;
  }
  auto display_id = [&]() -> std::string {
    auto t = content.find("transient");
    if (t == content.end() || !t->is_object()) return "";
    auto d = t->find("display_id");
    return d != t->end() && d->is_string() ? d->get<std::string>() : "";
  };
  if (msg_type == "update_display_data") {
    if (auto id = display_id(); !id.empty()) update_display(kernel, id, content);
    return;
  }
  if (msg_type != "display_data" && msg_type != "execute_result" && msg_type != "error") return;
  Cell& c = cell(kernel, job);
  if (c.clear_pending) apply_clear(c);
  Kernel& k = kernels_[kernel];
  Out o;
  o.kind = Out::Kind::rich;
  if (msg_type == "error") {
    json tb = content.value("traceback", json::array());
    if (!tb.is_array()) tb = json::array();
    o.output = {{"output_type", "error"},
                {"ename", content.value("ename", std::string("Error"))},
                {"evalue", content.value("evalue", std::string())},
                {"traceback", tb}};
    o.held = o.output.dump().size();
    keep(c, std::move(o));
    return;
  }
  json data = content.contains("data") ? std::move(content["data"]) : json::object();
  json metadata = content.contains("metadata") ? std::move(content["metadata"]) : json::object();
  if (!metadata.is_object()) metadata = json::object();
  std::size_t bytes = 0, held = 0;
  std::string why;
  const std::string mimes = mime_list(data);
  if (!store_data(c, k, data, bytes, held, why)) {
    if (why.find("one cell's") != std::string::npos) {
      if (!c.cell_note) note(c, "The outputs that followed were not kept: " + why + ".");
      c.cell_note = true;
    } else {
      note(c, "A " + std::string(msg_type) + " of " + human_bytes(bytes) + " (" + mimes + ") was not kept: " + why + ".");
    }
    return;
  }
  o.output = {{"output_type", std::string(msg_type)}, {"data", std::move(data)}, {"metadata", std::move(metadata)}};
  if (msg_type == "execute_result") {
    auto ec = content.find("execution_count");
    o.output["execution_count"] = ec != content.end() && ec->is_number_integer() ? *ec : json(nullptr);
  }
  o.bytes = bytes;
  o.held = held;
  o.display_id = display_id();
  if (!o.display_id.empty()) k.displays[o.display_id].insert(job);
  keep(c, std::move(o));
}

void OutputStore::update_display(const std::string& kernel, const std::string& display_id, const json& content) {
  auto kit = kernels_.find(kernel);
  if (kit == kernels_.end()) return;
  auto dit = kit->second.displays.find(display_id);
  if (dit == kit->second.displays.end()) return;
  for (std::uint64_t job : dit->second) {
    auto cit = cells_.find(job);
    if (cit == cells_.end()) continue;
    Cell& c = cit->second;
    for (auto& o : c.outs) {
      if (o.kind != Out::Kind::rich || o.display_id != display_id) continue;
      json data = content.value("data", json::object());
      std::size_t bytes = 0, held = 0;
      std::string why;
      // The old value's place is given back first, so an update the same size always fits.
      release(c, kit->second, o);
      if (!store_data(c, kit->second, data, bytes, held, why)) {
        const std::string text = "[kgate] An update of this display (" + human_bytes(bytes) + ") was not kept: " + why + ".\n";
        o.output = {{"output_type", "stream"}, {"name", "stderr"}, {"text", text}};
        o.held = text.size();
        memory_bytes_ += o.held;
        o.display_id.clear();
        continue;
      }
      o.output["data"] = std::move(data);
      json metadata = content.value("metadata", json::object());
      o.output["metadata"] = metadata.is_object() ? metadata : json::object();
      o.bytes = bytes;
      o.held = held;
      memory_bytes_ += held;
    }
  }
}

json OutputStore::nbformat(std::uint64_t job, std::string_view stream_text, std::size_t stream_cut) const {
  json out = json::array();
  auto it = cells_.find(job);
  if (it == cells_.end()) return out;
  for (const Out& o : it->second.outs) {
    if (o.kind == Out::Kind::stream) {
      if (o.to <= stream_cut) {
        out.push_back({{"output_type", "stream"}, {"name", o.is_stderr ? "stderr" : "stdout"},
                       {"text", "[kgate] " + std::to_string(o.to - o.from) +
                                    " bytes of this output were cut (the record keeps the tail of a cell's stream text)\n"}});
        continue;
      }
      const std::size_t from = std::max(o.from, stream_cut) - stream_cut;
      const std::size_t to = std::min(o.to - stream_cut, stream_text.size());
      std::string text = from < to ? std::string(stream_text.substr(from, to - from)) : std::string();
      if (o.from < stream_cut)
        text = "[kgate] " + std::to_string(stream_cut - o.from) + " earlier bytes cut\n" + text;
      // Consecutive chunks of one stream, cut apart by a kept note or nothing: one output.
      if (!out.empty() && out.back().value("output_type", "") == "stream" &&
          out.back().value("name", "") == (o.is_stderr ? "stderr" : "stdout") &&
          out.back()["text"].get<std::string>().rfind("[kgate]", 0) != 0) {
        out.back()["text"] = out.back()["text"].get<std::string>() + text;
        continue;
      }
      out.push_back({{"output_type", "stream"}, {"name", o.is_stderr ? "stderr" : "stdout"}, {"text", std::move(text)}});
      continue;
    }
    json output = o.output;
    if (auto d = output.find("data"); d != output.end() && d->is_object())
      for (auto& [mime, v] : d->items()) {
        if (!v.is_object() || !v.contains("kgate_blob")) continue;
        const std::string id = v.value("kgate_blob", std::string());
        const bool is_json = v.value("json", false);
        auto bytes = blobs_.get(id);
        if (!bytes) {
          v = "[kgate] this value's file is gone";
        } else if (is_json) {
          v = json::parse(*bytes, nullptr, false);
        } else {
          v = std::move(*bytes);
        }
      }
    out.push_back(std::move(output));
  }
  return out;
}

json OutputStore::save(std::uint64_t job) const {
  json out = json::array();
  auto it = cells_.find(job);
  if (it == cells_.end()) return out;
  for (const Out& o : it->second.outs) {
    if (o.kind == Out::Kind::stream)
      out.push_back({{"stream", o.is_stderr ? "stderr" : "stdout"}, {"from", o.from}, {"to", o.to}});
    else
      out.push_back({{"output", o.output}, {"display_id", o.display_id}, {"bytes", o.bytes}});
  }
  return out;
}

void OutputStore::load(const std::string& kernel, std::uint64_t job, const json& saved) {
  if (!saved.is_array()) return;
  drop(job);
  Cell& c = cell(kernel, job);
  Kernel& k = kernels_[kernel];
  for (const json& e : saved) {
    if (!e.is_object()) continue;
    Out o;
    if (e.contains("stream")) {
      o.kind = Out::Kind::stream;
      o.is_stderr = e.value("stream", "") == "stderr";
      o.from = e.value("from", std::size_t{0});
      o.to = e.value("to", std::size_t{0});
      c.outs.push_back(std::move(o));
      continue;
    }
    o.kind = Out::Kind::rich;
    o.output = e.value("output", json::object());
    if (!o.output.is_object() || !o.output.contains("output_type")) continue;
    o.display_id = e.value("display_id", "");
    o.bytes = e.value("bytes", std::size_t{0});
    if (auto d = o.output.find("data"); d != o.output.end() && d->is_object())
      for (auto& [mime, v] : d->items()) {
        if (!v.is_object() || !v.contains("kgate_blob")) continue;
        const std::string id = v.value("kgate_blob", std::string());
        if (blobs_.hold(id)) k.disk += v.value("bytes", std::size_t{0});
        else v = "[kgate] this value's file is gone";
      }
    c.rich_bytes += o.bytes;
    o.held = o.output.dump().size();  // its small values (and the files' ids)
    if (!o.display_id.empty()) k.displays[o.display_id].insert(job);
    keep(c, std::move(o));
  }
}

void OutputStore::drop(std::uint64_t job) {
  auto it = cells_.find(job);
  if (it == cells_.end()) return;
  Cell& c = it->second;
  auto& k = kernels_[c.kernel];
  for (auto& o : c.outs) {
    release(c, k, o);
    if (!o.display_id.empty())
      if (auto d = k.displays.find(o.display_id); d != k.displays.end()) {
        d->second.erase(job);
        if (d->second.empty()) k.displays.erase(d);
      }
  }
  cells_.erase(it);
}

std::size_t OutputStore::kernel_disk_bytes(const std::string& kernel) const {
  auto it = kernels_.find(kernel);
  return it == kernels_.end() ? 0 : it->second.disk;
}

}  // namespace kgate
