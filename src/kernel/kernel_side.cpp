// The kernel side's install request and report (kernel_side.hpp).
#include "kgate/kernel/kernel_side.hpp"

#include <algorithm>

#include "kgate_kernel_side_py.hpp"

namespace kgate {

namespace {
constexpr std::string_view kModule = "kgate_kernel_side";
constexpr std::string_view kReport = "__import__('sys').modules['kgate_kernel_side'].report()";
}  // namespace

bool is_host_session(std::string_view session, std::string_view host) {
  if (host.empty() || session.size() < host.size() || session.compare(0, host.size(), host) != 0) return false;
  return session.size() == host.size() || session[host.size()] == '.';
}

json kernel_side_install_request(const std::string& host) {
  // The module is made once per process, in sys.modules, and nothing is left in the user's
  // namespace: the loader runs in a dict of its own. JSON strings are Python string literals.
  // The same for every kernel but the host: made once.
  static const std::string load = [] {
    const std::string loader = "import sys, types\nm = types.ModuleType('" + std::string(kModule) +
                               "')\nexec(compile(" + json(std::string(kKernelSidePy)).dump() + ", '" +
                               std::string(kModule) + ".py', 'exec'), m.__dict__)\nsys.modules['" +
                               std::string(kModule) + "'] = m\n";
    return "__import__('sys').modules.get('" + std::string(kModule) + "') or exec(" + json(loader).dump() + ", {})\n";
  }();
  const std::string code = load + "__import__('sys').modules['" + std::string(kModule) + "'].install(" +
                           json(host).dump() + ")\n";
  return {{"code", code},
          {"silent", true},
          {"store_history", false},
          {"user_expressions", {{"kgate", std::string(kReport)}}},
          {"allow_stdin", false},
          {"stop_on_error", false}};
}

json kernel_side_off(const std::string& reason) {
  json features = json::object();
  for (auto f : kKernelSideFeatures) features[std::string(f)] = reason;
  return {{"installed", false}, {"reason", reason}, {"features", features}};
}

std::string kernel_side_task_code(const std::string& code) {
  return "__import__('sys').modules['" + std::string(kModule) + "'].start_task(" + json(code).dump() + ")";
}

bool kernel_side_has(const json& state, std::string_view feature) {
  if (!state.is_object()) return false;
  const auto f = state.find("features");
  if (f == state.end() || !f->is_object()) return false;
  const auto v = f->find(std::string(feature));
  return v != f->end() && *v == true;
}

json kernel_side_from_reply(const json& content) {
  if (!content.is_object()) return kernel_side_off("the install's reply could not be read");
  if (content.value("status", "") != "ok")
    return kernel_side_off("installing it failed: " + content.value("ename", std::string("error")) + ": " +
                           content.value("evalue", std::string()));
  const json* text = nullptr;
  if (auto ue = content.find("user_expressions"); ue != content.end() && ue->is_object())
    if (auto k = ue->find("kgate"); k != ue->end() && k->is_object() && k->value("status", "") == "ok")
      if (auto d = k->find("data"); d != k->end() && d->is_object())
        if (auto t = d->find("text/plain"); t != d->end() && t->is_string()) text = &*t;
  json rep = text ? json::parse(text->get<std::string>(), nullptr, false) : json();
  if (!rep.is_object()) return kernel_side_off("its report could not be read");
  json features = json::object();
  const json on = rep.value("features", json::array());
  const json off = rep.value("off", json::object());
  for (auto f : kKernelSideFeatures) {
    const std::string name(f);
    bool is_on = on.is_array() && std::find(on.begin(), on.end(), name) != on.end();
    features[name] = is_on ? json(true)
                           : json(off.is_object() && off.contains(name) && off[name].is_string()
                                      ? off[name].get<std::string>()
                                      : std::string("not offered by this version of the kernel side"));
  }
  json out = {{"installed", true}, {"version", rep.value("version", 0)}, {"features", features}};
  // Version 3 on: ipykernel's IOPub pipe moved to ipc (true), or why not (a kernel on tcp, ...).
  if (off.is_object() && off.contains("ipc_pipe") && off["ipc_pipe"].is_string()) out["ipc_pipe"] = off["ipc_pipe"];
  else if (on.is_array() && std::find(on.begin(), on.end(), "ipc_pipe") != on.end()) out["ipc_pipe"] = true;
  // Version 2 on: the task that runs, or null (an older kernel side, kept by a re-adopted kernel,
  // does not say, so nothing is concluded from it).
  if (rep.contains("task")) out["running_task"] = rep["task"].is_string() ? rep["task"] : json(nullptr);
  return out;
}

}  // namespace kgate
