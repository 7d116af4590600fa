// Kernel discovery: the data-dir kernelspecs, the specs inside environments and one spec per
// interpreter, merged and judged launchable or not; and the background service that keeps it.
#include "kgate/discovery/discovery.hpp"

#include <algorithm>
#include <cctype>
#include <set>

#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "kgate/process/process.hpp"

namespace kgate {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// jupyter_core's envset(): set, and not one of no/n/false/off/0/0.0.
bool envset(const LocatorEnv& env, const std::string& name) {
  if (!env.vars.count(name)) return false;
  static const std::set<std::string> no = {"no", "n", "false", "off", "0", "0.0"};
  return !no.count(lower(env.get(name)));
}

bool owned_by_me(const fs::path& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0 && st.st_uid == ::geteuid();
}

std::string home_of(const LocatorEnv& env) {
  std::string h = env.get("HOME");
  return h.empty() ? std::string("/") : h;
}

// python, python3, python3.11 (and python2, which probes will reject).
bool is_python_name(const std::string& base) {
  if (base.rfind("python", 0) != 0) return false;
  std::string rest = base.substr(6);
  if (rest.empty()) return true;
  std::size_t i = 0;
  while (i < rest.size() && std::isdigit(static_cast<unsigned char>(rest[i]))) ++i;
  if (i == 0) return false;
  if (i == rest.size()) return true;
  if (rest[i] != '.') return false;
  std::size_t j = i + 1;
  while (j < rest.size() && std::isdigit(static_cast<unsigned char>(rest[j]))) ++j;
  return j > i + 1 && j == rest.size();
}

bool is_python_spec(const KernelSpec& s) {
  return lower(s.language) == "python" || (!s.argv.empty() && is_python_name(fs::path(s.argv[0]).filename().string()));
}

bool mentions_ipykernel(const KernelSpec& s) {
  for (auto& a : s.argv)
    if (a.find("ipykernel") != std::string::npos) return true;
  return false;
}

// The spec ipykernel installs by default ("python3", "Python 3 (ipykernel)") with no env of its
// own: inside an environment, the hand-crafted interpreter spec replaces it.
bool is_default_python_spec(const KernelSpec& s) {
  const std::string dir = lower(s.resource_dir.filename().string());
  bool default_name = is_python_name(dir) || s.display_name == "Python 3 (ipykernel)" || s.display_name == "Python 3";
  return default_name && s.env.empty();
}

std::string sha256_hex(const std::string& data, std::size_t chars) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len && out.size() < chars; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out.substr(0, chars);
}

// A kernelspec name: [a-z0-9._-], other characters become '-', runs collapse, at most 40.
std::string slug(const std::string& s) {
  std::string out;
  for (unsigned char c : lower(s)) {
    bool ok = std::isalnum(c) || c == '.' || c == '_' || c == '-';
    if (ok) out += static_cast<char>(c);
    else if (!out.empty() && out.back() != '-') out += '-';
  }
  while (!out.empty() && (out.back() == '-' || out.back() == '.')) out.pop_back();
  while (!out.empty() && (out.front() == '-' || out.front() == '.')) out.erase(out.begin());
  if (out.size() > 40) out.resize(40);
  return out.empty() ? "python" : out;
}

// How an environment is named in display names and tables: "venv myproj", "pyenv 3.11.7", ...
std::string env_label(const InterpreterCandidate& c) {
  if (c.env_name.empty() || c.source == "PATH" || c.source == "system") return "";
  std::string kind = c.source == "VIRTUAL_ENV" ? "venv" : c.source == "CONDA_PREFIX" ? "conda" : c.source;
  return kind + " " + c.env_name;
}

std::string identity(const InterpreterInfo& i) { return i.prefix.string() + "\n" + i.real_executable.string(); }

std::vector<std::string> argv_tail(const std::vector<std::string>& argv) {
  return argv.size() > 1 ? std::vector<std::string>(argv.begin() + 1, argv.end()) : std::vector<std::string>{};
}

bool same_dir(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  if (a.lexically_normal() == b.lexically_normal()) return true;
  return fs::exists(a, ec) && fs::exists(b, ec) && fs::equivalent(a, b, ec);
}

struct Probed {
  InterpreterCandidate cand;
  InterpreterInfo info;
};

class Builder {
 public:
  Builder(const DiscoveryOptions& opts, InterpreterProber& prober) : opts_(opts), prober_(prober) {}

  Catalog build() {
    auto t0 = std::chrono::steady_clock::now();
    cat_.made = std::chrono::system_clock::now();
    cat_.probed = opts_.interpreters;
    dirs_ = kernelspec_search_dirs(opts_.env);
    if (opts_.interpreters) probe_interpreters();
    data_dir_specs();
    if (opts_.interpreters) {
      env_specs();
      interpreter_specs();
    }
    choose_default();
    cat_.took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    return std::move(cat_);
  }

 private:
  void probe_interpreters() {
    auto cands = find_interpreters(opts_.env);
    std::vector<fs::path> paths;
    for (auto& c : cands) paths.push_back(c.path);
    auto infos = prober_.probe_all(paths);
    for (std::size_t i = 0; i < cands.size() && i < infos.size(); ++i) {
      probed_.push_back({cands[i], infos[i]});
      cat_.interpreters.push_back(infos[i]);
    }
  }

  // The first probed interpreter with ipykernel whose version fits a bare argv[0].
  const Probed* interpreter_for(const std::string& base) {
    std::string want = base.substr(6);  // "", "3", "3.11"
    for (auto& p : probed_) {
      if (!p.info.ok || !p.info.has_ipykernel) continue;
      std::string mm = std::to_string(p.info.major) + "." + std::to_string(p.info.minor);
      if (want.empty() ? p.info.major == 3 : (want == std::to_string(p.info.major) || want == mm)) return &p;
    }
    return nullptr;
  }

  // Judges (and for a bare python argv[0], resolves) one spec found on disk.
  void judge(CatalogEntry& e, const Probed* env_interp) {
    auto& argv = e.spec.argv;
    // `kgate install-kernelspec`'s spec attaches a notebook to a kgate kernel: as a kernel of kgate
    // itself it would proxy to kgate, in a loop.
    const auto& meta = e.spec.metadata;
    bool proxy = (argv.size() > 1 && argv[1] == "proxy-kernel" &&
                  fs::path(argv[0]).filename().string().rfind("kgate", 0) == 0) ||
                 (meta.is_object() && meta.contains("kgate") && meta["kgate"].is_object() &&
                  meta["kgate"].contains("proxy_kernel") && meta["kgate"]["proxy_kernel"] == true);
    if (proxy) {
      e.launchable = false;
      e.reason = "a kgate proxy kernel (for notebooks, to attach to a kgate kernel); kgate does not run it";
      return;
    }
    const std::string argv0 = argv[0];
    const std::string base = fs::path(argv0).filename().string();
    const bool python = is_python_spec(e.spec);
    if (argv0.find('/') == std::string::npos) {
      if (python && is_python_name(base)) {
        if (!opts_.interpreters) return;  // quick pass: left to the launch's PATH lookup
        const Probed* p = env_interp && env_interp->info.has_ipykernel ? env_interp : interpreter_for(base);
        if (!p) {
          e.launchable = false;
          e.reason = "no Python with ipykernel was found for argv[0] '" + argv0 + "' (" +
                     std::to_string(probed_.size()) + " interpreters checked; see `kgate kernelspecs`)";
          return;
        }
        argv[0] = p->cand.path.string();
        e.interpreter = argv[0];
        spec_identity_[e.spec.name] = identity(p->info);
        if (e.env.empty()) e.env = env_label(p->cand);
        return;
      }
      std::map<std::string, std::string> penv = opts_.env.vars;
      if (env_interp) penv["PATH"] = (env_interp->info.prefix / "bin").string() + ":" + opts_.env.get("PATH");
      if (find_program(argv0, penv) == argv0) {
        e.launchable = false;
        e.reason = "argv[0] '" + argv0 + "' is not on PATH";
      }
      return;
    }
    fs::path exe(argv0);
    if (::access(exe.c_str(), X_OK) != 0) {
      std::error_code ec;
      e.launchable = false;
      e.reason = "argv[0] " + argv0 + (fs::exists(exe, ec) ? " is not executable" : " does not exist");
      return;
    }
    // Only an argv[0] named like a Python is probed: a wrapper (a shell script, a launcher) is
    // run as it is, and its ipykernel is its own business.
    if (!python || !is_python_name(base) || !opts_.interpreters) return;
    e.interpreter = argv0;
    InterpreterInfo info = prober_.probe(exe);
    if (!info.ok) {
      e.launchable = false;
      e.reason = argv0 + ": " + info.error;
    } else if (!info.has_ipykernel && mentions_ipykernel(e.spec)) {
      e.launchable = false;
      e.reason = "ipykernel not installed in " + argv0;
    } else {
      spec_identity_[e.spec.name] = identity(info);
    }
  }

  void add(CatalogEntry e) {
    names_.insert(e.spec.name);
    cat_.entries.push_back(std::move(e));
  }

  void data_dir_specs() {
    auto scan = scan_kernelspecs(dirs_);
    for (auto& w : scan.warnings) cat_.warnings.push_back(w);
    for (auto& [name, spec] : scan.specs) {
      CatalogEntry e;
      e.kind = "kernelspec";
      e.source = spec.resource_dir.string();
      e.spec = spec;
      judge(e, nullptr);
      add(std::move(e));
    }
  }

  void env_specs() {
    std::set<std::string> seen;
    for (auto& p : probed_) {
      if (!p.info.ok) continue;
      fs::path dir = p.info.prefix / "share" / "jupyter" / "kernels";
      std::error_code ec;
      if (!fs::is_directory(dir, ec) || !seen.insert(dir.lexically_normal().string()).second) continue;
      bool known = false;
      for (auto& d : dirs_) known |= same_dir(d, dir);
      if (known) continue;
      auto scan = scan_kernelspecs({dir});
      for (auto& w : scan.warnings) cat_.warnings.push_back(w);
      for (auto& [name, spec] : scan.specs) {
        if (is_python_spec(spec) && is_default_python_spec(spec) && p.info.has_ipykernel) continue;  // replaced
        CatalogEntry e;
        e.kind = "env";
        e.source = spec.resource_dir.string();
        e.env = env_label(p.cand);
        e.spec = spec;
        if (names_.count(e.spec.name)) e.spec.name = e.spec.name + "-" + slug(p.cand.env_name.empty() ? p.cand.path.string() : p.cand.env_name);
        if (names_.count(e.spec.name)) continue;
        judge(e, &p);
        add(std::move(e));
      }
    }
  }

  void interpreter_specs() {
    // A data-dir or env spec that runs the same interpreter with ipykernel's usual argv and no
    // env of its own already offers it: the hand-crafted one would be a duplicate.
    std::set<std::string> offered;
    const std::vector<std::string> tail = {"-m", "ipykernel_launcher", "-f", "{connection_file}"};
    for (auto& e : cat_.entries)
      if (e.launchable && e.spec.env.empty() && spec_identity_.count(e.spec.name) && argv_tail(e.spec.argv) == tail)
        offered.insert(spec_identity_[e.spec.name]);

    std::set<std::string> seen;
    for (auto& p : probed_) {
      if (p.info.ok && !seen.insert(identity(p.info)).second) continue;  // the same env found twice
      if (p.info.ok && offered.count(identity(p.info))) continue;
      const std::string path = p.cand.path.string();
      const std::string label = env_label(p.cand);
      CatalogEntry e;
      e.kind = "interpreter";
      e.source = path;
      e.env = label;
      e.interpreter = path;
      KernelSpec& s = e.spec;
      s.name = "py-" + slug(p.cand.env_name.empty() ? p.cand.path.filename().string() : p.cand.env_name) + "-" +
               sha256_hex(path, 8);
      s.display_name = "Python" + (p.info.ok ? " " + p.info.version : std::string()) + " (" +
                       (label.empty() ? path : label) + ")";
      s.language = "python";
      s.argv = {path, "-m", "ipykernel_launcher", "-f", "{connection_file}"};
      s.resource_dir = p.info.ipykernel_resources;
      json meta = {{"kgate", {{"interpreter", path}, {"source", p.cand.source}}}};
      if (p.info.ok) meta["kgate"]["prefix"] = p.info.prefix.string();
      if (!p.info.ipykernel_version.empty() && std::atoi(p.info.ipykernel_version.c_str()) >= 6) meta["debugger"] = true;
      s.metadata = meta;
      s.raw = json::object();
      if (!p.info.ok) {
        e.launchable = false;
        e.reason = p.info.error.empty() ? "the probe failed" : p.info.error;
      } else if (!p.info.has_ipykernel) {
        e.launchable = false;
        e.reason = "ipykernel not installed";
      }
      if (names_.count(s.name)) continue;
      add(std::move(e));
    }
  }

  void choose_default() {
    if (auto* e = cat_.find(opts_.default_kernel); e && e->launchable) {
      cat_.default_name = e->spec.name;
      return;
    }
    for (auto& e : cat_.entries)
      if (e.launchable && lower(e.spec.language) == "python") {
        cat_.default_name = e.spec.name;
        return;
      }
    for (auto& e : cat_.entries)
      if (e.launchable) {
        cat_.default_name = e.spec.name;
        return;
      }
    cat_.default_name = opts_.default_kernel;
  }

  const DiscoveryOptions& opts_;
  InterpreterProber& prober_;
  Catalog cat_;
  std::vector<fs::path> dirs_;
  std::vector<Probed> probed_;
  std::set<std::string> names_;
  std::map<std::string, std::string> spec_identity_;  // spec name -> the identity of its interpreter
};

}  // namespace

// ---- search path ------------------------------------------------------------------------

std::vector<fs::path> kernelspec_search_dirs(const LocatorEnv& env) {
  std::vector<fs::path> roots;
  auto add = [&roots](fs::path p) {
    p = p.lexically_normal();
    for (auto& r : roots)
      if (r == p) return;
    roots.push_back(std::move(p));
  };
  const std::string jp = env.get("JUPYTER_PATH");
  std::size_t start = 0;
  while (start <= jp.size() && !jp.empty()) {
    std::size_t colon = jp.find(':', start);
    std::string entry = jp.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    while (entry.size() > 1 && entry.back() == '/') entry.pop_back();
    if (!entry.empty()) add(entry);
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  fs::path user;
  if (auto d = env.get("JUPYTER_DATA_DIR"); !d.empty()) {
    user = d;
  } else {
    std::string xdg = env.get("XDG_DATA_HOME");
    user = (xdg.empty() ? fs::path(home_of(env)) / ".local" / "share" : fs::path(xdg)) / "jupyter";
  }
  const std::vector<fs::path> system = {"/usr/local/share/jupyter", "/usr/share/jupyter"};
  fs::path env_dir;
  bool in_venv = false, in_conda = false;
  std::string prefix = env.get("VIRTUAL_ENV");
  if (!prefix.empty()) {
    in_venv = true;
  } else {
    prefix = env.get("CONDA_PREFIX");
    std::string name = env.get("CONDA_DEFAULT_ENV");
    in_conda = !prefix.empty() && (name.empty() ? std::string("base") : name) != "base";
  }
  if (!prefix.empty()) {
    env_dir = (fs::path(prefix) / "share" / "jupyter").lexically_normal();
    for (auto& s : system)
      if (env_dir == s) env_dir.clear();
  }
  bool prefer_env = env.vars.count("JUPYTER_PREFER_ENV_PATH") ? envset(env, "JUPYTER_PREFER_ENV_PATH")
                                                              : ((in_venv || in_conda) && owned_by_me(prefix));
  // jupyter_core adds the user site's share/jupyter (pip install --user) after the data dir.
  std::string userbase = env.get("PYTHONUSERBASE");
  fs::path user_site = (userbase.empty() ? fs::path(home_of(env)) / ".local" : fs::path(userbase)) / "share" / "jupyter";
  if (prefer_env && !env_dir.empty()) add(env_dir);
  add(user);
  add(user_site);
  if (!prefer_env && !env_dir.empty()) add(env_dir);
  for (auto& s : system) add(s);
  std::vector<fs::path> dirs;
  for (auto& r : roots) dirs.push_back(r / "kernels");
  fs::path ipy = env.get("IPYTHONDIR").empty() ? fs::path(home_of(env)) / ".ipython" : fs::path(env.get("IPYTHONDIR"));
  fs::path ipk = (ipy / "kernels").lexically_normal();
  if (std::find(dirs.begin(), dirs.end(), ipk) == dirs.end()) dirs.push_back(ipk);
  return dirs;
}

// ---- catalog ----------------------------------------------------------------------------

const CatalogEntry* Catalog::find(const std::string& name) const {
  const std::string n = lower(name);
  for (auto& e : entries)
    if (e.spec.name == n) return &e;
  if (n == "python")
    for (auto& e : entries)
      if (e.spec.name == "python3") return &e;
  return nullptr;
}

std::size_t Catalog::launchable_count() const {
  return static_cast<std::size_t>(std::count_if(entries.begin(), entries.end(), [](auto& e) { return e.launchable; }));
}

Catalog discover(const DiscoveryOptions& opts, InterpreterProber& prober) { return Builder(opts, prober).build(); }

json catalog_json(const Catalog& cat) {
  json entries = json::array();
  for (auto& e : cat.entries)
    entries.push_back({{"name", e.spec.name},
                       {"display_name", e.spec.display_name},
                       {"language", e.spec.language},
                       {"kind", e.kind},
                       {"source", e.source},
                       {"env", e.env},
                       {"interpreter", e.interpreter},
                       {"launchable", e.launchable},
                       {"reason", e.reason},
                       {"argv", e.spec.argv}});
  json interps = json::array();
  for (auto& i : cat.interpreters) {
    json j = {{"path", i.path.string()}, {"ok", i.ok}};
    if (i.ok) {
      j["version"] = i.version;
      j["prefix"] = i.prefix.string();
      j["executable"] = i.executable.string();
      j["real_executable"] = i.real_executable.string();
      j["has_ipykernel"] = i.has_ipykernel;
      j["ipykernel_version"] = i.ipykernel_version;
    } else {
      j["error"] = i.error;
    }
    interps.push_back(std::move(j));
  }
  return {{"default", cat.default_name},
          {"probed", cat.probed},
          {"took_ms", cat.took.count()},
          {"entries", std::move(entries)},
          {"interpreters", std::move(interps)},
          {"warnings", cat.warnings}};
}

// ---- the service --------------------------------------------------------------------------

DiscoveryService::DiscoveryService(DiscoveryOptions opts, Timing timing)
    : opts_(std::move(opts)), timing_(timing), prober_(timing.probe_timeout) {}

DiscoveryService::~DiscoveryService() { stop(); }

void DiscoveryService::start() {
  DiscoveryOptions quick = opts_;
  quick.interpreters = false;
  auto first = std::make_shared<const Catalog>(discover(quick, prober_));
  {
    std::lock_guard lk(mu_);
    current_ = first;
    generation_ = 1;
  }
  thread_ = std::thread([this] { run(); });
}

void DiscoveryService::stop() {
  std::vector<std::pair<std::uint64_t, std::function<void()>>> waiting;
  {
    std::lock_guard lk(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    waiting.swap(waiting_);
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& [gen, fn] : waiting) fn();
}

std::shared_ptr<const Catalog> DiscoveryService::snapshot(std::chrono::milliseconds bound) {
  std::unique_lock lk(mu_);
  if (!full_ && bound.count() > 0) cv_.wait_for(lk, bound, [this] { return full_ || stopping_; });
  return current_;
}

std::shared_ptr<const Catalog> DiscoveryService::full_snapshot() const {
  std::lock_guard lk(mu_);
  return full_ ? current_ : nullptr;
}

void DiscoveryService::when_generation(std::uint64_t gen, std::function<void()> fn) {
  {
    std::lock_guard lk(mu_);
    if (generation_ < gen && !stopping_) {
      waiting_.emplace_back(gen, std::move(fn));
      return;
    }
  }
  fn();
}

std::uint64_t DiscoveryService::refresh() {
  std::uint64_t want;
  {
    std::lock_guard lk(mu_);
    // One in progress may have read the directories before this call: the one after it counts.
    want = generation_ + (running_ ? 2 : 1);
    requested_ = std::max(requested_, want);
  }
  cv_.notify_all();
  return want;
}

std::shared_ptr<const Catalog> DiscoveryService::wait_for(std::uint64_t gen, std::chrono::milliseconds bound) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, bound, [&] { return generation_ >= gen || stopping_; });
  return current_;
}

std::uint64_t DiscoveryService::generation() const {
  std::lock_guard lk(mu_);
  return generation_;
}

std::string DiscoveryService::fingerprint() const {
  // The mtimes of every kernelspec directory, each spec directory in it and its kernel.json:
  // adding, removing or editing a spec changes one of them.
  std::vector<fs::path> dirs = kernelspec_search_dirs(opts_.env);
  {
    std::lock_guard lk(mu_);
    if (current_)
      for (auto& i : current_->interpreters)
        if (i.ok) dirs.push_back(i.prefix / "share" / "jupyter" / "kernels");
  }
  std::string fp;
  auto stamp = [&fp](const fs::path& p) {
    struct stat st{};
    if (::stat(p.c_str(), &st) != 0) return false;
    fp += p.string() + ' ' + std::to_string(st.st_mtim.tv_sec) + '.' + std::to_string(st.st_mtim.tv_nsec) + ' ' +
          std::to_string(st.st_size) + '\n';
    return true;
  };
  for (auto& d : dirs) {
    if (!stamp(d)) continue;
    std::error_code ec;
    for (fs::directory_iterator it(d, ec), end; !ec && it != end; it.increment(ec)) {
      stamp(it->path());
      stamp(it->path() / "kernel.json");
    }
  }
  return fp;
}

void DiscoveryService::run() {
  auto next_rescan = std::chrono::steady_clock::now();
  for (;;) {
    {
      std::lock_guard lk(mu_);
      if (stopping_) return;
      running_ = true;
    }
    std::string fp = fingerprint();
    Catalog c;
    try {
      c = discover(opts_, prober_);
    } catch (const std::exception& e) {  // a bug, not an expected failure: keep the last catalog
      spdlog::error("kernel discovery failed: {}", e.what());
      c = *snapshot();
    }
    for (auto& w : c.warnings) spdlog::warn("kernelspec skipped: {}", w);
    spdlog::info("kernel discovery: {} kernelspecs ({} launchable), {} interpreters checked, in {} ms",
                 c.entries.size(), c.launchable_count(), c.interpreters.size(), c.took.count());
    std::vector<std::function<void()>> due;
    {
      std::lock_guard lk(mu_);
      current_ = std::make_shared<const Catalog>(std::move(c));
      ++generation_;
      running_ = false;
      full_ = true;
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        if (it->first <= generation_) {
          due.push_back(std::move(it->second));
          it = waiting_.erase(it);
        } else {
          ++it;
        }
      }
    }
    cv_.notify_all();
    for (auto& fn : due) fn();
    next_rescan = std::chrono::steady_clock::now() + timing_.rescan_interval;

    // Wait for a refresh, a change in the directories, or the periodic rescan.
    std::unique_lock lk(mu_);
    for (;;) {
      if (cv_.wait_for(lk, timing_.watch_interval, [this] { return stopping_ || requested_ > generation_; })) break;
      if (std::chrono::steady_clock::now() >= next_rescan) break;
      lk.unlock();
      bool changed = fingerprint() != fp;
      lk.lock();
      if (changed) break;
    }
    if (stopping_) return;
  }
}

}  // namespace kgate
