// Helpers shared by the unit tests (tests/unit/test_*.cpp): temp dirs, files, commands, patterns.
#pragma once

#include <stdlib.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace kgate::test {

namespace fs = std::filesystem;

// A fresh directory <temp>/<prefix>-XXXXXX (optionally symlink-resolved), removed with everything in it at scope exit.
class TempDir {
 public:
  enum Form { as_created, canonical };

  explicit TempDir(std::string_view prefix, Form form = as_created) {
    std::string tmpl = (fs::temp_directory_path() / (std::string(prefix) + "-XXXXXX")).string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = form == canonical ? fs::canonical(tmpl) : fs::path(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Whether `s` matches `pattern` char by char: 'x' lowercase hex, 'd' decimal, 'V' RFC 4122 variant [89ab], else literal.
inline bool matches_pattern(std::string_view s, std::string_view pattern) {
  // (Hand-rolled instead of std::regex, which trips GCC 12 warnings under the sanitizers.)
  if (s.size() != pattern.size()) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool digit = c >= '0' && c <= '9';
    switch (pattern[i]) {
      case 'x':
        if (!digit && !(c >= 'a' && c <= 'f')) return false;
        break;
      case 'd':
        if (!digit) return false;
        break;
      case 'V':
        if (c != '8' && c != '9' && c != 'a' && c != 'b') return false;
        break;
      default:
        if (c != pattern[i]) return false;
    }
  }
  return true;
}

// Paths a unit test needs that depend on where the checkout and the build are: "data" (tests/data)
// and "supervise" (kgate-supervise).  They are read at run time from unit_paths.txt beside the
// test binary (tests/CMakeLists.txt writes it), not compiled in: a unit test's object is then the
// same in every clone, and the compiler cache serves them all.
inline fs::path unit_path(std::string_view key) {
  std::error_code ec;
  const fs::path file = fs::read_symlink("/proc/self/exe", ec).parent_path() / "unit_paths.txt";
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);)
    if (line.size() > key.size() && line.compare(0, key.size(), key) == 0 && line[key.size()] == '=')
      return line.substr(key.size() + 1);
  throw std::runtime_error("no " + std::string(key) + "= in " + file.string());
}
inline fs::path data_dir() { return unit_path("data"); }
inline fs::path supervise_bin() { return unit_path("supervise"); }

// The whole content of file `p`, read in binary mode ("" if it cannot be opened).
inline std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Writes `data` to file `p` in binary mode, replacing it; throws if the write fails.
inline void write_file(const fs::path& p, std::string_view data) {
  std::ofstream out(p, std::ios::binary);
  out.write(data.data(), std::streamsize(data.size()));
  if (!out) throw std::runtime_error("cannot write " + p.string());
}

// What run_command saw: the status pclose returned and everything the command wrote to stdout.
struct CommandResult {
  int status = -1;
  std::string output;
};

// Runs shell command `cmd` via popen and captures its stdout; throws if popen fails.
inline CommandResult run_command(const std::string& cmd) {
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed");
  CommandResult r;
  std::array<char, 4096> buf{};
  while (const std::size_t n = std::fread(buf.data(), 1, buf.size(), pipe)) r.output.append(buf.data(), n);
  r.status = ::pclose(pipe);
  return r;
}

// Writes `script` to dir/script.py and runs it with KGATE_TEST_PYTHON and the single-quoted `args` (stderr too if asked).
inline CommandResult run_python_script(const fs::path& dir, const std::string& script,
                                       const std::vector<std::string>& args, bool merge_stderr = false) {
  const fs::path file = dir / "script.py";
  write_file(file, script);
  std::string cmd = std::string(KGATE_TEST_PYTHON) + " '" + file.string() + "'";
  for (const auto& a : args) cmd += " '" + a + "'";
  if (merge_stderr) cmd += " 2>&1";
  return run_command(cmd);
}

}  // namespace kgate::test
