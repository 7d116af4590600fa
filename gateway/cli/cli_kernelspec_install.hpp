// `kgate install-kernelspec`: writes the kernelspec that runs `kgate proxy-kernel`, so a notebook
// (JupyterLab, Notebook, any jupyter_client) can attach to a kgate kernel.
#pragma once

#include <filesystem>
#include <iosfwd>
#include <string>

#include <nlohmann/json.hpp>

namespace kgate::gw {

struct KernelspecInstallOptions {
  enum class Where { user, sys_prefix, prefix } where = Where::user;
  std::filesystem::path prefix;  // Where::prefix: PREFIX/share/jupyter/kernels/NAME
  std::string name = "kgate";
  std::string display_name = "kgate (attach to the agent's kernel)";
  std::string kernel;  // pinned kgate kernel id (proxy-kernel --kernel)
  std::string url;     // pinned gateway (proxy-kernel --url)
  bool force = false;  // replace a different spec of the same name
};

// The kernel.json for `binary` (the absolute path of a kgate binary).
nlohmann::json proxy_kernel_json(const std::filesystem::path& binary, const KernelspecInstallOptions& opts);

// Writes NAME/kernel.json; prints where on `out`, errors on `err`.  Returns the exit status:
// 0 written (or the same spec already there), 1 a different spec is there (without --force) or
// the write failed, 2 a bad name or no environment for --sys-prefix.
int install_kernelspec(const KernelspecInstallOptions& opts, std::ostream& out, std::ostream& err);

}  // namespace kgate::gw
