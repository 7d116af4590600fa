// The execute and poll_job tools, and what running a cell takes: the job, its outputs, its
// input() (elicitation, MRTR, tasks), and the note on cells the agent did not run.
#include "tool_util.hpp"

namespace kgate::mcp {

// ---------------------------------------------------------------------------------------
// Running cells

json Translator::run_cell(const Target& t, const std::string& code, double timeout, bool host, Call* call,
                          std::string& job, bool& still_running, std::string& refusal,
                          std::vector<CellOutput>* direct, const std::string& job_label, bool background,
                          const json* resume) {
  still_running = false;
  auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  if (background && !t.cur.kgate) {
    refusal = "background tasks need a kgate gateway (its kernel side runs them); this one is a stock server";
    return json();
  }
  if (!t.cur.kgate) {
    // A stock Jupyter server: the cell goes straight over the kernel's websocket.
    if (!channel_.is_open() || channel_.kernel() != t.cur.kernel) {
      std::string err;
      if (!channel_.open(t.cur.ep, t.cur.kernel, agent_, 10s, err)) {
        refusal = err;
        return json();
      }
    }
    json header = make_header("execute_request", agent_);
    std::string msg_id = header["msg_id"].get<std::string>();
    json msg = {{"header", header},
                {"parent_header", json::object()},
                {"metadata", json::object()},
                {"content",
                 {{"code", code}, {"silent", false}, {"store_history", true}, {"user_expressions", json::object()},
                  {"allow_stdin", false}, {"stop_on_error", false}}},
                {"buffers", json::array()}};
    channel_.expect(msg_id);
    if (!channel_.send("shell", msg)) {
      refusal = "the kernel's websocket is closed";
      return json();
    }
    auto got = channel_.wait_for(msg_id, std::chrono::milliseconds(long(timeout * 1000)),
                                 [](const KernelChannel::Collected& c) { return c.idle && c.replied; },
                                 call ? &call->cancelled : nullptr);
    still_running = !got.idle;
    if (call && call->cancelled && still_running)
      t.http->post("api/kernels/" + t.cur.kernel + "/interrupt", json::object());
    if (direct) *direct = got.outputs;
    return json{{"status", still_running ? "running" : got.reply.value("status", "ok")}};
  }
  // input() in an agent's cell: asked of the user through the client (MCP elicitation), when
  // the client can be asked; else the cell's input() raises, and the reply says why. The modern
  // era asks by answering the call input_required (MRTR): the client's retry carries the answer.
  const bool can_ask = call && !host && call->ask_client && call->client_capabilities.contains("elicitation");
  // (A call that may become a task asks through its task instead: ask_client.)
  const bool can_retry =
      !can_ask && call && !host && !background && call->modern && elicits_forms(call->client_capabilities);
  std::string input_notes;
  bool gave_up = false;
  json rec;
  // How the wait went (execute's reply says it): when kgate stopped answering (seconds into the
  // wait, -1: never), and "gone" (not back when the wait ended), "back" (it came back and the
  // job went on: the kernel was re-adopted) or "back_without_job" (it came back without it).
  double gone_at = -1;
  std::string gateway;
  std::string asked;  // the prompt of the last input() asked of the user
  if (resume) {
    // The retry of a call answered input_required: the same cell goes on, with its answer.
    job = (*resume)["job"].get<std::string>();
    if (call) {
      std::lock_guard lk(calls_mu_);
      call_jobs_[call] = job;
    }
    auto p = t.http->get("api/kgate/jobs/" + job + "?digest=1&agent=" + agent_ + "&wait=0", 30s);
    if (p.status != 200) {
      refusal = p.status == 404 ? job + " is no longer recorded (evicted, or its kernel was shut down)."
                                : "cannot read " + job + ": " + p.message();
      return json();
    }
    rec = p.json_body();
    const std::string key = (*resume)["key"].get<std::string>();
    const json* answer = call && call->input_responses.is_object() && call->input_responses.contains(key)
                             ? &call->input_responses[key] : nullptr;
    if (answer && running(rec) && rec.contains("input_request")) {
      if (rec["input_request"].is_object()) asked = rec["input_request"].value("prompt", "");
      std::string note = give_answer(t, job, *answer);
      if (!note.empty()) {
        gave_up = true;
        input_notes = note;
      }
      // Its input_request is gone now: read again, so the loop does not ask it once more.
      p = t.http->get("api/kgate/jobs/" + job + "?digest=1&agent=" + agent_ + "&wait=0", 30s);
      if (p.status == 200) rec = p.json_body();
    }
    // No answer for it: the loop below asks again (MRTR: a missing answer is asked for again).
  } else {
    json body = {{"code", code}, {"agent", agent_}, {"label", job_label.empty() ? label() : job_label},
                 {"wait", std::min(timeout, kSlice)},
                 {"origin", host ? "host" : "mcp"}, {"digest", true},
                 {"allow_stdin", (can_ask || can_retry) && !background}};
    if (can_retry && !can_ask) body["input_timeout"] = kInputRetryTimeout;
    if (background) body["background"] = true;
    auto r = t.http->post("api/kgate/kernels/" + t.cur.kernel + "/execute", body, 30s);
    rec = r.json_body();
    if (r.status != 200) {
      if (r.status == 0) refusal = "the gateway did not answer: " + r.error;
      else refusal = r.message();
      if (r.status == 404) refusal = "kernel " + t.cur.kernel + " is gone (stopped, or the gateway restarted). " +
                                     "connect to create or attach to another.";
      std::string why = rec.is_object() ? rec.value("refusal", "") : "";
      if (why == "dead")
        refusal = "NOTE: the kernel process died (" + rec.value("message", "") + "). restart it, or connect to another.";
      else if (why == "busy" && rec["running_job"].is_string())
        refusal = sentence(refusal) + " Wait for it with poll_job('" + rec["running_job"].get<std::string>() + "').";
      else if (why == "claimed" && rec["holder"].is_object() && rec["holder"].value("connected", true))
        refusal = sentence(refusal) + " Tell the user what you wanted to do and let them decide.";
      return rec;
    }
    job = rec.value("job", "");
    if (call) {
      std::lock_guard lk(calls_mu_);
      call_jobs_[call] = job;
    }
  }
  while (running(rec)) {
    double left = timeout - elapsed();
    if (left <= 0) break;
    if (call && call->cancelled) break;
    if (can_ask && !gave_up && rec.contains("input_request") && rec["input_request"].is_object()) {
      asked = rec["input_request"].value("prompt", "");
      std::string note = answer_input(t, job, rec["input_request"], *call, left);
      // A note means the cell was interrupted: its input_request stays until the interrupt
      // lands, and is not asked again.
      if (!note.empty()) {
        gave_up = true;
        input_notes += (input_notes.empty() ? "" : "\n") + note;
      }
    }
    if (can_retry && !gave_up && rec.contains("input_request") && rec["input_request"].is_object()) {
      if (!rec["input_request"].value("password", false)) {
        // Answered input_required (execute builds it); the retry goes on from here.
        rec["kgate_mcp_input_required"] = rec["input_request"];
        still_running = true;
        return rec;
      }
      gave_up = true;
      input_notes += (input_notes.empty() ? "" : "\n") + stop_for_input(t, job, kSecretNote);
    }
    if (call && call->progress) call->progress(elapsed(), timeout, job + " running");
    // A declined input() keeps its input_request, which answers the wait at once, until the
    // interrupt lands: do not spin on it.
    if (gave_up && rec.contains("input_request")) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto p = t.http->get("api/kgate/jobs/" + job + "?digest=1&agent=" + agent_ + "&wait=" + fmt_seconds(std::min(left, kSlice)), 30s);
    // kgate not answering (a restart, say): the wait goes on within its time, for it to come back.
    while (p.status == 0 && !(call && call->cancelled) && timeout - elapsed() > 0) {
      if (gone_at < 0) gone_at = elapsed();
      std::this_thread::sleep_for(std::chrono::milliseconds(long(std::min(0.25, timeout - elapsed()) * 1000)));
      left = timeout - elapsed();
      if (left <= 0) break;
      p = t.http->get("api/kgate/jobs/" + job + "?digest=1&agent=" + agent_ + "&wait=" + fmt_seconds(std::min(left, kSlice)), 30s);
    }
    if (p.status == 0) {
      gateway = "gone";
      break;
    }
    if (gone_at >= 0 && gateway.empty()) gateway = "back";
    if (p.status == 404 && gateway == "back") {
      gateway = "back_without_job";
      break;
    }
    if (p.status != 200) break;
    rec = p.json_body();
  }
  if (call && call->cancelled && running(rec)) {
    t.http->post("api/kgate/jobs/" + job + "/interrupt", json{{"agent", agent_}});
    spdlog::info("{} interrupted: its call was cancelled", job);
    // A cancelled task's result is kept for tasks/result: it is the cell's end, not "running".
    // (A plain call's reply is not sent at all, so it does not wait.)
    for (auto until = std::chrono::steady_clock::now() + kInterruptWait;
         call->task && running(rec) && std::chrono::steady_clock::now() < until;) {
      auto p = t.http->get("api/kgate/jobs/" + job + "?digest=1&agent=" + agent_ + "&wait=1", 30s);
      if (p.status != 200) break;
      rec = p.json_body();
    }
  }
  still_running = running(rec);
  if (!input_notes.empty() && rec.is_object())
    rec["kgate_mcp_input_note"] =
        (asked.empty() ? std::string() : "The cell asked input(" + json(asked).dump() + ").\n") + input_notes;
  if (rec.is_object()) {
    rec["kgate_mcp_wait"] = {{"waited", elapsed()}};
    if (!gateway.empty()) rec["kgate_mcp_wait"].update({{"gateway", gateway}, {"gone_at", gone_at}});
  }
  return rec;
}

std::string Translator::stop_for_input(const Target& t, const std::string& job, const std::string& why) {
  t.http->post("api/kgate/jobs/" + job + "/interrupt", json{{"agent", agent_}});
  spdlog::info("{}: its input() was not answered, so it was interrupted", job);
  return why;
}

std::string Translator::give_answer(const Target& t, const std::string& job, const json& result) {
  const std::string action = result.is_object() ? result.value("action", "") : "";
  if (action == "accept") {
    const json content = result.value("content", json::object());
    auto v = content.is_object() ? content.find("value") : content.end();
    std::string value = content.is_object() && v != content.end() && v->is_string() ? v->get<std::string>()
                        : content.is_object() && v != content.end() && !v->is_null() ? v->dump()
                                                                                      : "";
    auto r = t.http->post("api/kgate/jobs/" + job + "/input", json{{"value", value}, {"agent", agent_}}, 30s);
    if (r.status == 200) return "";
    return stop_for_input(t, job, "NOTE: the user's answer to input() could not be given to the cell (" + r.message() +
                                      "), so the cell was interrupted.");
  }
  return stop_for_input(t, job, std::string("NOTE: the user ") + (action == "decline" ? "declined" : "cancelled") +
                                    " the cell's input() prompt, so the cell was interrupted.");
}

std::string Translator::answer_input(const Target& t, const std::string& job, const json& request, Call& c,
                                     double left) {
  if (request.value("password", false)) return stop_for_input(t, job, kSecretNote);
  auto resp = c.ask_client("elicitation/create", input_form(request.value("prompt", "")),
                           std::chrono::milliseconds(static_cast<long long>(std::max(1.0, left) * 1000)));
  if (!resp) {
    if (c.cancelled) return stop_for_input(t, job, "");
    return stop_for_input(t, job, "NOTE: the cell's input() got no answer within the call's timeout, so the cell was "
                                  "interrupted.");
  }
  if (resp->contains("error"))
    return stop_for_input(t, job, "NOTE: asking the user for the cell's input() failed (" +
                                      (*resp)["error"].value("message", std::string("an error")) +
                                      "), so the cell was interrupted.");
  return give_answer(t, job, (*resp)["result"]);
}

std::string Translator::foreign_note(const Target& t, std::vector<std::string>& to_ack, const json& rec) {
  if (!t.cur.kgate) return "";
  json d;
  // A finished record from execute or poll carries its kernel's digest (asked with "digest"):
  // no second request when it is the current kernel's.
  const json* embedded = rec.is_object() && rec.contains("digest") ? &rec["digest"] : nullptr;
  if (embedded && embedded->is_object() && embedded->value("kernel", "") == t.cur.kernel) {
    d = *embedded;
  } else {
    auto r = t.http->get("api/kgate/kernels/" + t.cur.kernel + "/digest?agent=" + agent_, 10s);
    if (r.status != 200) return "";
    d = r.json_body();
  }
  if (!d.is_object()) return "";
  std::vector<std::string> parts;
  std::string first;
  for (auto& e : d.value("jobs", json::array())) {
    std::string id = e.value("job", ""), st = e.value("status", "");
    if (first.empty()) first = id;
    parts.push_back(id + " (" + st + ")");
    if (st != "running") to_ack.push_back(id);
  }
  std::size_t evicted = d.value("evicted_unseen", std::size_t{0});
  if (parts.empty() && !evicted) return "";
  std::string list;
  for (std::size_t i = 0; i < parts.size(); ++i) list += (i ? ", " : "") + parts[i];
  std::string n = std::to_string(parts.size() + evicted);
  std::string note = "\n\n[" + n + (parts.size() + evicted == 1 ? " cell was" : " cells were") +
                     " run by the user since your last call";
  if (!list.empty()) note += ": " + list;
  if (evicted) note += (list.empty() ? ": " : "; ") + std::to_string(evicted) + " of them no longer recorded";
  note += ".";
  if (!first.empty()) note += " Read them with poll_job('" + first + "').";
  note += " Variables may have changed.]";
  return note;
}

void Translator::ack(const Target& t, const std::vector<std::string>& ids) {
  if (ids.empty() || !t.cur.kgate) return;
  t.http->post("api/kgate/kernels/" + t.cur.kernel + "/digest/ack", json{{"agent", agent_}, {"jobs", ids}}, 10s);
}

namespace {

// Why a wait on `job` returned while the job still ran, in one or two sentences, with the time
// really waited: its timeout, or kgate gone and not back, or kgate back without the job.
// (For a job that ended after kgate came back: what happened on the way.)
std::string wait_text(const json& rec, const std::string& job, double timeout) {
  const json w = rec.is_object() && rec.contains("kgate_mcp_wait") ? rec["kgate_mcp_wait"] : json::object();
  const double waited = w.value("waited", timeout);
  const std::string gateway = w.value("gateway", "");
  const std::string at = fmt_seconds(w.value("gone_at", 0.0));
  if (gateway == "gone")
    return job + " was running when kgate stopped answering, " + at + " s into the wait (a restart, or kgate "
           "stopped); it had not come back when the wait ended after " + fmt_seconds(waited) +
           " s. The kernel and the job may be there again once kgate is back.";
  if (gateway == "back_without_job")
    return "kgate stopped answering " + at + " s into the wait and came back without " + job +
           "'s record (its kernel may not have been re-adopted); the wait ended after " + fmt_seconds(waited) +
           " s. Check the kernel with server_status.";
  const std::string restart = gateway == "back"
                                  ? "kgate restarted " + at + " s into the wait and re-adopted the kernel; " + job +
                                        " went on. "
                                  : "";
  if (!running(rec)) return restart + "It ended after " + fmt_seconds(waited) + " s of waiting.";
  return restart + job + " is still running after " + fmt_seconds(waited) + " s.";
}

}  // namespace

ToolReply Translator::execute(Call& c) {
  auto code_it = c.arguments.find("code");
  if (code_it == c.arguments.end() || !code_it->is_string()) throw InvalidParams("'code' (a string) is required");
  std::string code = code_it->get<std::string>();
  // As a task nothing waits on the reply: the cell gets the longest timeout unless one is given.
  const bool background = c.arguments.value("background", false);
  double timeout = num_arg(c.arguments, "timeout", c.task ? kMaxTimeout : kDefaultTimeout);
  if (background) timeout = std::min(timeout, kBackgroundWait);
  if (code.find_first_not_of(" \t\r\n") == std::string::npos) return text_reply("(no code: nothing ran)");
  std::string banner;
  std::optional<Target> t;
  std::string error;
  // The retry of a call answered input_required (MRTR): its requestState names the cell that
  // waits, which goes on; nothing runs again.
  std::optional<json> resume;
  json args = c.arguments;
  if (!c.request_state.empty()) {
    std::string why;
    resume = open_state(c.request_state, why);
    if (resume && ((*resume)["tool"] != c.tool || (*resume)["code"] != keyed_digest(code) ||
                   !(*resume)["job"].is_string() || !(*resume)["kernel"].is_string() || !(*resume)["key"].is_string()))
      resume.reset(), why = "it was made for another call (a different tool or code)";
    if (resume && (*resume)["agent"] != agent_) {
      if (!hosting_.stateless) resume.reset(), why = "it was made for another conversation";
      else agent_ = (*resume)["agent"].get<std::string>();  // this translator serves this request alone
    }
    if (!resume)
      return text_reply("Invalid requestState: " + why + ". Nothing ran. Run the cell again if it is still needed.", true);
    args["kernel"] = (*resume)["kernel"];
    // The first call made the kernel, and its answer (input_required) had no text to name it in:
    // this one names it.
    if (auto created = resume->find("created"); created != resume->end() && created->is_string())
      banner = created->get<std::string>();
  }
  if (!resume) {
    std::lock_guard create(create_mu_);  // parallel first calls must not each create a kernel
    bool have;
    {
      std::lock_guard lk(mu_);
      have = current_.has_value();
    }
    // (Stateless, /mcp in the 2026-07-28 era: a kernel is made for this call alone, and named, so
    // that the calls that follow can pass it; kgate culls it once idle, see create_kernel.)
    if (!have && str_arg(c.arguments, "kernel").empty()) {
      Endpoint ep;
      if (!resolve("", ep, error)) return text_reply(error, true);
      bool fatal = false;
      banner = create_kernel(ep, true, error, fatal);
      if (!error.empty()) return text_reply(error, true);
      banner += "\n";
    }
  }
  t = target(args, error);
  if (!t) return text_reply(banner + error, true);  // a kernel this call made is named all the same
  if (!resume && t->cur.setup_pending && !finish_pending_setup(*t, error)) return text_reply(banner + error, true);
  {
    std::lock_guard lk(calls_mu_);
    call_targets_[&c] = *t;
  }
  std::string job, refusal;
  bool still = false;
  std::vector<CellOutput> direct;
  const bool watched = t->cur.kgate && channel_.is_open() && channel_.kernel() == t->cur.kernel;
  json rec = run_cell(*t, code, timeout, false, &c, job, still, refusal, &direct, "", background,
                      resume ? &*resume : nullptr);
  {
    std::lock_guard lk(calls_mu_);
    call_jobs_.erase(&c);
    call_targets_.erase(&c);
  }
  if (c.cancelled && hosting_.stateless && !banner.empty()) {
    // This call made the kernel, and its answer is not sent (the call was cancelled): no reply
    // will ever name it, and a stateless server keeps nothing to find it by. Stopped now, not
    // left for the idle cull.
    t->http->request("DELETE", "api/kernels/" + t->cur.kernel, nullptr, 15s);
    spdlog::info("kernel {}: made by a call that was cancelled before any reply named it; stopped", t->cur.kernel);
    return text_reply(banner + "The call was cancelled; the kernel it made was stopped.", true);
  }
  if (rec.is_object() && rec.contains("kgate_mcp_input_required")) {
    // MRTR: the cell waits in input(); the client asks the user and calls again with the answer.
    const std::string key = "input-" + job + "-" + random_hex(4);
    const auto exp = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch()).count() +
                     static_cast<long long>(kInputRetryTimeout);
    ToolReply r;
    json form = input_form(rec["kgate_mcp_input_required"].value("prompt", ""));
    form["mode"] = "form";
    r.input_requests = json{{key, {{"method", "elicitation/create"}, {"params", std::move(form)}}}};
    json state = {{"tool", c.tool}, {"code", keyed_digest(code)}, {"job", job}, {"kernel", t->cur.kernel},
                  {"agent", agent_}, {"key", key}, {"exp", exp}};
    if (!banner.empty()) state["created"] = banner;  // named by the retry's answer
    r.request_state = seal_state(state);
    return r;
  }
  std::vector<std::string> to_ack;
  if (!refusal.empty()) {
    std::string note = foreign_note(*t, to_ack);
    // A busy refusal already names the running job: the note would repeat it.
    ack(*t, to_ack);
    return text_reply(banner + refusal + note, true);
  }
  json content = json::array();
  // Every output in order, from the kernel's websocket (records keep no display_data).
  std::vector<CellOutput> outs = !t->cur.kgate ? direct : job_outputs(channel_, rec, watched);
  // An input() the user declined interrupted the cell: the note says so in two lines, and the
  // KeyboardInterrupt's traceback (ipykernel's own frames, ~1,200 characters) is left out.
  if (rec.is_object() && rec.contains("kgate_mcp_input_note"))
    outs.erase(std::remove_if(outs.begin(), outs.end(),
                              [](const CellOutput& o) {
                                return o.kind == CellOutput::Kind::error && o.ename == "KeyboardInterrupt";
                              }),
               outs.end());
  if (!t->cur.kgate && still) job = "the cell";
  if (still && background) {
    std::string partial = render_text(outs);
    content.push_back(text_block(banner + job + " runs in the background (a task on a worker thread of the kernel). "
                                 "execute is refused until it ends; poll_job('" + job + "') follows it, and "
                                 "interrupt(job='" + job + "') stops it.\nOutput so far:\n" +
                                 (partial.empty() ? "(none yet)" : partial)));
  } else if (still) {
    std::string partial = render_text(outs);
    content.push_back(text_block(banner + wait_text(rec, job, timeout) + " Poll it with poll_job('" + job +
                                 "') (it waits for the end), or stop it with interrupt. Do not run it again.\n"
                                 "Partial output:\n" + (partial.empty() ? "(none yet)" : partial)));
  } else {
    content = render_content(outs);
    if (content.empty() || content_text(content).empty()) append_text(content, "(no output)");
    if (!banner.empty()) content.insert(content.begin(), text_block(banner));
  }
  if (!still && rec.is_object() && rec.contains("kgate_mcp_wait") && rec["kgate_mcp_wait"].value("gateway", "") == "back")
    append_text(content, "\n" + wait_text(rec, job, timeout));
  if (rec.is_object() && rec.contains("kgate_mcp_input_note"))
    append_text(content, "\n" + rec["kgate_mcp_input_note"].get<std::string>());
  else if (rec.is_object() && rec["error"].is_object() && rec["error"].value("ename", "") == "StdinNotImplementedError")
    append_text(content, std::string("\nNOTE: input() needs a client that can ask the user (MCP elicitation); ") +
                             (c.ask_client || c.modern ? "this one did not declare it." : "this connection cannot carry the question.") +
                             " Pass the value in the code instead.");
  std::string note = foreign_note(*t, to_ack, rec);
  // Our own running job is never in the digest; repeats of a user's running cell are fine.
  append_text(content, note);
  ack(*t, to_ack);
  ToolReply r;
  r.content = content;
  r.is_error = !still && failed(rec);  // the cell raised (or never ran to its end)
  return r;
}


namespace {

// Someone else's cell as poll_job shows it: "Code:" and its lines indented by 4, at most
// kCodeLines lines and kCodeBytes bytes (what is left out is counted).
constexpr std::size_t kCodeLines = 40, kCodeBytes = 4000;
std::string quoted_code(const std::string& code) {
  if (code.empty()) return "";
  std::string out = "Code:\n";
  std::size_t lines = 0, i = 0;
  while (i < code.size() && lines < kCodeLines && out.size() < kCodeBytes) {
    auto nl = code.find('\n', i);
    if (nl == std::string::npos) nl = code.size();
    out += "    " + code.substr(i, std::min(nl - i, kCodeBytes)) + "\n";
    ++lines;
    i = nl + 1;
  }
  if (i < code.size()) {
    std::size_t rest = code.back() == '\n' ? 0 : 1;
    for (std::size_t k = i; k < code.size(); ++k) rest += code[k] == '\n';
    out += "    … (" + std::to_string(rest) + " more line" + (rest == 1 ? "" : "s") + " not shown)\n";
  }
  return out + "Output:\n";
}

}  // namespace

ToolReply Translator::poll_job(Call& c) {
  std::string job = str_arg(c.arguments, "job");
  if (job.empty()) throw InvalidParams("'job' (job-N) is required");
  double wait = num_arg(c.arguments, "wait", kDefaultPollWait);
  std::optional<Current> cur = current();
  Endpoint ep;
  std::string error;
  if (!endpoint_for("", cur, ep, error)) return text_reply(error, true);
  auto http = client(ep);
  auto start = std::chrono::steady_clock::now();
  json rec;
  double gone_at = -1;  // seconds into the wait when kgate stopped answering, -1: never
  while (true) {
    double left = wait - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    auto r = http->get("api/kgate/jobs/" + job + "?digest=1&agent=" + agent_ + "&wait=" + fmt_seconds(std::max(0.0, std::min(left, kSlice))), 30s);
    if (r.status == 0 && left > 0.25 && !c.cancelled) {  // kgate not answering (a restart): wait for it
      if (gone_at < 0) gone_at = wait - left;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      continue;
    }
    if (r.status == 0 && gone_at >= 0)
      return text_reply("kgate stopped answering " + fmt_seconds(gone_at) + " s into the wait for " + job +
                            " (a restart, or kgate stopped) and had not come back after " +
                            fmt_seconds(wait - std::max(0.0, left)) + " s. poll_job('" + job +
                            "') again once it is back: a re-adopted kernel keeps its jobs.",
                        true);
    if (r.status == 404) return text_reply("No such job '" + job + "'.", true);
    if (r.status != 200) return text_reply("cannot read " + job + " from " + ep.url + ": " + r.message(), true);
    rec = r.json_body();
    if (!running(rec) || left <= kSlice || c.cancelled) break;
    if (c.progress) c.progress(wait - left, wait, job + " running");
  }
  // From the kernel's websocket when it saw the whole job (then with display_data and images),
  // else from the record.
  const bool ended = !running(rec);
  std::vector<CellOutput> outs = job_outputs(channel_, rec, false);
  json content = ended ? render_content(outs) : json::array();
  std::string head = job + ": " + status_of(rec) + " (" + fmt_seconds(rec.value("elapsed", 0.0)) + " s)" +
                     (rec.value("origin", "") == "user" ? ", run by the user" : "") +
                     (gone_at >= 0 ? " [kgate restarted " + fmt_seconds(gone_at) + " s into this wait; the kernel "
                                     "was re-adopted]" : "");
  std::string text = head + "\n";
  // A cell the agent did not send: its code too, which the agent has no other way to read.
  if (rec.value("origin", "") == "user") text += quoted_code(rec.value("code", ""));
  if (!ended) {
    std::string body = render_text(outs);
    text += "Partial output:\n" + (body.empty() ? std::string("(no output)") : body);
  } else if (content_text(content).empty()) {
    text += "(no output)";
  }
  if (!content.empty() && content.front().value("type", "") == "text")
    content.front()["text"] = text + content.front().value("text", "");
  else
    content.insert(content.begin(), text_block(text));
  if (cur) {
    Target t{*cur, http};
    std::vector<std::string> to_ack;
    append_text(content, foreign_note(t, to_ack, rec));
    ack(t, to_ack);
  }
  ToolReply r;
  r.content = content;
  return r;
}

}  // namespace kgate::mcp
