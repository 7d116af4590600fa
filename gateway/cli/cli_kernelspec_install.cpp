// `kgate install-kernelspec` (see cli_kernelspec_install.hpp).
#include "cli/cli_kernelspec_install.hpp"

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <ostream>
#include <sstream>

#include "kgate/jupyter/connection.hpp"

namespace kgate::gw {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// jupyter_client's rule for kernelspec names (KernelSpecManager: _kernel_name_pat).
bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 128) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) return false;
  return true;
}

fs::path running_kgate() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw std::runtime_error("cannot find this kgate binary's path (/proc/self/exe: " + ec.message() + ")");
  std::string s = p.string();
  constexpr std::string_view deleted = " (deleted)";  // replaced while running
  if (s.size() > deleted.size() && s.compare(s.size() - deleted.size(), deleted.size(), deleted) == 0)
    s.resize(s.size() - deleted.size());
  return s;
}

}  // namespace

json proxy_kernel_json(const fs::path& binary, const KernelspecInstallOptions& opts) {
  json argv = {binary.string(), "proxy-kernel", "-f", "{connection_file}"};
  if (!opts.kernel.empty()) {
    argv.push_back("--kernel");
    argv.push_back(opts.kernel);
  }
  if (!opts.url.empty()) {
    argv.push_back("--url");
    argv.push_back(opts.url);
  }
  // metadata.kgate.proxy_kernel marks it for kgate's own discovery, which never launches it
  // (a kgate kernel proxying to kgate would loop).
  return {{"argv", argv},
          {"display_name", opts.display_name},
          {"language", "python"},
          {"interrupt_mode", "message"},
          {"metadata", {{"kgate", {{"proxy_kernel", true}}}}}};
}

int install_kernelspec(const KernelspecInstallOptions& opts, std::ostream& out, std::ostream& err) {
  if (!valid_name(opts.name)) {
    err << "kgate install-kernelspec: '" << opts.name
        << "' is not a kernelspec name (letters, digits, '.', '_' and '-' only)\n";
    return 2;
  }
  std::string name = opts.name;
  for (auto& c : name) c = char(std::tolower(static_cast<unsigned char>(c)));  // Jupyter lowercases them
  fs::path kernels;
  switch (opts.where) {
    case KernelspecInstallOptions::Where::user: kernels = jupyter_data_dir() / "kernels"; break;
    case KernelspecInstallOptions::Where::prefix: kernels = opts.prefix / "share" / "jupyter" / "kernels"; break;
    case KernelspecInstallOptions::Where::sys_prefix: {
      const char* env = std::getenv("VIRTUAL_ENV");
      if (!env || !*env) env = std::getenv("CONDA_PREFIX");
      if (!env || !*env) {
        err << "kgate install-kernelspec: --sys-prefix needs an active environment ($VIRTUAL_ENV or "
               "$CONDA_PREFIX); use --prefix PATH to name one\n";
        return 2;
      }
      kernels = fs::path(env) / "share" / "jupyter" / "kernels";
      break;
    }
  }
  fs::path dir = fs::absolute(kernels / name);
  json spec;
  try {
    spec = proxy_kernel_json(running_kgate(), opts);
  } catch (const std::exception& e) {
    err << "kgate install-kernelspec: " << e.what() << "\n";
    return 1;
  }
  fs::path file = dir / "kernel.json";
  std::error_code ec;
  if (fs::exists(file, ec)) {
    std::ifstream in(file);
    std::stringstream ss;
    ss << in.rdbuf();
    json old = json::parse(ss.str(), nullptr, false);
    if (old == spec) {
      out << "kernelspec '" << name << "' is already installed in " << dir.string() << "\n";
      return 0;
    }
    if (!opts.force) {
      err << "kgate install-kernelspec: a different kernelspec '" << name << "' is in " << dir.string()
          << (old.is_object() && old.contains("argv") ? " (argv " + old["argv"].dump() + ")" : std::string())
          << ": --force replaces it, --name installs this one under another name\n";
      return 1;
    }
  }
  fs::create_directories(dir, ec);
  if (ec) {
    err << "kgate install-kernelspec: cannot create " << dir.string() << ": " << ec.message() << "\n";
    return 1;
  }
  // Written to a temp file and renamed, so a reader never sees half a kernel.json.
  fs::path tmp = dir / (".kernel.json." + std::to_string(::getpid()));
  {
    std::ofstream o(tmp, std::ios::trunc);
    o << spec.dump(1) << "\n";
    o.close();
    if (!o) {
      err << "kgate install-kernelspec: cannot write " << tmp.string() << "\n";
      fs::remove(tmp, ec);
      return 1;
    }
  }
  fs::rename(tmp, file, ec);
  if (ec) {
    err << "kgate install-kernelspec: cannot write " << file.string() << ": " << ec.message() << "\n";
    fs::remove(tmp, ec);
    return 1;
  }
  out << "installed kernelspec '" << name << "' (" << opts.display_name << ") in " << dir.string() << "\n"
      << "It runs " << spec["argv"][0].get<std::string>()
      << " proxy-kernel: pick it in JupyterLab or Notebook, or `jupyter console --kernel " << name << "`.\n";
  return 0;
}

}  // namespace kgate::gw
