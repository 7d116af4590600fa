// Unit tests for interpreter discovery: the locators over a fake HOME tree, and the probe and its
// cache against real processes (Debian's python3, real venvs, shell-script "interpreters").
#include "kgate/discovery/pyenvs.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "support.hpp"

namespace kgate {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

const fs::path kPython = KGATE_TEST_PYTHON;

// Writes an executable (or, with mode, any) file `p` with `body`, creating its directories.
void make_file(const fs::path& p, const std::string& body, fs::perms mode = fs::perms(0755)) {
  fs::create_directories(p.parent_path());
  test::write_file(p, body);
  fs::permissions(p, mode);
}

// A `#!/bin/sh` stand-in that runs the real interpreter with the probe's arguments.
void make_wrapper(const fs::path& p, const std::string& before_exec = "") {
  make_file(p, "#!/bin/sh\n" + before_exec + "exec " + kPython.string() + " \"$@\"\n");
}

// A `#!/bin/sh` stand-in that prints a canned probe answer with version `version`.
void make_canned(const fs::path& p, const std::string& version, const std::string& before = "") {
  make_file(p, "#!/bin/sh\n" + before +
                   "cat <<'EOF'\n"
                   "{\"version\": \"" +
                   version +
                   "\", \"major\": 3, \"minor\": 99, \"prefix\": \"/p\", "
                   "\"base_prefix\": \"/p\", \"executable\": \"/p/bin/python3\", "
                   "\"real_executable\": \"/p/bin/python3\", \"has_ipykernel\": false, "
                   "\"ipykernel_version\": \"\", \"ipykernel_resources\": \"\", \"site_dirs\": []}\n"
                   "EOF\n");
}

// Whether the process whose pid is in file `f` is gone (or a zombie) within 2 s: a SIGKILL
// takes effect when the target next runs, not at the kill() call.
bool pid_gone(const fs::path& f) {
  const std::string s = test::read_file(f);
  if (s.empty()) return true;
  const std::string proc = "/proc/" + std::to_string(std::stoi(s)) + "/stat";
  for (const auto until = clock_type::now() + 2s; clock_type::now() < until; std::this_thread::sleep_for(10ms)) {
    const std::string stat = test::read_file(proc);
    if (stat.empty()) return true;
    const auto paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z') return true;
  }
  return false;
}

// Sets an environment variable for the life of the object, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = ::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

struct Found {
  std::string path;  // relative to the tree root
  std::string source;
  std::string env_name;
  bool operator==(const Found&) const = default;
};

void PrintTo(const Found& f, std::ostream* os) {
  *os << "{" << f.path << ", " << f.source << ", " << f.env_name << "}";
}

// The candidates under `root`, with paths made relative to it.
std::vector<Found> under(const std::vector<InterpreterCandidate>& all, const fs::path& root) {
  std::vector<Found> out;
  for (const auto& c : all) {
    const std::string p = c.path.string();
    if (p.rfind(root.string() + "/", 0) == 0) out.push_back({p.substr(root.string().size() + 1), c.source, c.env_name});
  }
  return out;
}

TEST(FindInterpreters, FixtureHomeInOrderWithDedup) {
  test::TempDir t("kgate-pyenvs", test::TempDir::canonical);
  const fs::path h = t.path() / "home";
  // pyenv: two versions (natural order: 3.99 before 3.100), a pyenv-virtualenv env, the shims.
  make_wrapper(h / ".pyenv/versions/3.99.0/bin/python3");
  make_wrapper(h / ".pyenv/versions/3.99.0/bin/python3.99");
  make_wrapper(h / ".pyenv/versions/3.99.0/envs/tool/bin/python3");
  make_wrapper(h / ".pyenv/versions/3.100.0/bin/python");  // no python3: python is taken
  make_wrapper(h / ".pyenv/shims/python3");
  // venvs: one with pyvenv.cfg whose python3 is a symlink to its base (still listed), one
  // virtualenv with only bin/activate, one dir that is neither.
  make_file(h / ".virtualenvs/proj/pyvenv.cfg", "home = /x\n", fs::perms(0644));
  fs::create_directories(h / ".virtualenvs/proj/bin");
  fs::create_symlink(h / ".pyenv/versions/3.99.0/bin/python3", h / ".virtualenvs/proj/bin/python3");
  make_wrapper(h / ".virtualenvs/other/bin/python3");
  make_file(h / ".virtualenvs/other/bin/activate", "", fs::perms(0644));
  make_wrapper(h / ".virtualenvs/notavenv/bin/python3");
  // conda: a base with an env, an env elsewhere (listed in environments.txt), one from .condarc.
  fs::create_directories(h / "miniconda3/conda-meta");
  fs::create_directories(h / "miniconda3/condabin");
  make_wrapper(h / "miniconda3/bin/python3");
  fs::create_directories(h / "miniconda3/envs/ml3/conda-meta");
  make_wrapper(h / "miniconda3/envs/ml3/bin/python3");
  fs::create_directories(h / "condaenvs/ml/conda-meta");
  make_wrapper(h / "condaenvs/ml/bin/python3.9");
  make_wrapper(h / "condaenvs/ml/bin/python3.12");  // the highest python3.N
  make_file(h / "condaenvs/ml/bin/python3.12-config", "", fs::perms(0755));
  make_file(h / ".conda/environments.txt",
            (h / "miniconda3").string() + "\n\n# a comment\n" + (h / "condaenvs/ml").string() + "\n" +
                (h / "does-not-exist").string() + "\n",
            fs::perms(0644));
  make_file(h / ".condarc",
            "channels:\n  - conda-forge\nenvs_dirs:\n  # mine\n  - ~/more-envs\n  - "
            "\"/nonexistent\"\nauto_activate_base: false\n",
            fs::perms(0644));
  fs::create_directories(h / "more-envs/dl/conda-meta");
  make_wrapper(h / "more-envs/dl/bin/python3");
  fs::create_directories(h / "more-envs/empty/conda-meta");  // an env without python
  // poetry's cache.
  make_file(h / ".cache/pypoetry/virtualenvs/app-abc-py3.11/pyvenv.cfg", "", fs::perms(0644));
  make_wrapper(h / ".cache/pypoetry/virtualenvs/app-abc-py3.11/bin/python3");
  // PATH dirs: one listed twice (once with a trailing slash), a symlink to it, one whose python3
  // is not executable, one whose python3 is a directory.
  make_wrapper(t.path() / "pathbin1/python3");
  fs::create_directory_symlink(t.path() / "pathbin1", t.path() / "pathlink");
  make_file(t.path() / "pathbin2/python3", "#!/bin/sh\n", fs::perms(0644));
  fs::create_directories(t.path() / "pathbin3/python3");

  LocatorEnv env;
  env.vars["HOME"] = h.string();
  env.vars["VIRTUAL_ENV"] = (h / ".virtualenvs/proj").string();
  const std::string r = t.path().string();
  env.vars["PATH"] = (h / ".pyenv/shims").string() + ":" + r + "/pathbin1:" + r + "/pathbin1/:" + r +
                     "/pathlink:" + "relative/bin::" + r + "/pathbin2:" + r +
                     "/pathbin3:" + (h / "condaenvs/ml/bin").string() + ":" + r + "/./pathbin1";

  const auto all = find_interpreters(env);
  const std::vector<Found> want = {
      {"home/.virtualenvs/proj/bin/python3", "VIRTUAL_ENV", "proj"},
      {"pathbin1/python3", "PATH", ""},
      {"home/condaenvs/ml/bin/python3.12", "PATH", "ml"},
      {"home/.pyenv/versions/3.99.0/bin/python3", "pyenv", "3.99.0"},
      {"home/.pyenv/versions/3.99.0/envs/tool/bin/python3", "pyenv", "tool"},
      {"home/.pyenv/versions/3.100.0/bin/python", "pyenv", "3.100.0"},
      {"home/.virtualenvs/other/bin/python3", "venv", "other"},
      {"home/miniconda3/bin/python3", "conda", "base"},
      {"home/more-envs/dl/bin/python3", "conda", "dl"},
      {"home/miniconda3/envs/ml3/bin/python3", "conda", "ml3"},
      {"home/.cache/pypoetry/virtualenvs/app-abc-py3.11/bin/python3", "poetry", "app-abc-py3.11"},
  };
  EXPECT_EQ(under(all, t.path()), want);

  // The system's come last, and a path is never listed twice.
  if (fs::exists("/usr/bin/python3")) {
    ASSERT_FALSE(all.empty());
    EXPECT_EQ(all.back().path, "/usr/bin/python3");
    EXPECT_EQ(all.back().source, "system");
  }
  std::vector<std::string> paths;
  for (const auto& c : all) paths.push_back(c.path.string());
  std::sort(paths.begin(), paths.end());
  EXPECT_EQ(std::adjacent_find(paths.begin(), paths.end()), paths.end());
}

TEST(FindInterpreters, VariablesOverrideTheUsualPlaces) {
  test::TempDir t("kgate-pyenvs", test::TempDir::canonical);
  const fs::path h = t.path() / "home";
  const fs::path r = t.path();
  make_wrapper(r / "pyroot/versions/3.98.1/bin/python3");
  make_wrapper(h / ".pyenv/versions/3.97.0/bin/python3");  // ignored: PYENV_ROOT wins
  fs::create_directories(r / "active/conda-meta");
  make_wrapper(r / "active/bin/python3");
  make_file(r / "workon/wv/pyvenv.cfg", "", fs::perms(0644));
  make_wrapper(r / "workon/wv/bin/python3");
  make_file(r / "xdgdata/virtualenvs/xv/pyvenv.cfg", "", fs::perms(0644));
  make_wrapper(r / "xdgdata/virtualenvs/xv/bin/python3");
  fs::create_directories(r / "cep/ce/conda-meta");
  make_wrapper(r / "cep/ce/bin/python3");
  make_file(h / ".config/conda/.condarc", "envs_dirs: [" + (r / "flow").string() + ", '$FLOWVAR/x']\n",
            fs::perms(0644));
  fs::create_directories(r / "flow/fe/conda-meta");
  make_wrapper(r / "flow/fe/bin/python3");
  fs::create_directories(r / "fromvar/x/ve/conda-meta");
  make_wrapper(r / "fromvar/x/ve/bin/python3");
  fs::create_directories(r / "mamba/envs/me/conda-meta");
  make_wrapper(r / "mamba/envs/me/bin/python3");
  make_wrapper(r / "poetry/pv/bin/python3");
  make_wrapper(h / ".cache/pypoetry/virtualenvs/ignored/bin/python3");  // POETRY_VIRTUALENVS_PATH wins

  LocatorEnv env;
  env.vars = {{"HOME", h.string()},
              {"PYENV_ROOT", (r / "pyroot").string()},
              {"PYENV", (h / ".pyenv").string()},
              {"CONDA_PREFIX", (r / "active").string()},
              {"WORKON_HOME", (r / "workon").string()},
              {"XDG_DATA_HOME", (r / "xdgdata").string()},
              {"CONDA_ENVS_PATH", (r / "nothing").string() + ":" + (r / "cep").string()},
              {"FLOWVAR", (r / "fromvar").string()},
              {"MAMBA_ROOT_PREFIX", (r / "mamba").string()},
              {"POETRY_VIRTUALENVS_PATH", (r / "poetry").string()}};
  const std::vector<Found> want = {
      {"active/bin/python3", "CONDA_PREFIX", "active"},
      {"pyroot/versions/3.98.1/bin/python3", "pyenv", "3.98.1"},
      {"workon/wv/bin/python3", "venv", "wv"},
      {"xdgdata/virtualenvs/xv/bin/python3", "venv", "xv"},
      {"flow/fe/bin/python3", "conda", "fe"},
      {"fromvar/x/ve/bin/python3", "conda", "ve"},
      {"cep/ce/bin/python3", "conda", "ce"},
      {"mamba/envs/me/bin/python3", "conda", "me"},
      {"poetry/pv/bin/python3", "poetry", "pv"},
  };
  EXPECT_EQ(under(find_interpreters(env), t.path()), want);
}

TEST(FindInterpreters, EmptyEnvironmentDoesNotThrow) {
  LocatorEnv env;  // no HOME: the passwd entry is used
  std::vector<InterpreterCandidate> all;
  EXPECT_NO_THROW(all = find_interpreters(env));
  for (const auto& c : all) EXPECT_TRUE(c.path.is_absolute()) << c.path;
}

// ---------------------------------------------------------------------------------------------
// The probe, against real processes.

TEST(Probe, SystemPythonHasIpykernel) {
  InterpreterProber prober;
  const auto t0 = clock_type::now();
  const InterpreterInfo info = prober.probe(kPython);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t0).count();
  std::printf("probe of %s: %lld ms\n", kPython.c_str(), static_cast<long long>(ms));
  ASSERT_TRUE(info.ok) << info.error;
  EXPECT_EQ(info.path, kPython);
  EXPECT_EQ(info.major, 3);
  EXPECT_GE(info.minor, 6);
  EXPECT_EQ(info.version.rfind(std::to_string(info.major) + "." + std::to_string(info.minor) + ".", 0), 0u)
      << info.version;
  EXPECT_EQ(info.prefix, "/usr");
  EXPECT_FALSE(info.is_venv());
  EXPECT_EQ(info.executable, kPython);
  EXPECT_TRUE(info.real_executable.is_absolute());
  EXPECT_TRUE(info.has_ipykernel);
  EXPECT_FALSE(info.ipykernel_version.empty());
  EXPECT_TRUE(fs::exists(info.ipykernel_resources / "logo-64x64.png")) << info.ipykernel_resources;
  EXPECT_EQ(prober.probes_run(), 1u);
}

// Real venvs made by the system python: one sees the system site-packages, one does not.
class VenvProbe : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir("kgate-venvs", test::TempDir::canonical);
    for (const auto& [name, flags] : {std::pair{"sys", "--system-site-packages "}, std::pair{"plain", ""}}) {
      const auto r = test::run_command(kPython.string() + " -m venv --without-pip " + flags + "'" +
                                       (dir_->path() / name).string() + "' 2>&1");
      ASSERT_EQ(r.status, 0) << "python3 -m venv failed (is python3-venv installed?): " << r.output;
    }
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static test::TempDir* dir_;
};
test::TempDir* VenvProbe::dir_ = nullptr;

TEST_F(VenvProbe, SystemSitePackagesVenvHasIpykernel) {
  InterpreterProber prober;
  const fs::path venv = dir_->path() / "sys";
  const InterpreterInfo info = prober.probe(venv / "bin/python3");
  ASSERT_TRUE(info.ok) << info.error;
  EXPECT_TRUE(info.has_ipykernel);
  EXPECT_EQ(info.prefix, venv);
  EXPECT_EQ(info.base_prefix, "/usr");
  EXPECT_TRUE(info.is_venv());
  EXPECT_EQ(info.executable, venv / "bin/python3");
  EXPECT_EQ(info.real_executable, fs::canonical(kPython));
}

TEST_F(VenvProbe, PlainVenvHasNoIpykernel) {
  InterpreterProber prober;
  const fs::path venv = dir_->path() / "plain";
  const InterpreterInfo info = prober.probe(venv / "bin/python");
  ASSERT_TRUE(info.ok) << info.error;
  EXPECT_FALSE(info.has_ipykernel);
  EXPECT_EQ(info.ipykernel_version, "");
  EXPECT_EQ(info.ipykernel_resources, "");
  EXPECT_EQ(info.prefix, venv);
  EXPECT_TRUE(info.is_venv());
}

TEST_F(VenvProbe, VenvIsFoundAndKeptApartFromItsBase) {
  LocatorEnv env;
  env.vars["HOME"] = (dir_->path() / "nohome").string();
  env.vars["WORKON_HOME"] = dir_->path().string();
  env.vars["PATH"] = "/usr/bin";
  const auto all = find_interpreters(env);
  EXPECT_EQ(under(all, dir_->path()),
            (std::vector<Found>{{"plain/bin/python3", "venv", "plain"}, {"sys/bin/python3", "venv", "sys"}}));
}

// A `pip install --user` ipykernel: seen (the probe does not pass -s), and its appearance is
// noticed through the cache (the user site did not exist at the first probe).
TEST(Probe, UserSiteIpykernelIsSeenAndInvalidatesTheCache) {
  // An interpreter without ipykernel of its own that uses the user site: a pyenv build, if any.
  const char* real_home = ::getenv("HOME");
  fs::path py;
  std::error_code ec;
  for (const auto& v : fs::directory_iterator(fs::path(real_home ? real_home : "/") / ".pyenv/versions", ec)) {
    if (fs::exists(v.path() / "bin/python3") && !fs::exists(v.path() / "bin/python2")) py = v.path() / "bin/python3";
  }
  if (py.empty()) GTEST_SKIP() << "no ~/.pyenv/versions/*/bin/python3 to test the user site with";

  test::TempDir t("kgate-usersite", test::TempDir::canonical);
  const auto us = test::run_command("HOME='" + t.path().string() + "' '" + py.string() +
                                    "' -E -c 'import site; print(site.getusersitepackages())'");
  ASSERT_EQ(us.status, 0);
  const fs::path user_site = us.output.substr(0, us.output.find('\n'));
  ASSERT_EQ(user_site.string().rfind(t.path().string(), 0), 0u) << user_site;

  ScopedEnv home("HOME", t.path().string());
  ScopedEnv nousersite("PYTHONNOUSERSITE", "1");  // ignored: the probe runs with -E
  InterpreterProber prober;
  InterpreterInfo info = prober.probe(py);
  ASSERT_TRUE(info.ok) << info.error;
  if (info.has_ipykernel) GTEST_SKIP() << py << " has ipykernel of its own";

  make_file(user_site / "ipykernel/__init__.py", "", fs::perms(0644));
  fs::create_directories(user_site / "ipykernel/resources");
  make_file(user_site / "ipykernel-9.9.9.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: ipykernel\nVersion: 9.9.9\n", fs::perms(0644));
  info = prober.probe(py);
  ASSERT_TRUE(info.ok) << info.error;
  EXPECT_EQ(prober.probes_run(), 2u);
  EXPECT_TRUE(info.has_ipykernel);
  EXPECT_EQ(info.ipykernel_version, "9.9.9");
  EXPECT_EQ(info.ipykernel_resources, user_site / "ipykernel/resources");
}

TEST(Probe, CacheSkipsTheProcessUntilTheInterpreterChanges) {
  test::TempDir t("kgate-probe", test::TempDir::canonical);
  const fs::path py = t.path() / "bin/python3";
  make_wrapper(py);
  InterpreterProber prober;
  const InterpreterInfo first = prober.probe(py);
  ASSERT_TRUE(first.ok) << first.error;
  EXPECT_EQ(first.path, py);
  EXPECT_EQ(prober.probes_run(), 1u);

  const InterpreterInfo second = prober.probe(py);
  EXPECT_TRUE(second.ok);
  EXPECT_EQ(second.version, first.version);
  EXPECT_EQ(prober.probes_run(), 1u);

  // A new mtime (same content and size): probed again.
  fs::last_write_time(py, fs::last_write_time(py) - 1h);
  EXPECT_TRUE(prober.probe(py).ok);
  EXPECT_EQ(prober.probes_run(), 2u);
  EXPECT_TRUE(prober.probe(py).ok);
  EXPECT_EQ(prober.probes_run(), 2u);

  prober.forget();
  EXPECT_TRUE(prober.probe(py).ok);
  EXPECT_EQ(prober.probes_run(), 3u);
}

TEST(Probe, ConcurrentProbesOfOnePathStartOneProcess) {
  test::TempDir t("kgate-probe", test::TempDir::canonical);
  const fs::path py = t.path() / "python3";
  make_canned(py, "3.99.7", "sleep 0.3\n");
  InterpreterProber prober;
  std::vector<std::thread> threads;
  std::vector<InterpreterInfo> got(4);
  for (std::size_t i = 0; i < got.size(); ++i) threads.emplace_back([&, i] { got[i] = prober.probe(py); });
  for (auto& th : threads) th.join();
  for (const auto& info : got) {
    EXPECT_TRUE(info.ok) << info.error;
    EXPECT_EQ(info.version, "3.99.7");
  }
  EXPECT_EQ(prober.probes_run(), 1u);
}

TEST(Probe, TimeoutKillsTheProcessGroup) {
  test::TempDir t("kgate-probe", test::TempDir::canonical);
  const fs::path py = t.path() / "python3";
  make_file(py, "#!/bin/sh\nsleep 30 &\necho $! > '" + (t.path() / "bg.pid").string() + "'\necho $$ > '" +
                    (t.path() / "sh.pid").string() + "'\nsleep 30\n");
  InterpreterProber prober(300ms);
  const auto t0 = clock_type::now();
  const InterpreterInfo info = prober.probe(py);
  const auto took = clock_type::now() - t0;
  EXPECT_FALSE(info.ok);
  EXPECT_EQ(info.error, "timed out after 300 ms");
  EXPECT_LT(took, 3s);
  EXPECT_TRUE(pid_gone(t.path() / "sh.pid"));
  EXPECT_TRUE(pid_gone(t.path() / "bg.pid"));  // same process group
  // A timeout is not cached: the next call tries again.
  prober.probe(py);
  EXPECT_EQ(prober.probes_run(), 2u);
}

TEST(Probe, BackgroundChildHoldingThePipeDoesNotDelayTheResult) {
  test::TempDir t("kgate-probe", test::TempDir::canonical);
  const fs::path py = t.path() / "python3";
  make_canned(py, "3.99.1", "sleep 30 &\necho $! > '" + (t.path() / "bg.pid").string() + "'\n");
  InterpreterProber prober(5s);
  const auto t0 = clock_type::now();
  const InterpreterInfo info = prober.probe(py);
  EXPECT_LT(clock_type::now() - t0, 2s);
  EXPECT_TRUE(info.ok) << info.error;
  EXPECT_EQ(info.version, "3.99.1");
  EXPECT_TRUE(pid_gone(t.path() / "bg.pid"));
}

TEST(Probe, FailuresSayWhatHappened) {
  test::TempDir t("kgate-probe", test::TempDir::canonical);
  InterpreterProber prober(5s);

  make_file(t.path() / "garbage", "#!/bin/sh\necho 'hello, not json'\n");
  InterpreterInfo info = prober.probe(t.path() / "garbage");
  EXPECT_FALSE(info.ok);
  EXPECT_EQ(info.error.rfind("unparseable probe output", 0), 0u) << info.error;
  EXPECT_NE(info.error.find("hello, not json"), std::string::npos) << info.error;

  make_file(t.path() / "silent", "#!/bin/sh\nexit 0\n");
  info = prober.probe(t.path() / "silent");
  EXPECT_EQ(info.error, "unparseable probe output: the interpreter printed nothing");

  make_file(t.path() / "wrongshape", "#!/bin/sh\necho '{\"version\": 3}'\n");
  info = prober.probe(t.path() / "wrongshape");
  EXPECT_FALSE(info.ok);
  EXPECT_EQ(info.error.rfind("unparseable probe output", 0), 0u) << info.error;

  make_file(t.path() / "exits", "#!/bin/sh\necho 'boom: bad thing' >&2\necho more >&2\nexit 7\n");
  info = prober.probe(t.path() / "exits");
  EXPECT_EQ(info.error, "exited with code 7: boom: bad thing");

  make_file(t.path() / "traceback", "#!/bin/sh\nexec " + kPython.string() + " -c 'import nosuchmodule_kgate'\n");
  info = prober.probe(t.path() / "traceback");
  EXPECT_EQ(info.error, "exited with code 1: ModuleNotFoundError: No module named 'nosuchmodule_kgate'");

  make_file(t.path() / "crashes", "#!/bin/sh\nkill -SEGV $$\n");
  info = prober.probe(t.path() / "crashes");
  EXPECT_EQ(info.error, "killed by signal SIGSEGV");

  make_file(t.path() / "noexec", "#!/bin/sh\n", fs::perms(0644));
  const std::size_t runs = prober.probes_run();
  info = prober.probe(t.path() / "noexec");
  EXPECT_FALSE(info.ok);
  EXPECT_EQ(info.error, "not executable: Permission denied");
  info = prober.probe(t.path() / "missing");
  EXPECT_EQ(info.error, "cannot run: No such file or directory");
  info = prober.probe(t.path());
  EXPECT_EQ(info.error, "not a regular file");
  EXPECT_EQ(prober.probes_run(), runs);  // none of these started a process

  // Becoming executable is noticed (the mode is part of the cache key).
  fs::permissions(t.path() / "noexec", fs::perms(0755));
  info = prober.probe(t.path() / "noexec");
  EXPECT_EQ(info.error, "unparseable probe output: the interpreter printed nothing");

  // A failure is cached like a success.
  const std::size_t before = prober.probes_run();
  EXPECT_EQ(prober.probe(t.path() / "exits").error, "exited with code 7: boom: bad thing");
  EXPECT_EQ(prober.probes_run(), before);
}

TEST(Probe, Python2FailsCleanly) {
  const char* real_home = ::getenv("HOME");
  fs::path py;
  std::error_code ec;
  for (const auto& v : fs::directory_iterator(fs::path(real_home ? real_home : "/") / ".pyenv/versions", ec)) {
    if (fs::exists(v.path() / "bin/python2")) py = v.path() / "bin/python";
  }
  if (py.empty()) GTEST_SKIP() << "no pyenv Python 2";
  InterpreterProber prober;
  const InterpreterInfo info = prober.probe(py);
  EXPECT_FALSE(info.ok);
  EXPECT_NE(info.error.find("exited with code 3: Python 2."), std::string::npos) << info.error;
  EXPECT_NE(info.error.find("is not supported"), std::string::npos) << info.error;
}

TEST(Probe, ProbeAllKeepsOrderAndTheParallelBound) {
  test::TempDir t("kgate-probe", test::TempDir::canonical);
  std::vector<fs::path> paths;
  for (int i = 0; i < 6; ++i) {
    const fs::path p = t.path() / ("py" + std::to_string(i));
    const std::string log = (t.path() / ("log" + std::to_string(i))).string();
    // Each records when it started and ended (ns), sleeping in between.
    make_canned(p, "3.99." + std::to_string(i), "date +%s%N > '" + log + "'\nsleep 0.3\ndate +%s%N >> '" + log + "'\n");
    paths.push_back(p);
  }
  paths.push_back(t.path() / "py2");  // a duplicate: probed once, answered twice
  InterpreterProber prober;
  const auto t0 = clock_type::now();
  const auto infos = prober.probe_all(paths, 2);
  const auto took = clock_type::now() - t0;
  ASSERT_EQ(infos.size(), paths.size());
  for (std::size_t i = 0; i < paths.size(); ++i) {
    EXPECT_EQ(infos[i].path, paths[i]);
    EXPECT_TRUE(infos[i].ok) << infos[i].error;
    EXPECT_EQ(infos[i].version, "3.99." + std::to_string(i == 6 ? 2 : i));
  }
  EXPECT_EQ(prober.probes_run(), 6u);

  std::vector<std::pair<long long, int>> events;  // (time, +1 start / -1 end)
  for (int i = 0; i < 6; ++i) {
    std::istringstream in(test::read_file(t.path() / ("log" + std::to_string(i))));
    long long start = 0, end = 0;
    ASSERT_TRUE(in >> start >> end);
    events.emplace_back(start, +1);
    events.emplace_back(end, -1);
  }
  std::sort(events.begin(), events.end());
  int running = 0, peak = 0;
  for (const auto& e : events) peak = std::max(peak, running += e.second);
  EXPECT_EQ(peak, 2);
  EXPECT_LT(took, 6 * 300ms);  // not one after another
}

TEST(Probe, ProbeAllOfThisMachine) {
  // Timings for the report; no assertion beyond "each ends, in order".
  const char* real_home = ::getenv("HOME");
  std::vector<fs::path> paths;
  std::error_code ec;
  for (const auto& v : fs::directory_iterator(fs::path(real_home ? real_home : "/") / ".pyenv/versions", ec)) {
    for (const char* n : {"python3", "python"}) {
      if (fs::exists(v.path() / "bin" / n)) {
        paths.push_back(v.path() / "bin" / n);
        break;
      }
    }
  }
  std::sort(paths.begin(), paths.end());
  paths.push_back(kPython);
  InterpreterProber prober;
  const auto t0 = clock_type::now();
  const auto infos = prober.probe_all(paths, 4);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t0).count();
  std::printf("probe_all of %zu interpreters, 4 at a time: %lld ms\n", paths.size(), static_cast<long long>(ms));
  ASSERT_EQ(infos.size(), paths.size());
  for (std::size_t i = 0; i < paths.size(); ++i) {
    EXPECT_EQ(infos[i].path, paths[i]);
    std::printf(
        "  %s: %s\n", paths[i].c_str(),
        infos[i].ok
            ? (infos[i].version + (infos[i].has_ipykernel ? " ipykernel " + infos[i].ipykernel_version : "")).c_str()
            : infos[i].error.c_str());
  }
  EXPECT_TRUE(infos.back().ok);
  const auto t1 = clock_type::now();
  prober.probe_all(paths, 4);
  std::printf(
      "again, cached: %lld us\n",
      static_cast<long long>(std::chrono::duration_cast<std::chrono::microseconds>(clock_type::now() - t1).count()));
  EXPECT_EQ(prober.probes_run(), paths.size());
}

}  // namespace
}  // namespace kgate
