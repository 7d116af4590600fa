// Python interpreters on this machine: where they are (locators) and what they are (one probe
// each, cached). Kernel discovery (discovery.hpp) turns the ones with ipykernel into kernelspecs.
//
// Threading: find_interpreters is a pure function of its LocatorEnv and the file system.
// InterpreterProber is thread-safe; probe() blocks the caller for at most the probe timeout.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace kgate {

// The environment variables the locators read (PATH, HOME, PYENV_ROOT, PYENV, VIRTUAL_ENV,
// CONDA_PREFIX, CONDA_ROOT, CONDA_ENVS_PATH, MAMBA_ROOT_PREFIX, WORKON_HOME, XDG_DATA_HOME,
// XDG_CACHE_HOME, POETRY_VIRTUALENVS_PATH, ...). Tests pass their own; the daemon passes its own.
struct LocatorEnv {
  std::map<std::string, std::string> vars;
  std::string get(const std::string& name) const;  // "" when unset
  static LocatorEnv from_process();
};

struct InterpreterCandidate {
  std::filesystem::path path;  // as found, not resolved: a venv's bin/python stays in the venv
  std::string source;          // "VIRTUAL_ENV", "CONDA_PREFIX", "PATH", "pyenv", "venv", "conda",
                               // "poetry", "system"
  std::string env_name;        // the env's name (venv dir, conda env, pyenv version); "" for globals
};

// Every interpreter candidate, in this order (one locator after another, each in the order given):
//   1. $VIRTUAL_ENV/bin                                                   source "VIRTUAL_ENV"
//   2. $CONDA_PREFIX/bin                                                  "CONDA_PREFIX"
//   3. each absolute $PATH entry in order; pyenv shims (a dir named `shims` whose parent path
//      contains "pyenv") are skipped, as are empty and relative entries (the cwd)  "PATH"
//   4. pyenv root ($PYENV_ROOT, else $PYENV, else ~/.pyenv): versions/*/bin, each followed by
//      its versions/*/envs/*/bin (pyenv-virtualenv), versions in natural order   "pyenv"
//   5. children that are venvs (pyvenv.cfg or bin/activate) of $WORKON_HOME, ~/.virtualenvs,
//      ~/.venvs, ~/envs, $XDG_DATA_HOME/virtualenvs, ~/.local/share/virtualenvs, ~/Envs,
//      ~/.direnv                                                          "venv" ("conda" if
//      the child has conda-meta/)
//   6. conda/mamba envs (a dir with conda-meta/): the lines of ~/.conda/environments.txt; the
//      children of every `envs_dirs` entry in /etc/conda/.condarc, $CONDA_ROOT/.condarc,
//      ~/.condarc and ~/.config/conda/.condarc (read line by line, see pyenvs.cpp: only a
//      block list `envs_dirs:` + `  - path` lines or a flow list `envs_dirs: [a, b]`); the
//      children of each $CONDA_ENVS_PATH entry and of ~/.conda/envs; then for each root
//      $CONDA_ROOT, $MAMBA_ROOT_PREFIX, ~/anaconda3, ~/miniconda3, ~/miniforge3, ~/mambaforge,
//      ~/micromamba, /opt/conda: the root itself, then its envs/*              "conda"
//   7. poetry: children of $POETRY_VIRTUALENVS_PATH, else
//      ${XDG_CACHE_HOME:-~/.cache}/pypoetry/virtualenvs                      "poetry"
//   8. /usr/local/bin, /usr/bin                                           "system"
// Directory listings are sorted (natural order: 3.9 before 3.10). ~ is the LocatorEnv's HOME
// (the passwd entry only when HOME is unset or empty).
//
// One candidate per directory: `python3`, else `python`, else the highest `python3.N`, and only
// an existing regular file we may execute (symlinks are followed for that check, but the
// candidate keeps the unresolved path).
//
// Dedup rule: a candidate is skipped when its directory (the candidate path's parent, stat()ed
// through symlinks) is the same directory (st_dev, st_ino) as an already listed candidate's
// directory, or its path is lexically equal to one already listed. This drops /bin/python3 after
// /usr/bin/python3 on usrmerge systems, a PATH entry listed twice and a symlinked bin dir, but
// keeps a venv whose bin/python is a symlink to its base interpreter: that is a different
// environment (other sys.prefix, other site-packages), in a different directory.
//
// Never throws for file-system reasons: unreadable directories are skipped.
std::vector<InterpreterCandidate> find_interpreters(const LocatorEnv& env);

struct InterpreterInfo {
  std::filesystem::path path;  // the probed candidate path
  bool ok = false;             // the probe ran and its output parsed
  std::string error;           // when !ok, one line: "timed out after 10 s", "exited with code 1:
                               // <stderr line>", "killed by signal SIGSEGV: ...", "not executable",
                               // "unparseable probe output: ...", ...
  std::string version;         // "3.11.2"
  int major = 0, minor = 0;
  std::filesystem::path prefix, base_prefix;  // sys.prefix, sys.base_prefix
  std::filesystem::path executable;           // sys.executable
  std::filesystem::path real_executable;      // realpath(sys.executable)
  bool has_ipykernel = false;                 // importlib.util.find_spec("ipykernel") found a real
                                              // package (not a leftover namespace dir)
  std::string ipykernel_version;              // from the dist metadata, not an import; "" if unknown
  std::filesystem::path ipykernel_resources;  // <ipykernel package>/resources (logos), "" if none
  bool is_venv() const { return prefix != base_prefix; }  // legacy virtualenv: base = real_prefix
};

class InterpreterProber {
 public:
  explicit InterpreterProber(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // Runs `<path> -E -c <probe script>` once and parses the one JSON object it prints.
  //   -E, not -I: -I implies -s, which hides a `pip install --user` ipykernel that the kernel
  //   (launched without -s) would import. -E still ignores PYTHONPATH, PYTHONHOME,
  //   PYTHONSTARTUP, PYTHONNOUSERSITE and the rest; the cwd is kept out by running the child in
  //   "/" and by the script dropping sys.path[0] (the '' that -c adds) before importing anything.
  // The child: stdin /dev/null, stdout and stderr pipes (the error text uses the first 1 KiB and
  // last 2 KiB of stderr), our environment, a new process group that is SIGKILLed at the timeout
  // (and after the child exits, so nothing it started survives), always reaped before return.
  // Missing and non-executable paths fail without starting a process.
  //
  // Cache: keyed on the path string. An entry is reused, without starting a process, while the
  // interpreter file (stat through symlinks: mtime, size, inode, mode) and every site-packages
  // directory the probe reported (existence and mtime; the user site is reported only when it
  // is enabled, even before it exists) are unchanged, so installing or upgrading ipykernel in an
  // env is noticed on the next probe. Failed probes are cached the same way, except a timeout
  // or a failure to start the process, which are retried on the next call. Concurrent probe()
  // calls for one path start one process: the others wait for its result.
  // Python 2 fails cleanly: "exited with code 3: Python 2.7 is not supported (need 3.6+)".
  InterpreterInfo probe(const std::filesystem::path& path);
  // Probes many, at most `parallel` at a time; results in the order of `paths`.
  std::vector<InterpreterInfo> probe_all(const std::vector<std::filesystem::path>& paths, unsigned parallel = 4);
  void forget();               // drops the cache
  std::size_t probes_run() const;  // how many interpreter processes were started (tests, stats)

 private:
  struct Entry;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Entry>> cache_;
  std::size_t runs_ = 0;
};

}  // namespace kgate
