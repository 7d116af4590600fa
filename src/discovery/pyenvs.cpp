// Python interpreter discovery: the locators (find_interpreters) and the cached, time-boxed probe.
#include "kgate/discovery/pyenvs.hpp"
#include "kgate/process/process.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>


namespace kgate {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// LocatorEnv

std::string LocatorEnv::get(const std::string& name) const {
  const auto it = vars.find(name);
  return it == vars.end() ? std::string() : it->second;
}

LocatorEnv LocatorEnv::from_process() {
  LocatorEnv env;
  env.vars = current_environment();
  return env;
}

namespace {

// ---------------------------------------------------------------------------------------------
// Locator helpers

// An existing regular file (through symlinks) that we may execute.
bool is_executable_file(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  return ::access(p.c_str(), X_OK) == 0;
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

bool path_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

// Less-than that compares runs of digits by value: "3.9.18" < "3.10.13", "env2" < "env10".
bool natural_less(const std::string& a, const std::string& b) {
  std::size_t i = 0, j = 0;
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      std::size_t ie = i, je = j;
      while (ie < a.size() && digit(a[ie])) ++ie;
      while (je < b.size() && digit(b[je])) ++je;
      // Compare by value: strip leading zeros, then longer is bigger, then lexically.
      std::size_t is = i, js = j;
      while (is + 1 < ie && a[is] == '0') ++is;
      while (js + 1 < je && b[js] == '0') ++js;
      if (ie - is != je - js) return ie - is < je - js;
      const int c = a.compare(is, ie - is, b, js, je - js);
      if (c != 0) return c < 0;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

// The subdirectories of `dir` (symlinks to directories included), in natural order of name.
std::vector<fs::path> child_dirs(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  if (ec) return out;
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    if (is_dir(it->path())) out.push_back(it->path());
  }
  std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) {
    return natural_less(a.filename().string(), b.filename().string());
  });
  return out;
}

// The interpreter of directory `dir`: python3, else python, else the highest python3.N; none if
// none of them is an executable file.
std::optional<fs::path> interpreter_in(const fs::path& dir) {
  for (const char* name : {"python3", "python"}) {
    fs::path p = dir / name;
    if (is_executable_file(p)) return p;
  }
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  if (ec) return std::nullopt;
  std::optional<fs::path> best;
  long best_minor = -1;
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    if (name.size() <= 8 || name.compare(0, 8, "python3.") != 0) continue;
    const std::string_view digits = std::string_view(name).substr(8);
    if (digits.size() > 4 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;  // python3.11-config, python3.6m, python3.11-gdb.py
    }
    const long minor = std::stol(std::string(digits));
    if (minor > best_minor && is_executable_file(it->path())) {
      best_minor = minor;
      best = it->path();
    }
  }
  return best;
}

// A directory path with "." and ".." folded and no trailing separator.
fs::path normal_dir(const fs::path& p) {
  fs::path n = p.lexically_normal();
  if (!n.has_filename() && n.has_parent_path() && n != n.root_path()) n = n.parent_path();
  return n;
}

bool is_conda_env(const fs::path& prefix) { return is_dir(prefix / "conda-meta"); }
bool is_venv_dir(const fs::path& prefix) {
  return path_exists(prefix / "pyvenv.cfg") || path_exists(prefix / "bin" / "activate");
}

// The name conda gives env `prefix`: its dir name under an envs/ dir, else "base" for an
// install root, else the dir name.
std::string conda_env_name(const fs::path& prefix) {
  const fs::path p = normal_dir(prefix);
  if (p.parent_path().filename() == "envs") return p.filename().string();
  if (is_dir(p / "condabin") || is_dir(p / "envs") || path_exists(p / "bin" / "conda") ||
      path_exists(p / "bin" / "mamba")) {
    return "base";
  }
  return p.filename().string();
}

// Collects candidates in order, applying the one-per-directory dedup rule (see pyenvs.hpp).
class Collector {
 public:
  explicit Collector(const LocatorEnv& env) : env_(env) {
    home_ = env.get("HOME");
    if (home_.empty()) {
      struct passwd pw {};
      struct passwd* res = nullptr;
      std::vector<char> buf(16384);
      if (::getpwuid_r(::getuid(), &pw, buf.data(), buf.size(), &res) == 0 && res && res->pw_dir) {
        home_ = res->pw_dir;
      }
    }
  }

  const LocatorEnv& env() const { return env_; }

  // ~/rel, or nullopt when there is no home directory.
  std::optional<fs::path> home(const char* rel) const {
    if (home_.empty()) return std::nullopt;
    return fs::path(home_) / rel;
  }

  // $name as a path, or nullopt when unset or empty.
  std::optional<fs::path> var(const char* name) const {
    const std::string v = env_.get(name);
    if (v.empty()) return std::nullopt;
    return fs::path(v);
  }

  // "~/x" and "~" with HOME; $VAR and ${VAR} from the LocatorEnv.
  fs::path expand(std::string s) const {
    if (!home_.empty() && (s == "~" || s.rfind("~/", 0) == 0)) s = home_ + s.substr(1);
    std::string out;
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (s[i] != '$' || i + 1 == s.size()) {
        out += s[i];
        continue;
      }
      std::size_t start = i + 1, end;
      bool braced = s[start] == '{';
      if (braced) {
        end = s.find('}', start);
        if (end == std::string::npos) {
          out += s.substr(i);
          break;
        }
        out += env_.get(s.substr(start + 1, end - start - 1));
        i = end;
      } else {
        end = start;
        while (end < s.size() && (std::isalnum(static_cast<unsigned char>(s[end])) || s[end] == '_')) ++end;
        if (end == start) {
          out += '$';
          continue;
        }
        out += env_.get(s.substr(start, end - start));
        i = end - 1;
      }
    }
    return fs::path(out);
  }

  // Lists the interpreter of bin dir `dir`, if it has one and the dedup rule allows it.
  void add_dir(const fs::path& dir, const std::string& source, const std::string& env_name) {
    const fs::path d = normal_dir(dir);
    const auto exe = interpreter_in(d);
    if (!exe) return;
    const std::string lexical = exe->string();
    if (!seen_paths_.insert(lexical).second) return;
    struct stat st {};
    if (::stat(d.c_str(), &st) == 0 && !seen_dirs_.emplace(st.st_dev, st.st_ino).second) return;
    out_.push_back({*exe, source, env_name});
  }

  // An env prefix: its bin/ dir.
  void add_prefix(const fs::path& prefix, const std::string& source, const std::string& env_name) {
    add_dir(prefix / "bin", source, env_name);
  }

  // A conda env prefix (must have conda-meta/).
  void add_conda(const fs::path& prefix) {
    if (is_conda_env(prefix)) add_prefix(prefix, "conda", conda_env_name(prefix));
  }

  // env_name for a directory found on PATH: the env it is the bin/ of, if it is one.
  std::string env_name_of_bin(const fs::path& dir) const {
    const fs::path d = normal_dir(dir);
    if (d.filename() != "bin") return "";
    const fs::path prefix = d.parent_path();
    if (is_conda_env(prefix)) return conda_env_name(prefix);
    if (is_venv_dir(prefix)) return prefix.filename().string();
    if (prefix.parent_path().filename() == "versions") return prefix.filename().string();  // pyenv
    if (prefix.parent_path().filename() == "envs" &&
        prefix.parent_path().parent_path().parent_path().filename() == "versions") {
      return prefix.filename().string();  // pyenv-virtualenv
    }
    return "";
  }

  std::vector<InterpreterCandidate> take() { return std::move(out_); }

 private:
  const LocatorEnv& env_;
  std::string home_;
  std::vector<InterpreterCandidate> out_;
  std::set<std::string> seen_paths_;
  std::set<std::pair<dev_t, ino_t>> seen_dirs_;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t pos = s.find(sep, start);
    out.push_back(s.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return out;
}

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

// A YAML scalar as written: surrounding quotes removed, a trailing " # comment" dropped.
std::string yaml_scalar(std::string s) {
  s = trim(s);
  if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front()) {
    return s.substr(1, s.size() - 2);
  }
  if (const auto hash = s.find(" #"); hash != std::string::npos) s = trim(s.substr(0, hash));
  return s;
}

// The `envs_dirs` list of a .condarc. Not a YAML parser: it understands the two forms conda
// itself writes and the docs show,
//     envs_dirs:                 envs_dirs: [~/a, "/b"]
//       - ~/conda-envs
//       - /opt/envs
// (a top-level `envs_dirs:` key, then `- item` lines, which end at the first other
// non-blank, non-comment line). Anything else yields nothing for that file.
std::vector<std::string> condarc_envs_dirs(const fs::path& file) {
  std::vector<std::string> out;
  std::ifstream in(file);
  if (!in) return out;
  std::string line;
  bool in_list = false;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::string t = trim(line);
    if (in_list) {
      if (t.empty() || t[0] == '#') continue;
      if (t[0] == '-' && (t.size() == 1 || t[1] == ' ' || t[1] == '\t')) {
        const std::string item = yaml_scalar(t.substr(1));
        if (!item.empty()) out.push_back(item);
        continue;
      }
      in_list = false;
    }
    if (line.rfind("envs_dirs:", 0) != 0) continue;
    std::string rest = trim(std::string_view(line).substr(10));
    if (const auto hash = rest.find('#'); hash == 0) rest.clear();
    if (rest.empty()) {
      in_list = true;
    } else if (rest.front() == '[' && rest.find(']') != std::string::npos) {
      for (const auto& item : split(rest.substr(1, rest.find(']') - 1), ',')) {
        const std::string v = yaml_scalar(item);
        if (!v.empty()) out.push_back(v);
      }
    }
  }
  return out;
}

bool is_pyenv_shims(const fs::path& dir) {
  const fs::path d = normal_dir(dir);
  return d.filename() == "shims" && d.parent_path().string().find("pyenv") != std::string::npos;
}

}  // namespace

std::vector<InterpreterCandidate> find_interpreters(const LocatorEnv& env) {
  Collector c(env);

  // 1-2. The activated environments.
  if (const auto v = c.var("VIRTUAL_ENV")) c.add_prefix(*v, "VIRTUAL_ENV", normal_dir(*v).filename().string());
  if (const auto v = c.var("CONDA_PREFIX")) c.add_prefix(*v, "CONDA_PREFIX", conda_env_name(*v));

  // 3. PATH, in order: never the cwd (empty or relative entries), never pyenv's shims (bash
  // scripts that pick a version by the cwd; the versions themselves come next).
  for (const auto& entry : split(env.get("PATH"), ':')) {
    if (entry.empty() || entry[0] != '/') continue;
    const fs::path dir(entry);
    if (is_pyenv_shims(dir)) continue;
    c.add_dir(dir, "PATH", c.env_name_of_bin(dir));
  }

  // 4. pyenv.
  std::optional<fs::path> pyenv_root = c.var("PYENV_ROOT");
  if (!pyenv_root) pyenv_root = c.var("PYENV");
  if (!pyenv_root) pyenv_root = c.home(".pyenv");
  if (pyenv_root) {
    for (const auto& version : child_dirs(*pyenv_root / "versions")) {
      c.add_prefix(version, "pyenv", version.filename().string());
      for (const auto& venv : child_dirs(version / "envs")) c.add_prefix(venv, "pyenv", venv.filename().string());
    }
  }

  // 5. venvs and virtualenvs in the usual places.
  std::vector<std::optional<fs::path>> venv_homes = {
      c.var("WORKON_HOME"),
      c.home(".virtualenvs"),
      c.home(".venvs"),
      c.home("envs"),
      c.var("XDG_DATA_HOME") ? std::optional<fs::path>(*c.var("XDG_DATA_HOME") / "virtualenvs") : std::nullopt,
      c.home(".local/share/virtualenvs"),
      c.home("Envs"),
      c.home(".direnv")};
  for (const auto& root : venv_homes) {
    if (!root) continue;
    for (const auto& child : child_dirs(*root)) {
      if (is_conda_env(child)) {
        c.add_conda(child);
      } else if (is_venv_dir(child)) {
        c.add_prefix(child, "venv", child.filename().string());
      }
    }
  }

  // 6. conda and mamba.
  if (const auto f = c.home(".conda/environments.txt")) {
    std::ifstream in(*f);
    std::string line;
    while (std::getline(in, line)) {
      const std::string t = trim(line);
      if (t.empty() || t[0] == '#') continue;
      c.add_conda(c.expand(t));
    }
  }
  std::vector<fs::path> condarcs = {"/etc/conda/.condarc"};
  if (const auto r = c.var("CONDA_ROOT")) condarcs.push_back(*r / ".condarc");
  if (const auto h = c.home(".condarc")) condarcs.push_back(*h);
  if (const auto h = c.home(".config/conda/.condarc")) condarcs.push_back(*h);
  for (const auto& rc : condarcs) {
    for (const auto& d : condarc_envs_dirs(rc)) {
      for (const auto& child : child_dirs(c.expand(d))) c.add_conda(child);
    }
  }
  for (const auto& d : split(env.get("CONDA_ENVS_PATH"), ':')) {
    if (d.empty()) continue;
    for (const auto& child : child_dirs(c.expand(d))) c.add_conda(child);
  }
  if (const auto d = c.home(".conda/envs")) {
    for (const auto& child : child_dirs(*d)) c.add_conda(child);
  }
  std::vector<std::optional<fs::path>> conda_roots = {
      c.var("CONDA_ROOT"),  c.var("MAMBA_ROOT_PREFIX"), c.home("anaconda3"),  c.home("miniconda3"),
      c.home("miniforge3"), c.home("mambaforge"),       c.home("micromamba"), fs::path("/opt/conda")};
  for (const auto& root : conda_roots) {
    if (!root) continue;
    c.add_conda(*root);
    for (const auto& child : child_dirs(*root / "envs")) c.add_conda(child);
  }

  // 7. poetry's cache.
  std::optional<fs::path> poetry = c.var("POETRY_VIRTUALENVS_PATH");
  if (!poetry) {
    if (const auto x = c.var("XDG_CACHE_HOME")) {
      poetry = *x / "pypoetry/virtualenvs";
    } else if (const auto h = c.home(".cache/pypoetry/virtualenvs")) {
      poetry = *h;
    }
  }
  if (poetry) {
    for (const auto& child : child_dirs(*poetry)) c.add_prefix(child, "poetry", child.filename().string());
  }

  // 8. The system's.
  c.add_dir("/usr/local/bin", "system", "");
  c.add_dir("/usr/bin", "system", "");
  return c.take();
}

// ---------------------------------------------------------------------------------------------
// The probe

namespace {

// Printed as one JSON line. Python 2 syntax-compatible up to the version check, so 2.7 exits
// with a message instead of a SyntaxError; the rest needs 3.6 (no f-strings, no walrus).
// ipykernel is located with find_spec and its version read from the dist metadata, so the
// probe imports nothing of ipykernel's (tens of ms and side effects saved).
constexpr const char* kProbeScript = R"PY(import sys
if sys.version_info[:2] < (3, 6):
    sys.stderr.write("Python %d.%d is not supported (need 3.6+)\n" % sys.version_info[:2])
    sys.exit(3)
if sys.path and sys.path[0] in ("", "."):
    del sys.path[0]
import json, os, platform, site
import importlib.util


def ipykernel_dir():
    try:
        spec = importlib.util.find_spec("ipykernel")
    except Exception:
        return None
    if spec is None or not spec.origin or spec.origin == "namespace":
        return None
    return os.path.dirname(spec.origin)


def dist_version(name):
    try:
        from importlib import metadata
        return metadata.version(name)
    except Exception:
        pass
    try:
        import importlib_metadata
        return importlib_metadata.version(name)
    except Exception:
        pass
    for d in sys.path:
        try:
            entries = sorted(os.listdir(d or "."))
        except OSError:
            continue
        for e in entries:
            if not e.lower().startswith(name + "-"):
                continue
            for meta in ("METADATA", "PKG-INFO", ""):
                f = os.path.join(d, e, meta) if meta else os.path.join(d, e)
                if not os.path.isfile(f):
                    continue
                try:
                    with open(f, encoding="utf-8", errors="replace") as fh:
                        for line in fh:
                            if line.startswith("Version:"):
                                return line.split(":", 1)[1].strip()
                            if not line.strip():
                                break
                except OSError:
                    pass
    return ""


def site_dirs():
    dirs = []
    try:
        dirs.extend(site.getsitepackages())
    except Exception:
        pass
    try:
        if site.ENABLE_USER_SITE:
            dirs.append(site.getusersitepackages())
    except Exception:
        pass
    for p in sys.path:
        if p.rstrip("/").endswith(("site-packages", "dist-packages")):
            dirs.append(p)
    out = []
    for d in dirs:
        if isinstance(d, str) and d and d not in out:
            out.append(d)
    return out


pkg = ipykernel_dir()
res = os.path.join(pkg, "resources") if pkg else ""
exe = sys.executable or ""
sys.stdout.write(json.dumps({
    "version": platform.python_version(),
    "major": sys.version_info[0],
    "minor": sys.version_info[1],
    "prefix": sys.prefix,
    "base_prefix": getattr(sys, "real_prefix", None) or getattr(sys, "base_prefix", sys.prefix),
    "executable": exe,
    "real_executable": os.path.realpath(exe) if exe else "",
    "has_ipykernel": pkg is not None,
    "ipykernel_version": dist_version("ipykernel") if pkg else "",
    "ipykernel_resources": res if res and os.path.isdir(res) else "",
    "site_dirs": site_dirs(),
}) + "\n")
)PY";

constexpr std::size_t kMaxStdout = 1 << 20;  // the JSON is a few hundred bytes
constexpr auto kExitGrace = std::chrono::milliseconds(200);  // pipes held open by a grandchild

// What identifies one version of a file or directory for the cache.
struct Stamp {
  bool exists = false;
  int err = 0;  // stat's errno when !exists
  dev_t dev = 0;
  ino_t ino = 0;
  mode_t mode = 0;
  off_t size = 0;
  long long mtime_ns = 0;
  bool operator==(const Stamp&) const = default;
};

Stamp stamp_of(const std::string& path, bool with_size) {
  Stamp s;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    s.err = errno;
    return s;
  }
  s.exists = true;
  s.dev = st.st_dev;
  s.ino = st.st_ino;
  s.mode = st.st_mode;
  s.size = with_size ? st.st_size : 0;
  s.mtime_ns = static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
  return s;
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string describe_duration(std::chrono::milliseconds d) {
  if (d.count() % 1000 == 0) return std::to_string(d.count() / 1000) + " s";
  return std::to_string(d.count()) + " ms";
}

// The line of the child's stderr that says what went wrong: for a Python traceback the
// exception (its last non-empty line), else the first non-empty line. Cut to 300 bytes.
std::string stderr_line(const std::string& head, const std::string& tail) {
  auto non_empty = [](const std::string& s) {
    std::vector<std::string> out;
    for (const auto& l : split(s, '\n')) {
      if (std::string t = trim(l); !t.empty()) out.push_back(std::move(t));
    }
    return out;
  };
  constexpr std::string_view kTraceback = "Traceback (most recent call last):";
  const bool traceback = head.find(kTraceback) != std::string::npos || tail.find(kTraceback) != std::string::npos;
  const auto lines = non_empty(traceback ? tail : head);
  std::string line = lines.empty() ? "" : traceback ? lines.back() : lines.front();
  if (line.size() > 300) line = line.substr(0, 297) + "...";
  return line;
}

// Runs `exe -E -c kProbeScript` in "/" with the daemon's environment (run(): stdin /dev/null,
// stdout and stderr captured, its process group killed at `timeout` and after it exits).
RunResult run_probe(const std::string& exe, std::chrono::milliseconds timeout) {
  RunOptions o;
  o.argv = {exe, "-E", "-c", kProbeScript};
  o.env = current_environment();
  o.cwd = "/";
  o.timeout = timeout;
  o.max_stdout = kMaxStdout;
  o.exit_grace = kExitGrace;
  return run(o);
}

// Fills `info` from the probe's stdout (its last non-empty line is the JSON object: a chatty
// sitecustomize may print before it). Returns false with info.error set on bad output.
bool parse_probe_output(const std::string& out, InterpreterInfo& info, std::vector<std::string>& site_dirs) {
  std::string line;
  for (const auto& l : split(out, '\n')) {
    if (!trim(l).empty()) line = trim(l);
  }
  if (line.empty()) {
    info.error = "unparseable probe output: the interpreter printed nothing";
    return false;
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(line);
    info.version = j.at("version").get<std::string>();
    info.major = j.at("major").get<int>();
    info.minor = j.at("minor").get<int>();
    info.prefix = j.at("prefix").get<std::string>();
    info.base_prefix = j.at("base_prefix").get<std::string>();
    info.executable = j.at("executable").get<std::string>();
    info.real_executable = j.at("real_executable").get<std::string>();
    info.has_ipykernel = j.at("has_ipykernel").get<bool>();
    info.ipykernel_version = j.at("ipykernel_version").get<std::string>();
    info.ipykernel_resources = j.at("ipykernel_resources").get<std::string>();
    site_dirs = j.at("site_dirs").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    std::string shown = line.size() > 80 ? line.substr(0, 77) + "..." : line;
    info.error = std::string("unparseable probe output (") + e.what() + "): " + shown;
    return false;
  }
  info.ok = true;
  return true;
}

}  // namespace

// One cache slot. `mu` is held for the whole probe, so a second caller for the same path waits
// for the first one's process instead of starting its own.
struct InterpreterProber::Entry {
  std::mutex mu;
  bool valid = false;
  InterpreterInfo info;
  Stamp exe;
  std::vector<std::pair<std::string, Stamp>> sites;
};

InterpreterProber::InterpreterProber(std::chrono::milliseconds timeout) : timeout_(timeout) {}

InterpreterInfo InterpreterProber::probe(const fs::path& path) {
  const std::string key = path.string();
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard lock(mu_);
    auto& slot = cache_[key];
    if (!slot) slot = std::make_shared<Entry>();
    entry = slot;
  }
  std::lock_guard lock(entry->mu);

  InterpreterInfo info;
  info.path = path;
  const Stamp exe = stamp_of(key, true);
  if (!exe.exists) {
    entry->valid = false;
    info.error = std::string("cannot run: ") + std::strerror(exe.err);
    return info;
  }
  if (entry->valid && entry->exe == exe && std::all_of(entry->sites.begin(), entry->sites.end(), [](const auto& s) {
        return stamp_of(s.first, false) == s.second;
      })) {
    return entry->info;
  }
  entry->valid = false;
  if (!S_ISREG(exe.mode)) {
    info.error = "not a regular file";
    return info;
  }
  if (::access(key.c_str(), X_OK) != 0) {
    info.error = std::string("not executable: ") + std::strerror(errno);
    return info;
  }

  const auto started = std::chrono::steady_clock::now();
  const RunResult r = run_probe(key, timeout_);
  if (r.started()) {
    std::lock_guard lock2(mu_);
    ++runs_;
  }
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);

  bool cacheable = true;
  std::vector<std::string> site_dirs;
  const std::string err_line = stderr_line(r.err_head, r.err_tail);
  auto with_stderr = [&](std::string s) { return err_line.empty() ? s : s + ": " + err_line; };
  if (!r.started()) {
    info.error = "cannot run: " + r.spawn_error;
    cacheable = false;
  } else if (r.timed_out) {
    info.error = "timed out after " + describe_duration(timeout_);
    cacheable = false;
  } else if (WIFSIGNALED(r.status)) {
    info.error = with_stderr("killed by signal " + signal_name(WTERMSIG(r.status)));
  } else if (WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0) {
    info.error = with_stderr("exited with code " + std::to_string(WEXITSTATUS(r.status)));
  } else if (r.out_overflow) {
    info.error = "unparseable probe output: more than 1 MiB";
  } else {
    parse_probe_output(r.out, info, site_dirs);
  }
  spdlog::debug("probe {}: {} in {} ms{}", key, info.ok ? "ok" : "failed", took.count(),
                info.ok ? "" : " (" + info.error + ")");

  if (cacheable) {
    entry->valid = true;
    entry->info = info;
    entry->exe = exe;
    entry->sites.clear();
    for (const auto& d : site_dirs) entry->sites.emplace_back(d, stamp_of(d, false));
  }
  return info;
}

std::vector<InterpreterInfo> InterpreterProber::probe_all(const std::vector<fs::path>& paths, unsigned parallel) {
  std::vector<InterpreterInfo> out(paths.size());
  if (paths.empty()) return out;
  const std::size_t workers = std::clamp<std::size_t>(parallel, 1, paths.size());
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < paths.size();) out[i] = probe(paths[i]);
  };
  std::vector<std::thread> threads;
  threads.reserve(workers - 1);
  // probe() logs.  spdlog's registry is a function-local static inside libspdlog; build it here,
  // before the workers exist, so no worker is the one that constructs it while another reads it.
  (void)spdlog::default_logger_raw();
  try {
    for (std::size_t t = 1; t < workers; ++t) threads.emplace_back(work);
  } catch (const std::system_error& e) {
    spdlog::warn("probe_all: {} of {} threads started ({})", threads.size() + 1, workers, e.what());
  }
  work();  // the calling thread is one of the workers
  for (auto& t : threads) t.join();
  return out;
}

void InterpreterProber::forget() {
  std::lock_guard lock(mu_);
  cache_.clear();
}

std::size_t InterpreterProber::probes_run() const {
  std::lock_guard lock(mu_);
  return runs_;
}

}  // namespace kgate
