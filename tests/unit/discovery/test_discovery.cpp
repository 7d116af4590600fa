// Kernel discovery: the search path against jupyter_client's own, and catalogs built from
// fixture trees with real interpreter probes (Debian's python3 has ipykernel).
#include "kgate/discovery/discovery.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include "support.hpp"

namespace kgate {
namespace {

namespace fs = std::filesystem;
using test::TempDir;
using test::write_file;

// jupyter_client's KernelSpecManager().kernel_dirs under exactly `vars`, first occurrence kept
// and relative entries (from empty JUPYTER_PATH segments) dropped, as kgate does.
std::vector<fs::path> jupyter_kernel_dirs(const TempDir& dir, const std::map<std::string, std::string>& vars) {
  write_file(dir.path() / "dirs.py",
             "from jupyter_client.kernelspec import KernelSpecManager\n"
             "seen = []\n"
             "for d in KernelSpecManager().kernel_dirs:\n"
             "    if d.startswith('/') and d not in seen: seen.append(d)\n"
             "print('\\n'.join(seen))\n");
  std::string cmd = "env -i";
  for (auto& [k, v] : vars) cmd += " '" + k + "=" + v + "'";
  cmd += std::string(" ") + KGATE_TEST_PYTHON + " '" + (dir.path() / "dirs.py").string() + "'";
  auto r = test::run_command(cmd);
  EXPECT_EQ(r.status, 0) << r.output;
  std::vector<fs::path> out;
  std::size_t start = 0;
  while (start < r.output.size()) {
    auto nl = r.output.find('\n', start);
    std::string line = r.output.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    if (!line.empty()) out.emplace_back(line);
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  return out;
}

TEST(SearchDirs, MatchJupyterClient) {
  TempDir t{"kgate-disc"};
  const std::string home = t.path().string();
  const std::vector<std::map<std::string, std::string>> cases = {
      {{"HOME", home}},
      {{"HOME", home}, {"JUPYTER_DATA_DIR", "/custom/data"}},
      {{"HOME", home}, {"XDG_DATA_HOME", home + "/xdg"}, {"IPYTHONDIR", home + "/ipy"}},
      {{"HOME", home}, {"JUPYTER_PATH", "/a/:/b::/a:/c//:/usr/share/jupyter/"}, {"JUPYTER_DATA_DIR", "/data"}},
      {{"HOME", home}, {"PYTHONUSERBASE", home + "/ub"}},
  };
  for (auto& vars : cases) {
    LocatorEnv env{vars};
    std::string label;
    for (auto& [k, v] : vars) label += k + "=" + v + " ";
    EXPECT_EQ(kernelspec_search_dirs(env), jupyter_kernel_dirs(t, vars)) << label;
  }
}

TEST(SearchDirs, EnvPrefixOrder) {
  TempDir t{"kgate-disc"};
  const std::string venv = t.path().string() + "/venv";
  fs::create_directories(venv);
  const fs::path env_dir = fs::path(venv) / "share/jupyter/kernels";
  const fs::path user_dir = "/data/kernels";
  auto pos = [](const std::vector<fs::path>& v, const fs::path& p) {
    return std::find(v.begin(), v.end(), p) - v.begin();
  };
  // Inside a venv the user owns, the env comes first (jupyter_core 5); the variable overrides.
  auto owned = kernelspec_search_dirs(LocatorEnv{{{"HOME", "/h"}, {"JUPYTER_DATA_DIR", "/data"}, {"VIRTUAL_ENV", venv}}});
  EXPECT_LT(pos(owned, env_dir), pos(owned, user_dir));
  auto no = kernelspec_search_dirs(LocatorEnv{
      {{"HOME", "/h"}, {"JUPYTER_DATA_DIR", "/data"}, {"VIRTUAL_ENV", venv}, {"JUPYTER_PREFER_ENV_PATH", "off"}}});
  EXPECT_GT(pos(no, env_dir), pos(no, user_dir));
  EXPECT_LT(pos(no, env_dir), pos(no, "/usr/share/jupyter/kernels"));
  // a conda base env is not preferred
  auto base = kernelspec_search_dirs(LocatorEnv{{{"HOME", "/h"}, {"JUPYTER_DATA_DIR", "/data"}, {"CONDA_PREFIX", venv}}});
  EXPECT_GT(pos(base, env_dir), pos(base, user_dir));
  auto yes = kernelspec_search_dirs(
      LocatorEnv{{{"HOME", "/h"}, {"JUPYTER_DATA_DIR", "/data"}, {"CONDA_PREFIX", venv}, {"JUPYTER_PREFER_ENV_PATH", "1"}}});
  EXPECT_LT(pos(yes, env_dir), pos(yes, user_dir));
}

void spec(const fs::path& root, const std::string& name, const std::string& json_text) {
  fs::create_directories(root / "kernels" / name);
  write_file(root / "kernels" / name / "kernel.json", json_text);
}

const CatalogEntry* by_source(const Catalog& c, const std::string& source) {
  for (auto& e : c.entries)
    if (e.source == source) return &e;
  return nullptr;
}

class CatalogTest : public ::testing::Test {
 protected:
  TempDir t{"kgate-cat"};
  fs::path home() const { return t.path() / "home"; }
  LocatorEnv env(const std::string& path) const {
    return LocatorEnv{{{"HOME", home().string()},
                       {"PATH", path},
                       {"JUPYTER_PATH", (t.path() / "a").string() + ":" + (t.path() / "b").string()},
                       {"JUPYTER_DATA_DIR", (t.path() / "data").string()}}};
  }
};

TEST_F(CatalogTest, PrecedenceCaseAndWarnings) {
  spec(t.path() / "a", "Echo", R"J({"argv": ["/bin/true", "{connection_file}"], "display_name": "A", "language": "x"})J");
  spec(t.path() / "b", "echo", R"J({"argv": ["/bin/true", "{connection_file}"], "display_name": "B", "language": "x"})J");
  spec(t.path() / "data", "broken", "{nope");
  spec(t.path() / "data", "nolaunch", R"J({"argv": ["no-such-program-kgate", "{connection_file}"], "display_name": "N", "language": "x"})J");
  DiscoveryOptions o;
  o.env = env("/bin:/usr/bin");
  o.interpreters = false;
  InterpreterProber prober;
  Catalog c = discover(o, prober);
  const CatalogEntry* echo = c.find("ECHO");
  ASSERT_NE(echo, nullptr);
  EXPECT_EQ(echo->spec.name, "echo");
  EXPECT_EQ(echo->spec.display_name, "A");
  EXPECT_TRUE(echo->launchable);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find((t.path() / "data/kernels/broken/kernel.json").string()), std::string::npos);
  const CatalogEntry* n = c.find("nolaunch");
  ASSERT_NE(n, nullptr);
  EXPECT_FALSE(n->launchable);
  EXPECT_NE(n->reason.find("not on PATH"), std::string::npos) << n->reason;
  EXPECT_EQ(prober.probes_run(), 0u);  // the quick pass probes nothing
}

TEST_F(CatalogTest, BarePythonResolvesToAnInterpreterWithIpykernel) {
  // PATH: first a python3 without ipykernel (a plain venv), then one with it (a venv that sees
  // Debian's dist-packages).
  auto venv = [&](const std::string& name, bool system_site) {
    fs::path dir = t.path() / name;
    std::string cmd = std::string(KGATE_TEST_PYTHON) + " -m venv --without-pip " +
                      (system_site ? "--system-site-packages " : "") + "'" + dir.string() + "' >/dev/null 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return dir / "bin" / "python3";
  };
  fs::path bin_without = venv("without", false);
  fs::path bin_with = venv("with", true);
  spec(t.path() / "a", "py", R"J({"argv": ["python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"], "display_name": "Py", "language": "python"})J");
  spec(t.path() / "a", "py39", R"J({"argv": ["python3.9", "-m", "ipykernel_launcher", "-f", "{connection_file}"], "display_name": "Py 3.9", "language": "python"})J");
  DiscoveryOptions o;
  o.env = env(bin_without.parent_path().string() + ":" + bin_with.parent_path().string());
  InterpreterProber prober;
  Catalog c = discover(o, prober);
  const CatalogEntry* py = c.find("py");
  ASSERT_NE(py, nullptr);
  EXPECT_TRUE(py->launchable) << py->reason;
  EXPECT_EQ(py->spec.argv[0], bin_with.string());
  // The one without ipykernel is listed, not launchable, with the reason.
  const CatalogEntry* w = by_source(c, bin_without.string());
  ASSERT_NE(w, nullptr) << catalog_json(c).dump(1);
  EXPECT_FALSE(w->launchable);
  EXPECT_EQ(w->reason, "ipykernel not installed");
  // No 3.9 with ipykernel here (Debian 12 has 3.11): not launchable, and says why.
  const CatalogEntry* p39 = c.find("py39");
  ASSERT_NE(p39, nullptr);
  if (!p39->launchable) {
    EXPECT_NE(p39->reason.find("no Python with ipykernel"), std::string::npos) << p39->reason;
  }
  // The hand-crafted spec for bin_with duplicates "py" (same interpreter, same argv): dropped.
  EXPECT_EQ(by_source(c, bin_with.string()), nullptr);
  // A default exists and is launchable.
  const CatalogEntry* d = c.find(c.default_name);
  ASSERT_NE(d, nullptr);
  EXPECT_TRUE(d->launchable);
}

TEST_F(CatalogTest, EnvSpecsAndDefaultSpecHidden) {
  // An "env": a prefix with bin/python3 (Debian's, so it has ipykernel) and its own kernelspecs.
  fs::path prefix = home() / ".virtualenvs" / "proj";
  fs::create_directories(prefix.parent_path());
  int rc = std::system((std::string(KGATE_TEST_PYTHON) + " -m venv --without-pip --system-site-packages '" +
                        prefix.string() + "' >/dev/null 2>&1").c_str());
  ASSERT_EQ(rc, 0);
  spec(prefix / "share/jupyter", "python3", R"J({"argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"], "display_name": "Python 3 (ipykernel)", "language": "python"})J");
  spec(prefix / "share/jupyter", "other", R"J({"argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"], "display_name": "Other", "language": "python", "env": {"X": "1"}})J");
  DiscoveryOptions o;
  o.env = env("/nonexistent");
  InterpreterProber prober;
  Catalog c = discover(o, prober);
  const CatalogEntry* venv = by_source(c, (prefix / "bin/python3").string());
  ASSERT_NE(venv, nullptr) << catalog_json(c).dump(1);
  EXPECT_TRUE(venv->launchable) << venv->reason;
  EXPECT_EQ(venv->env, "venv proj");
  EXPECT_EQ(venv->spec.name.rfind("py-proj-", 0), 0u) << venv->spec.name;
  // the env's own default python spec is hidden (the hand-crafted one replaces it) ...
  for (auto& e : c.entries) EXPECT_NE(e.source, (prefix / "share/jupyter/kernels/python3").string());
  // ... and its other spec is listed, run by the env's interpreter
  const CatalogEntry* other = by_source(c, (prefix / "share/jupyter/kernels/other").string());
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(other->kind, "env");
  EXPECT_EQ(other->spec.argv[0], (prefix / "bin/python3").string());
  // names are stable: a second discovery (cached probes) gives the same names
  Catalog again = discover(o, prober);
  ASSERT_EQ(again.entries.size(), c.entries.size());
  for (std::size_t i = 0; i < c.entries.size(); ++i) EXPECT_EQ(again.entries[i].spec.name, c.entries[i].spec.name);
}

TEST(DiscoveryService, QuickPassThenFullAndRefresh) {
  TempDir t{"kgate-svc"};
  spec(t.path() / "a", "one", R"J({"argv": ["/bin/true", "{connection_file}"], "display_name": "One", "language": "x"})J");
  DiscoveryOptions o;
  o.env = LocatorEnv{{{"HOME", (t.path() / "home").string()}, {"PATH", "/nonexistent"}, {"JUPYTER_PATH", (t.path() / "a").string()}}};
  DiscoveryService::Timing timing;
  timing.watch_interval = std::chrono::milliseconds(100);
  DiscoveryService svc(o, timing);
  svc.start();
  ASSERT_NE(svc.snapshot(), nullptr);
  EXPECT_NE(svc.snapshot()->find("one"), nullptr);
  auto full = svc.snapshot(std::chrono::seconds(30));
  EXPECT_TRUE(full->probed);
  bool called = false;
  svc.when_full([&] { called = true; });
  EXPECT_TRUE(called);
  // a new spec is noticed by the watch
  spec(t.path() / "a", "two", R"J({"argv": ["/bin/true", "{connection_file}"], "display_name": "Two", "language": "x"})J");
  bool seen = false;
  for (int i = 0; i < 100 && !seen; ++i) {
    seen = svc.snapshot()->find("two") != nullptr;
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(seen);
  auto gen = svc.refresh();
  auto after = svc.wait_for(gen, std::chrono::seconds(30));
  EXPECT_GE(svc.generation(), gen);
  svc.stop();
}

}  // namespace
}  // namespace kgate
