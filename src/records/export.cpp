// Records as the API shows them (job_json) and as a notebook (notebook_json).
#include "jobs_impl.hpp"
#include "kgate/kernel/kernel_side.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <memory>
#include <optional>
#include <sstream>

#include <simdjson.h>
#include <spdlog/spdlog.h>

#include "kgate/jupyter/connection.hpp"
#include "kgate/jupyter/utf8.hpp"

namespace kgate {

// ---------------------------------------------------------------------------------------
// Rendering

json job_json(const Job& j, bool full, std::chrono::steady_clock::time_point now) {
  auto opt = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  json o = {{"job", j.id()},
            {"kernel", j.kernel},
            {"request", opt(j.request)},
            {"origin", origin_name(j.origin)},
            {"agent", opt(j.agent)},
            {"label", opt(j.label)},
            {"status", status_name(j.status)},
            {"began", j.began},
            {"created", j.created},
            {"began_at", opt(j.began_at)},
            {"ended_at", opt(j.ended_at)},
            {"elapsed", std::round(j.elapsed(now) * 1000.0) / 1000.0},
            {"execution_count", j.execution_count ? json(*j.execution_count) : json(nullptr)},
            {"code", j.code},
            {"code_cut", j.code_cut},
            {"note", j.note},
            {"task", j.task},
            {"seen_by_agent", j.seen_by_agent}};
  if (j.input) o["input_request"] = {{"prompt", j.input->prompt}, {"password", j.input->password}};
  if (full) {
    o["output"] = std::string(j.output.text());
    o["output_cut"] = j.output.cut();
    o["result"] = std::string(j.result.text());
    o["result_cut"] = j.result.cut();
    if (j.ename.empty())
      o["error"] = nullptr;
    else
      o["error"] = {{"ename", j.ename}, {"evalue", j.evalue}, {"traceback", j.traceback}};
  } else {
    o["ename"] = opt(j.ename);
  }
  return o;
}

json notebook_json(const std::vector<Job>& jobs, const std::vector<RestartMark>& marks,
                   const KernelSpec* spec, const std::function<std::optional<json>(const Job&)>& outputs_of) {
  auto lines = [](const std::string& text) {
    json arr = json::array();
    std::size_t i = 0;
    while (i < text.size()) {
      auto nl = text.find('\n', i);
      std::size_t end = nl == std::string::npos ? text.size() : nl + 1;
      arr.push_back(text.substr(i, end - i));
      i = end;
    }
    return arr;
  };
  json cells = json::array();
  auto now = std::chrono::steady_clock::now();
  std::size_t mark = 0;
  auto restart_cell = [&](const RestartMark& r) {
    cells.push_back({{"cell_type", "markdown"},
                     {"id", "restart-after-job-" + std::to_string(r.after_job) + "-" + std::to_string(mark)},
                     {"metadata", json::object()},
                     {"source", lines("**Kernel restarted** at " + r.at + " (" + r.reason +
                                      "). The cells above ran in a namespace that is gone; the cells "
                                      "below do not see their variables.")}});
  };
  for (const Job& j : jobs) {
    while (mark < marks.size() && marks[mark].after_job < j.n) restart_cell(marks[mark++]);
    std::ostringstream head;
    head << "# [" << j.id() << " · " << origin_name(j.origin) << " · " << status_name(j.status) << " · "
         << std::fixed << std::setprecision(2) << j.elapsed(now) << " s · " << j.created << "]\n";
    json outputs = json::array();
    if (std::optional<json> kept = outputs_of ? outputs_of(j) : std::nullopt) {
      // Every output as it came (nbformat's multiline strings as lists of lines, as Jupyter writes them).
      for (json& o : *kept) {
        if (o.contains("text") && o["text"].is_string()) o["text"] = lines(o["text"].get<std::string>());
        if (auto d = o.find("data"); d != o.end() && d->is_object())
          for (auto& [mime, v] : d->items())
            if (v.is_string() && (mime.rfind("text/", 0) == 0 || mime == "image/svg+xml")) v = lines(v.get<std::string>());
        outputs.push_back(std::move(o));
      }
    } else {
      // A record whose outputs were not kept (read back from disk): its text, result and error.
      if (!j.output.text().empty() || j.output.cut()) {
        std::string text(j.output.text());
        if (j.output.cut()) text = "[" + std::to_string(j.output.cut()) + " earlier bytes cut]\n" + text;
        outputs.push_back({{"output_type", "stream"}, {"name", "stdout"}, {"text", lines(text)}});
      }
      if (!j.result.text().empty())
        outputs.push_back({{"output_type", "execute_result"},
                           {"execution_count", j.execution_count ? json(*j.execution_count) : json(nullptr)},
                           {"data", {{"text/plain", lines(std::string(j.result.text()))}}},
                           {"metadata", json::object()}});
      if (!j.ename.empty())
        outputs.push_back({{"output_type", "error"}, {"ename", j.ename}, {"evalue", j.evalue}, {"traceback", j.traceback}});
      if (!j.note.empty())
        outputs.push_back({{"output_type", "stream"}, {"name", "stderr"}, {"text", lines(j.note + "\n")}});
    }
    cells.push_back({{"cell_type", "code"},
                     {"id", j.id()},
                     {"execution_count", j.execution_count ? json(*j.execution_count) : json(nullptr)},
                     {"metadata",
                      {{"kgate",
                        {{"job", j.id()}, {"origin", origin_name(j.origin)}, {"status", status_name(j.status)},
                         {"elapsed", std::round(j.elapsed(now) * 1000.0) / 1000.0}, {"created", j.created}}}}},
                     {"source", lines(head.str() + j.code)},
                     {"outputs", outputs}});
  }
  while (mark < marks.size()) restart_cell(marks[mark++]);
  json meta = json::object();
  if (spec) {
    meta["kernelspec"] = {{"name", spec->name}, {"display_name", spec->display_name},
                          {"language", spec->language}};
    meta["language_info"] = {{"name", spec->language}};
  }
  return {{"nbformat", 4}, {"nbformat_minor", 5}, {"metadata", meta}, {"cells", cells}};
}

}  // namespace kgate
