// The tools' shared helpers (tool_util.hpp).
#include "tool_util.hpp"

namespace kgate::mcp::tool_util {

// The requestState of an execute answered input_required: what the retry resumes (its job, its
// kernel, the agent, the code's digest, the input request's key, an expiry), in JSON, signed
// with a key of this process's, so a client can neither forge nor alter it.
const std::string& state_key() {
  static const std::string key = random_hex(32);
  return key;
}
std::string keyed_digest(const std::string& text) { return Signer(state_key()).sign(text, "", "", ""); }
std::string seal_state(const json& payload) {
  const std::string text = payload.dump();
  return base64_encode(text) + "." + keyed_digest(text);
}
std::optional<json> open_state(const std::string& state, std::string& why) {
  const auto dot = state.rfind('.');
  std::optional<std::string> text;
  if (dot != std::string::npos) text = base64_decode(std::string_view(state).substr(0, dot));
  if (!text || !Signer(state_key()).verify(std::string_view(state).substr(dot + 1), *text, "", "", "")) {
    why = "it was not made by this server (or this server restarted since)";
    return std::nullopt;
  }
  json p = json::parse(*text, nullptr, false);
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
  if (!p.is_object() || !p["exp"].is_number_integer() || p["exp"].get<long long>() < now) {
    why = "it expired (a cell waits " + std::to_string(static_cast<int>(kInputRetryTimeout)) + " s for its input)";
    return std::nullopt;
  }
  return p;
}
// Whether the client can show a form: elicitation declared, with form mode (an empty object
// means form).
bool elicits_forms(const json& caps) {
  auto e = caps.find("elicitation");
  return e != caps.end() && e->is_object() && (e->empty() || e->contains("form"));
}
// The form that asks for a cell's input(): an elicitation/create's params.
json input_form(const std::string& prompt) {
  const std::string title = prompt.empty() ? std::string("input") : prompt.substr(0, 200);
  return {{"message", "The running cell asks for input" + (prompt.empty() ? std::string(".") : ": " + prompt)},
          {"requestedSchema",
           {{"type", "object"},
            {"properties", {{"value", {{"type", "string"}, {"title", title},
                                       {"description", "What input() returns to the cell"}}}}},
            {"required", json::array({"value"})}}}};
}

json text_block(const std::string& s) { return {{"type", "text"}, {"text", s}}; }
ToolReply text_reply(const std::string& s, bool is_error) {
  ToolReply r;
  r.content = json::array({text_block(s)});
  r.is_error = is_error;
  return r;
}

std::string short_id(const std::string& id) { return id.substr(0, 8); }

std::string str_arg(const json& args, const char* key, const std::string& fallback) {
  auto it = args.find(key);
  if (it == args.end() || it->is_null()) return fallback;
  if (!it->is_string()) throw InvalidParams(std::string("'") + key + "' must be a string");
  return it->get<std::string>();
}

// Types and bounds were checked against the tool's inputSchema before the call (check_arguments).
double num_arg(const json& args, const char* key, double fallback) {
  auto it = args.find(key);
  if (it == args.end() || !it->is_number()) return fallback;
  return it->get<double>();
}

std::string status_of(const json& job) { return job.value("status", ""); }
bool running(const json& job) { return status_of(job) == "running"; }
// The cell did not complete: it raised (an error, KeyboardInterrupt), or it never ran to its end.
bool failed(const json& job) {
  static const std::set<std::string> kFailed = {"error", "interrupted", "aborted", "kernel_lost", "culled"};
  return job.is_object() && kFailed.count(status_of(job)) > 0;
}

// A message from the gateway as a sentence of its own, so that a hint can follow it.
std::string sentence(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n')) s.pop_back();
  if (!s.empty() && std::string_view(".!?:)]").find(s.back()) == std::string_view::npos) s += '.';
  return s;
}

std::string fmt_seconds(double s) {
  std::ostringstream ss;
  ss.precision(s < 10 ? 2 : 1);
  ss << std::fixed << s;
  return ss.str();
}

// Substitutes the embedded Python templates' placeholders with JSON string literals (a JSON
// string is a valid Python str literal).
// One pass over the template, so a placeholder inside the inserted source is left alone; bytes
// that are not UTF-8 become U+FFFD rather than failing the call.
std::string py_template(std::string_view tpl, const std::string& source, const std::string& path) {
  static constexpr std::string_view kSource = "__KGATE_SOURCE__", kPath = "__KGATE_PATH__";
  auto literal = [](const std::string& v) { return json(v).dump(-1, ' ', false, json::error_handler_t::replace); };
  std::string out;
  std::size_t i = 0;
  while (i < tpl.size()) {
    auto s = tpl.find(kSource, i), p = tpl.find(kPath, i);
    auto next = std::min(s, p);
    if (next == std::string_view::npos) break;
    out.append(tpl.substr(i, next - i));
    out += next == s ? literal(source) : literal(path);
    i = next + (next == s ? kSource.size() : kPath.size());
  }
  out.append(tpl.substr(std::min(i, tpl.size())));
  return out;
}

std::optional<std::string> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string content_text(const json& content) {
  std::string s;
  for (auto& b : content)
    if (b.value("type", "") == "text") s += (s.empty() ? "" : "\n") + b.value("text", "");
  return s;
}

void append_text(json& content, const std::string& text) {
  if (text.empty()) return;
  if (!content.empty() && content.back().value("type", "") == "text")
    content.back()["text"] = content.back().value("text", "") + text;
  else
    content.push_back(text_block(text));
}


std::string json_str(const json& j, const char* key) {
  const auto it = j.is_object() ? j.find(key) : j.end();
  return j.is_object() && it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// A kgate job's outputs.  From the kernel channel when it saw the job's request from its first
// message (every output, in the order the kernel sent it: stdout, stderr, display_data, images),
// with the record's note; else from the record (text only: stdout and stderr interleaved, no
// display_data) after the images the channel has of it.  `watched`: the channel was open on the
// job's kernel before the job was sent, so a request it has not seen yet is only late.
std::vector<CellOutput> job_outputs(KernelChannel& channel, const json& rec, bool watched) {
  std::vector<CellOutput> from_record = outputs_from_record(rec);
  const std::string request = json_str(rec, "request");
  if (request.empty() || !channel.is_open() || channel.kernel() != json_str(rec, "kernel")) return from_record;
  const bool ended = !running(rec);
  auto got = channel.wait_for(request, 0ms, [](const KernelChannel::Collected&) { return true; });
  if (ended && !got.idle && (watched || got.began))
    got = channel.wait_for(request, kChannelLag, [](const KernelChannel::Collected& cc) { return cc.idle; });
  if (got.began && (got.idle || !ended)) {
    std::vector<CellOutput> outs = std::move(got.outputs);
    if (got.dropped) {
      CellOutput o;
      o.name = "note";
      o.text = "[" + std::to_string(got.dropped) + " more outputs of this cell were not kept: over kgate-mcp's " +
               "limits of " + std::to_string(KernelChannel::kMaxOutputs) + " outputs and " +
               std::to_string(KernelChannel::kMaxDataBytes >> 20) + " MiB per cell]";
      outs.push_back(std::move(o));
    }
    for (auto& o : from_record)
      if (o.kind == CellOutput::Kind::stream && o.name == "note") outs.push_back(std::move(o));
    return outs;
  }
  std::vector<CellOutput> outs;
  for (auto& o : got.outputs) {
    if (o.kind != CellOutput::Kind::display_data && o.kind != CellOutput::Kind::execute_result) continue;
    json data = json::object();
    for (auto& [mime, v] : o.data.items())
      if (mime.rfind("image/", 0) == 0 && mime != "image/svg+xml") data[mime] = v;
    if (data.empty()) continue;
    CellOutput img;
    img.kind = CellOutput::Kind::display_data;
    img.data = std::move(data);
    outs.push_back(std::move(img));
  }
  outs.insert(outs.end(), from_record.begin(), from_record.end());
  return outs;
}


// "Slurm job 12 (PENDING, Resources)" from a kernel model's kgate_placement.
std::string queue_text(const json& model) {
  json p = model.is_object() && model.contains("kgate_placement") ? model["kgate_placement"] : json();
  if (!p.is_object()) return "its launcher";
  std::string s = p.value("job_id", "").empty() ? "launcher " + p.value("launcher", std::string("?"))
                                                 : "Slurm job " + p.value("job_id", std::string());
  std::string st = p.value("state", ""), why = p.contains("reason") && p["reason"].is_string() ? p["reason"].get<std::string>() : "";
  if (!st.empty()) s += " (" + st + (why.empty() ? "" : ", " + why) + ")";
  return s;
}

}  // namespace kgate::mcp::tool_util
