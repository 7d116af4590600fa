// Unit tests for kernelspec loading, validation, resource listing, directory scans and ${VAR} expansion.
#include "kgate/jupyter/kernelspec.hpp"
#include "kgate/jupyter/utf8.hpp"

#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>
#include <stdlib.h>

#include "support.hpp"

namespace kgate {
namespace {

namespace fs = std::filesystem;

const fs::path kData = kgate::test::data_dir() / "kernelspecs";

// A fresh kgate-kspec-XXXXXX temp dir (removed at the end of the test) that also writes kernelspecs.
class SpecDir : public test::TempDir {
 public:
  SpecDir() : TempDir("kgate-kspec") {}

  // Writes <root>/<name>/kernel.json with `json` and returns the spec directory.
  fs::path spec(const std::string& name, const std::string& json) const {
    const fs::path dir = path() / name;
    fs::create_directories(dir);
    std::ofstream(dir / "kernel.json") << json;
    return dir;
  }
};

// The message of the runtime_error load_kernelspec throws for `json`, or "" if it loads.
std::string load_error(const std::string& json) {
  SpecDir t;
  const fs::path dir = t.spec("k", json);
  try {
    load_kernelspec(dir);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(LoadKernelSpec, LoadsAllFields) {
  const KernelSpec s = load_kernelspec(kData / "first" / "Python3");
  EXPECT_EQ(s.name, "python3");
  EXPECT_EQ(s.resource_dir, kData / "first" / "Python3");
  EXPECT_EQ(s.argv, (std::vector<std::string>{"python3", "-m", "ipykernel_launcher", "-f",
                                              "{connection_file}"}));
  EXPECT_EQ(s.display_name, "Python 3 (ipykernel)");
  EXPECT_EQ(s.language, "python");
  EXPECT_EQ(s.interrupt_mode, "signal");
  EXPECT_EQ(s.env, (std::map<std::string, std::string>{{"KGATE_SPEC_VAR", "from-spec"}}));
  EXPECT_EQ(s.metadata, nlohmann::json({{"debugger", true}}));
  EXPECT_EQ(s.raw.at("kernel_protocol_version"), "5.3");
}

TEST(LoadKernelSpec, DefaultsForOptionalFields) {
  SpecDir t;
  const KernelSpec s = load_kernelspec(t.spec("MinImal", R"({"argv":["a"],"display_name":"D"})"));
  EXPECT_EQ(s.name, "minimal");
  EXPECT_EQ(s.language, "");
  EXPECT_EQ(s.interrupt_mode, "signal");
  EXPECT_TRUE(s.env.empty());
  EXPECT_EQ(s.metadata, nlohmann::json::object());
}

TEST(LoadKernelSpec, InterruptModeMessage) {
  const KernelSpec s = load_kernelspec(kData / "second" / "julia-1.9");
  EXPECT_EQ(s.name, "julia-1.9");
  EXPECT_EQ(s.interrupt_mode, "message");
}

TEST(LoadKernelSpec, TrailingSlashStillNamesTheDirectory) {
  SpecDir t;
  const fs::path dir = t.spec("Slashed", R"({"argv":["a"],"display_name":"D"})");
  EXPECT_EQ(load_kernelspec(dir.string() + "/").name, "slashed");
}

TEST(LoadKernelSpec, MissingFile) {
  SpecDir t;
  try {
    load_kernelspec(t.path());
    FAIL() << "expected an exception";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind((t.path() / "kernel.json").string() + ": ", 0), 0u) << msg;
  }
}

TEST(LoadKernelSpec, BadJsonNamesTheFile) {
  try {
    load_kernelspec(kData / "first" / "broken");
    FAIL() << "expected an exception";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind((kData / "first" / "broken" / "kernel.json").string() + ": ", 0), 0u)
        << msg;
    EXPECT_NE(msg.find("JSON"), std::string::npos) << msg;
  }
}

TEST(LoadKernelSpec, ValidationErrors) {
  struct Case {
    const char* json;
    const char* reason;
  };
  const Case cases[] = {
      {R"([1,2])", "not an object"},
      {R"({"display_name":"D"})", "argv is missing"},
      {R"({"argv":"python","display_name":"D"})", "argv is not an array"},
      {R"({"argv":[],"display_name":"D"})", "argv is empty"},
      {R"({"argv":["a",1],"display_name":"D"})", "argv contains a non-string"},
      {R"({"argv":["a"]})", "display_name is missing"},
      {R"({"argv":["a"],"display_name":3})", "display_name is not a string"},
      {R"({"argv":["a"],"display_name":"D","language":["py"]})", "language is not a string"},
      {R"({"argv":["a"],"display_name":"D","interrupt_mode":"sigint"})", "interrupt_mode must be"},
      {R"({"argv":["a"],"display_name":"D","interrupt_mode":1})", "interrupt_mode is not a string"},
      {R"({"argv":["a"],"display_name":"D","env":["A=1"]})", "env is not an object"},
      {R"({"argv":["a"],"display_name":"D","env":{"A":1}})", "env value for \"A\""},
      {R"({"argv":["a"],"display_name":"D","metadata":"x"})", "metadata is not an object"},
      // A number past double's range is nlohmann's out_of_range, not its parse_error (found by
      // fuzz_kernel_json): the same runtime_error naming the file.
      {R"({"argv":["a"],"display_name":"D","n":50e8001})", "invalid JSON"},
  };
  for (const auto& c : cases) {
    const std::string msg = load_error(c.json);
    EXPECT_NE(msg.find("kernel.json: "), std::string::npos) << c.json << " -> " << msg;
    EXPECT_NE(msg.find(c.reason), std::string::npos) << c.json << " -> " << msg;
  }
}

TEST(LoadKernelSpec, NullOptionalFieldsAreDefaults) {
  EXPECT_EQ(load_error(R"({"argv":["a"],"display_name":"D","language":null,)"
                       R"("interrupt_mode":null,"env":null,"metadata":null})"),
            "");
}

TEST(SpecJson, HasNormalizedKeysAndExtras) {
  const KernelSpec s = load_kernelspec(kData / "first" / "Python3");
  const nlohmann::json j = s.spec_json();
  EXPECT_EQ(j.at("argv"), nlohmann::json(s.argv));
  EXPECT_EQ(j.at("env"), nlohmann::json({{"KGATE_SPEC_VAR", "from-spec"}}));
  EXPECT_EQ(j.at("display_name"), "Python 3 (ipykernel)");
  EXPECT_EQ(j.at("language"), "python");
  EXPECT_EQ(j.at("interrupt_mode"), "signal");
  EXPECT_EQ(j.at("metadata"), nlohmann::json({{"debugger", true}}));
  EXPECT_EQ(j.at("kernel_protocol_version"), "5.3");
}

TEST(SpecJson, MinimalSpecGetsEveryKey) {
  SpecDir t;
  const KernelSpec s = load_kernelspec(t.spec("m", R"({"argv":["a"],"display_name":"D"})"));
  const nlohmann::json j = s.spec_json();
  EXPECT_EQ(j, nlohmann::json({{"argv", {"a"}},
                               {"env", nlohmann::json::object()},
                               {"display_name", "D"},
                               {"language", ""},
                               {"interrupt_mode", "signal"},
                               {"metadata", nlohmann::json::object()}}));
  EXPECT_TRUE(j.at("env").is_object());
}

TEST(Resources, ListsJsCssAndLogos) {
  const KernelSpec s = load_kernelspec(kData / "first" / "Python3");
  EXPECT_EQ(s.resources(), (std::map<std::string, std::string>{
                               {"kernel.js", "kernel.js"},
                               {"kernel.css", "kernel.css"},
                               {"logo-32x32", "logo-32x32.png"},
                               {"logo-64x64", "logo-64x64.png"},
                               {"logo-svg", "logo-svg.svg"},
                           }));
}

TEST(Resources, EmptyWhenNone) {
  const KernelSpec s = load_kernelspec(kData / "second" / "julia-1.9");
  EXPECT_TRUE(s.resources().empty());
  KernelSpec nowhere;
  nowhere.resource_dir = "/nonexistent/kgate/spec";
  EXPECT_TRUE(nowhere.resources().empty());
}

TEST(Scan, FirstDirectoryWinsAndBadSpecsWarn) {
  const KernelSpecScan scan = scan_kernelspecs(
      {kData / "first", kData / "does-not-exist", kData / "second"});
  ASSERT_EQ(scan.specs.size(), 2u);
  ASSERT_TRUE(scan.specs.count("python3"));
  ASSERT_TRUE(scan.specs.count("julia-1.9"));
  EXPECT_EQ(scan.specs.at("python3").display_name, "Python 3 (ipykernel)");
  EXPECT_EQ(scan.specs.at("python3").resource_dir, kData / "first" / "Python3");
  EXPECT_EQ(scan.specs.at("julia-1.9").language, "julia");
  ASSERT_EQ(scan.warnings.size(), 1u);
  EXPECT_EQ(scan.warnings[0].rfind((kData / "first" / "broken" / "kernel.json").string() + ": ", 0),
            0u)
      << scan.warnings[0];
}

TEST(Scan, OrderOfDirectoriesMatters) {
  const KernelSpecScan scan = scan_kernelspecs({kData / "second", kData / "first"});
  ASSERT_TRUE(scan.specs.count("python3"));
  EXPECT_EQ(scan.specs.at("python3").display_name, "Shadowed Python");
}

TEST(Scan, EmptyAndMissing) {
  EXPECT_TRUE(scan_kernelspecs({}).specs.empty());
  const KernelSpecScan scan = scan_kernelspecs({"/nonexistent/kgate/a", kData / "first" / "Python3"});
  EXPECT_TRUE(scan.specs.empty());
  EXPECT_TRUE(scan.warnings.empty());
}

TEST(Scan, CaseVariantsInOneDirectoryYieldOneSpec) {
  SpecDir t;
  t.spec("Foo", R"({"argv":["a"],"display_name":"Upper"})");
  t.spec("foo", R"({"argv":["a"],"display_name":"Lower"})");
  const KernelSpecScan scan = scan_kernelspecs({t.path()});
  ASSERT_EQ(scan.specs.size(), 1u);
  EXPECT_EQ(scan.specs.at("foo").name, "foo");
  EXPECT_TRUE(scan.warnings.empty());
}

TEST(Scan, IgnoresPlainFiles) {
  SpecDir t;
  std::ofstream(t.path() / "kernel.json") << R"({"argv":["a"],"display_name":"D"})";
  t.spec("ok", R"({"argv":["a"],"display_name":"D"})");
  const KernelSpecScan scan = scan_kernelspecs({t.path()});
  ASSERT_EQ(scan.specs.size(), 1u);
  EXPECT_TRUE(scan.specs.count("ok"));
}

// A directory name is bytes; a kernelspec name goes into every kernelspecs reply as JSON. One
// with invalid UTF-8 (it made GET /api/kernelspecs answer 500 for every client) is skipped with a
// warning that is itself valid UTF-8, and the others are still listed.
TEST(Scan, SkipsADirectoryNameThatIsNotUtf8) {
  SpecDir t;
  t.spec("bad\xff" "name", R"({"argv":["a"],"display_name":"Bad"})");
  t.spec("ok", R"({"argv":["a"],"display_name":"D"})");
  const KernelSpecScan scan = scan_kernelspecs({t.path()});
  ASSERT_EQ(scan.specs.size(), 1u);
  EXPECT_TRUE(scan.specs.count("ok"));
  ASSERT_EQ(scan.warnings.size(), 1u);
  EXPECT_TRUE(kgate::is_valid_utf8(scan.warnings[0])) << scan.warnings[0];
  EXPECT_NE(scan.warnings[0].find("must be valid UTF-8"), std::string::npos) << scan.warnings[0];
}

TEST(ExpandEnv, FromMapThenProcessEnvironment) {
  ::setenv("KGATE_TEST_EXPAND", "proc", 1);
  const std::map<std::string, std::string> env{{"A", "alpha"}, {"KGATE_TEST_EXPAND", "map"}};
  EXPECT_EQ(expand_env("${A}", env), "alpha");
  EXPECT_EQ(expand_env("x${A}y${A}z", env), "xalphayalphaz");
  EXPECT_EQ(expand_env("${KGATE_TEST_EXPAND}", env), "map");
  EXPECT_EQ(expand_env("${KGATE_TEST_EXPAND}", {}), "proc");
  ::unsetenv("KGATE_TEST_EXPAND");
}

TEST(ExpandEnv, UnknownIsEmpty) {
  ::unsetenv("KGATE_TEST_SURELY_UNSET");
  EXPECT_EQ(expand_env("a${KGATE_TEST_SURELY_UNSET}b", {}), "ab");
  EXPECT_EQ(expand_env("a${}b", {}), "ab");
}

TEST(ExpandEnv, LiteralDollars) {
  const std::map<std::string, std::string> env{{"A", "alpha"}};
  EXPECT_EQ(expand_env("", env), "");
  EXPECT_EQ(expand_env("no vars", env), "no vars");
  EXPECT_EQ(expand_env("$", env), "$");
  EXPECT_EQ(expand_env("cost $5", env), "cost $5");
  EXPECT_EQ(expand_env("$A", env), "$A");
  EXPECT_EQ(expand_env("${A", env), "${A");
  EXPECT_EQ(expand_env("${A}${A", env), "alpha${A");
  EXPECT_EQ(expand_env("$${A}", env), "$alpha");
  EXPECT_EQ(expand_env("trailing $", env), "trailing $");
}

}  // namespace
}  // namespace kgate
