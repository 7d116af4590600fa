// Fuzz target: kernel messages -> job records -> JSON (kgate/jobs.hpp).
//
// The input is a sequence of steps: iopub stream, error, execute_result, execute_input and
// status messages, execute_replies, agent submits, kgate clients' silent requests, kernel
// restarts and deaths, fed to a JobStore through the observer calls kgate-io makes.  A step's
// content is either the fuzzer's bytes as they are, or a well-formed message whose strings are
// the fuzzer's bytes (bytes >= 0x80 spliced raw, as ipykernel's surrogateescape sends them).
// After each read step and at the end, every read the gateway serves (a job in full, the
// listing, the digest, the notebook) must dump in nlohmann's strict mode, every recorded text
// must be valid UTF-8, and nothing may throw.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kgate/records/jobs.hpp"
#include "kgate/jupyter/utf8.hpp"

namespace {

using kgate::json;

void must(bool ok) {
  if (!ok) std::abort();
}

// A JSON string literal holding `bytes`: runs below 0x80 escaped by nlohmann, the rest raw (JSON
// never escapes those), so bytes that are not UTF-8 reach the parser as a kernel sends them.
std::string literal(std::string_view bytes) {
  std::string out = "\"";
  std::size_t i = 0;
  while (i < bytes.size()) {
    std::size_t j = i;
    const bool high = static_cast<unsigned char>(bytes[i]) >= 0x80;
    while (j < bytes.size() && (static_cast<unsigned char>(bytes[j]) >= 0x80) == high) ++j;
    if (high) {
      out.append(bytes.substr(i, j - i));
    } else {
      std::string quoted = json(std::string(bytes.substr(i, j - i))).dump();
      out.append(quoted, 1, quoted.size() - 2);
    }
    i = j;
  }
  return out + "\"";
}

// `content` dumped, with every "@S@" string replaced by literal(s).
std::string with_text(const json& content, std::string_view s) {
  std::string wire = content.dump();
  const std::string key = "\"@S@\"";
  const std::string lit = literal(s);
  for (auto at = wire.find(key); at != std::string::npos; at = wire.find(key, at + lit.size()))
    wire.replace(at, key.size(), lit);
  return wire;
}

kgate::KernelMessagePtr message(kgate::Channel ch, const std::string& type, const std::string& parent,
                                const std::string& session, std::string content) {
  json ph = {{"msg_id", parent}, {"session", session}};
  auto m = kgate::synthesize_message(ch, type, "kernel-session", ph.dump(), json::object());
  m.synthesized = false;
  m.wire.content = std::move(content);
  return std::make_shared<const kgate::KernelMessage>(std::move(m));
}

void check_text(std::string_view s) { must(kgate::is_valid_utf8(s)); }

// Every read, dumped strictly (a throw ends the run as a crash).
void read_all(const kgate::JobStore& store, const kgate::KernelPtr& kernel, std::size_t code_chars) {
  auto now = std::chrono::steady_clock::now();
  for (const auto& j : store.kernel_jobs(kernel->id())) {
    for (const std::string* s : {&j.code, &j.ename, &j.evalue, &j.note}) check_text(*s);
    for (const auto& line : j.traceback) check_text(line);
    check_text(j.output.text());
    check_text(j.result.text());
    check_text(kgate::job_json(j, true, now).dump());
  }
  for (const std::string& k : {std::string(), kernel->id()}) {
    auto l = store.list(k, 0, code_chars);
    json list = json::array();
    for (const auto& j : l.jobs) list.push_back(kgate::job_json(j, false, now));
    check_text(list.dump());
  }
  json digest = json::array();
  for (const auto& e : store.digest(kernel->id()).jobs)
    digest.push_back({{"job", e.job}, {"status", kgate::status_name(e.status)}, {"elapsed", e.elapsed}});
  check_text(digest.dump());
  check_text(kgate::notebook_json(store.kernel_jobs(kernel->id()), store.restarts(kernel->id()), &kernel->spec()).dump());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const kgate::KernelPtr kernel = [] {
    kgate::KernelSpec spec;
    spec.name = "python3";
    spec.display_name = "Python 3";
    spec.language = "python";
    return std::make_shared<kgate::Kernel>("fuzz-kernel", spec);
  }();
  FuzzedDataProvider in(data, size);
  kgate::RecordLimits limits;
  limits.job_output_bytes = in.ConsumeIntegralInRange<std::size_t>(1, 512);
  limits.job_code_bytes = in.ConsumeIntegralInRange<std::size_t>(1, 512);
  limits.budget_bytes = in.ConsumeIntegralInRange<std::size_t>(1, 1 << 16);
  limits.max_jobs = in.ConsumeIntegralInRange<std::size_t>(1, 64);
  limits.max_unseen_jobs = in.ConsumeIntegralInRange<std::size_t>(1, 64);
  limits.max_restart_marks = in.ConsumeIntegralInRange<std::size_t>(1, 8);
  limits.reply_grace = std::chrono::milliseconds(0);
  kgate::JobStore store(limits);

  std::vector<std::string> requests = {"r0", "r1", "r2"};
  for (int step = 0; step < 256 && in.remaining_bytes() > 0; ++step) {
    const std::uint8_t op = in.ConsumeIntegral<std::uint8_t>();
    const std::uint8_t who = in.ConsumeIntegral<std::uint8_t>();
    const std::string s = in.ConsumeRandomLengthString(4096);
    const std::string req = requests[who % requests.size()];
    const std::string session = (who & 0x80) ? store.session() : "someone-else";
    auto iopub = [&](const char* type, std::string content) {
      store.on_kernel_message(kernel, message(kgate::Channel::iopub, type, req, session, std::move(content)));
    };
    auto reply = [&](std::string content) {
      store.on_kernel_message(kernel, message(kgate::Channel::shell, "execute_reply", req, session, std::move(content)));
    };
    switch (op % 16) {
      case 0: iopub("stream", s); break;
      case 1: iopub("error", s); break;
      case 2: iopub("execute_result", s); break;
      case 3: iopub("execute_input", s); break;
      case 4: iopub("status", s); break;
      case 5: reply(s); break;
      case 6: iopub("stream", with_text({{"name", (op & 0x10) ? "stderr" : "stdout"}, {"text", "@S@"}}, s)); break;
      case 7:
        iopub("error", with_text({{"ename", (op & 0x10) ? "@S@" : "ValueError"}, {"evalue", "@S@"},
                                  {"traceback", {"@S@", "\x1b[0;31m@S@\x1b[0m", "@S@"}}}, s));
        break;
      case 8:
        iopub("execute_result", with_text({{"data", {{"text/plain", "@S@"}}}, {"execution_count", who}}, s));
        break;
      case 9: iopub("execute_input", with_text({{"code", "@S@"}, {"execution_count", who}}, s)); break;
      case 10: iopub("status", json{{"execution_state", (op & 0x10) ? "idle" : "busy"}}.dump()); break;
      case 11:
        reply(with_text({{"status", (op & 0x10) ? "error" : "ok"}, {"ename", "@S@"}, {"evalue", "@S@"},
                         {"execution_count", who}}, s));
        break;
      case 12: {
        auto out = store.submit(kernel->id(), kgate::AgentRef{(op & 0x10) ? "a1" : "a2", ""}, s,
                                kgate::JobOrigin::mcp, [&](kgate::ClientMessage m) {
                                  if (requests.size() < 8) requests.push_back(m.msg_id);
                                  else requests[who % requests.size()] = m.msg_id;
                                });
        (void)out;
        break;
      }
      case 13: {
        kgate::ClientMessage cm;
        cm.channel = kgate::Channel::shell;
        cm.msg_type = "execute_request";
        cm.msg_id = req;
        cm.route = "client-1";
        cm.wire.content = (op & 0x10) ? s : with_text({{"code", "@S@"}, {"silent", true}}, s);
        store.on_client_message(kernel, cm);
        break;
      }
      case 14: {
        static constexpr kgate::KernelLifecycle events[] = {
            kgate::KernelLifecycle::restarting, kgate::KernelLifecycle::died, kgate::KernelLifecycle::culled};
        store.on_kernel_lifecycle(kernel, events[(op >> 4) % 3], s.substr(0, 64));
        break;
      }
      default:
        store.sweep();
        read_all(store, kernel, who);
        break;
    }
  }
  read_all(store, kernel, 40);

  // The UTF-8 routines themselves, on the raw input.
  const std::string_view raw(reinterpret_cast<const char*>(data), size);
  const std::string fixed = kgate::valid_utf8(raw);
  must(kgate::is_valid_utf8(fixed));
  must(kgate::is_valid_utf8(raw) == (fixed == raw));
  must(kgate::is_valid_utf8(kgate::strip_ansi(fixed)));
  return 0;
}
