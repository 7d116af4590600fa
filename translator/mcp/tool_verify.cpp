// The verify tool: cells run in a fresh scratch kernel, Restart & Run All without touching the
// working one.
#include "tool_util.hpp"

namespace kgate::mcp {

namespace {

// The first kVerifyLines lines of `text` (each cut at kVerifyLineBytes), indented, and how many
// more there were.
std::string first_lines(const std::string& text) {
  std::string out;
  std::size_t shown = 0, i = 0, total = 0;
  while (i < text.size()) {
    auto nl = text.find('\n', i);
    if (nl == std::string::npos) nl = text.size();
    ++total;
    if (shown < kVerifyLines) {
      std::string line = text.substr(i, std::min(nl - i, kVerifyLineBytes));
      out += "      " + line + (nl - i > kVerifyLineBytes ? " …" : "") + "\n";
      ++shown;
    }
    i = nl + 1;
  }
  if (total > shown) out += "      … (" + std::to_string(total - shown) + " more lines)\n";
  return out;
}

}  // namespace

// verify: "Restart & Run All" in a scratch kernel, so the working kernel is never touched.
ToolReply Translator::verify(Call& c) {
  std::vector<std::string> cells;
  for (const auto& v : c.arguments.at("cells")) cells.push_back(v.get<std::string>());
  const bool keep_going = c.arguments.value("keep_going", false);
  const double timeout = num_arg(c.arguments, "timeout", kDefaultVerifyTimeout);
  std::string spec = str_arg(c.arguments, "kernelspec");
  std::optional<Current> cur = current();
  Endpoint ep;
  std::string error;
  if (!endpoint_for("", cur, ep, error)) return text_reply(error, true);
  auto http = client(ep);
  auto api = http->get("api", 10s);
  if (api.status != 200) return text_reply("cannot reach the gateway at " + ep.url + ": " + api.message(), true);
  const json apij = api.json_body();
  if (!(apij.is_object() && apij.contains("extensions") && apij["extensions"].contains("kgate")))
    return text_reply("verify needs a kgate gateway (it records each cell); " + ep.url + " is not one.", true);
  if (spec.empty() && cur && cur->ep.url == ep.url) {
    auto k = http->get("api/kernels/" + cur->kernel, 10s);
    if (k.status == 200) spec = k.json_body().value("name", "");
  }
  // Where this conversation's kernel is, as its auto kernel would be: its launcher (Slurm,
  // SSH) if it has one, else this machine with this conversation's environment and directory.
  const std::string launcher = cur && cur->ep.url == ep.url ? cur->launcher : "";
  json body = new_kernel_body(ep, launcher);
  if (!spec.empty()) body["name"] = spec;
  auto r = http->post("api/kernels", body, kCreateTimeout);
  const bool queued = r.status == 202;  // a launcher's job, still in its queue
  const std::string id = r.status == 201 || r.status == 200 || queued ? r.json_body().value("id", "") : "";
  if (id.empty())
    return text_reply("could not start a scratch kernel" + (spec.empty() ? "" : " (" + spec + ")") +
                          (launcher.empty() ? "" : " on launcher " + launcher) + " at " + ep.url + ": " + r.message(),
                      true);
  struct StopScratch {  // the scratch kernel never outlives the call, whatever happens
    std::shared_ptr<HttpClient> http;
    std::string id;
    ~StopScratch() { http->request("DELETE", "api/kernels/" + id, nullptr, 15s); }
  } stop_scratch{http, id};
  if (queued) {
    // Its job waits in the launcher's queue: wait for it as long as a cell may run, no longer.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
    json kj = r.json_body();
    while (kj.value("execution_state", "") == "starting") {
      if (c.cancelled) return text_reply("verify cancelled while its scratch kernel was queued as " + queue_text(kj), true);
      if (std::chrono::steady_clock::now() >= give_up)
        return text_reply("the scratch kernel was still queued as " + queue_text(kj) + " after " + fmt_seconds(timeout) +
                              " s, so nothing ran; it was cancelled. Try again when the queue is shorter, or with a larger timeout.",
                          true);
      std::this_thread::sleep_for(500ms);
      auto g = http->get("api/kernels/" + id, 10s);
      if (g.status != 200) return text_reply("the queued scratch kernel " + id + " is gone: " + g.message(), true);
      kj = g.json_body();
    }
    if (kj.value("execution_state", "") == "dead")
      return text_reply("the scratch kernel died before it ran: " + kj.value("reason", std::string("no reason given")), true);
  }
  const std::string vid = new_hex_id().substr(0, 8);
  spdlog::info("verify {}: {} cells in scratch kernel {}{}", vid, cells.size(), id,
               launcher.empty() ? "" : " on launcher " + launcher);
  Target t{Current{ep, id, false, true, true, launcher, false}, http};

  std::string head = "verify " + vid + ": a fresh " + (spec.empty() ? std::string("default") : spec) + " kernel (" +
                     id.substr(0, 8) + (launcher.empty() ? "" : ", on launcher " + launcher) +
                     ", stopped afterwards; your kernel was not touched)";
  std::string setup_out, setup_err;
  if (!run_setup(t, setup_out, setup_err))
    return text_reply(head + "\nits setup failed, so no cell ran:\n" + setup_err, true);
  std::string report;
  std::size_t passed = 0, ran = 0;
  std::string first_failure;
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const std::string n = std::to_string(i + 1) + "/" + std::to_string(cells.size());
    if (c.cancelled) break;
    std::string job, refusal;
    bool still = false;
    json rec = run_cell(t, cells[i], timeout, false, &c, job, still, refusal, nullptr,
                        label() + " · verify " + vid + " cell " + n);
    {
      std::lock_guard lk(calls_mu_);
      call_jobs_.erase(&c);
    }
    ++ran;
    std::string status = !refusal.empty() ? "refused" : still ? "timeout" : status_of(rec);
    if (still) {
      t.http->post("api/kgate/jobs/" + job + "/interrupt", json{{"agent", agent_}});
      status = "timeout";
    }
    const bool ok = status == "ok";
    passed += ok;
    report += "  cell " + n + " [" + status + (rec.is_object() && rec.contains("elapsed") ? ", " + fmt_seconds(rec.value("elapsed", 0.0)) + " s" : "") +
              "]" + (job.empty() ? "" : " " + job) + "\n";
    if (!refusal.empty()) report += "      " + refusal + "\n";
    if (rec.is_object()) {
      std::string text = rec.value("output", "");
      if (rec.contains("result") && rec["result"].is_string()) text += (text.empty() || text.back() == '\n' ? "" : "\n") + rec["result"].get<std::string>();
      report += first_lines(text);
      if (rec["error"].is_object())
        report += "      " + rec["error"].value("ename", std::string("error")) + ": " + rec["error"].value("evalue", "") + "\n";
    }
    if (still) report += "      still running after " + fmt_seconds(timeout) + " s: interrupted\n";
    if (!ok && first_failure.empty()) first_failure = "cell " + n + " " + (status == "error" && rec["error"].is_object()
                                                                              ? "raised " + rec["error"].value("ename", std::string("an error"))
                                                                              : status);
    if (!ok && (!keep_going || !refusal.empty())) break;
  }
  const std::size_t not_run = cells.size() - ran;
  std::string verdict = first_failure.empty() && !c.cancelled
                            ? "all " + std::to_string(cells.size()) + " cells passed"
                            : (c.cancelled ? std::string("cancelled") : "FAILED: " + first_failure) + " (" +
                                  std::to_string(passed) + " of " + std::to_string(cells.size()) + " passed" +
                                  (not_run ? ", " + std::to_string(not_run) + " not run" : "") + ")";
  ToolReply out = text_reply(head + "\n" + verdict + "\n" + report);
  out.is_error = !first_failure.empty();
  return out;
}

}  // namespace kgate::mcp
