// GET {base}metrics (routes.hpp): Prometheus's text exposition format, version 0.0.4, behind the
// token like every route.  Every figure is read when the page is asked for, from what already
// counts it: the kernel manager, the job records, the hub, the warm pool and the sessions.
// docs/metrics.md "Metrics" lists them.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <sstream>

#include "kgate/records/jobs.hpp"
#include "kgate/version.hpp"
#include "handlers.hpp"
#include "pool.hpp"
#include "services.hpp"
#include "sessions.hpp"
#include "ws/hub.hpp"

namespace kgate::gw {

namespace {

// A label value as the format wants it: backslash, double quote and newline escaped.
std::string label_value(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

class Page {
 public:
  // One metric family: its HELP and TYPE lines, then its samples.
  void family(const char* name, const char* type, const char* help) {
    out_ << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  }
  void sample(const std::string& name, double value, const std::vector<std::pair<std::string, std::string>>& labels = {}) {
    out_ << name;
    if (!labels.empty()) {
      out_ << '{';
      for (std::size_t i = 0; i < labels.size(); ++i)
        out_ << (i ? "," : "") << labels[i].first << "=\"" << label_value(labels[i].second) << '"';
      out_ << '}';
    }
    out_ << ' ' << number(value) << '\n';
  }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

constexpr JobOrigin kOrigins[] = {JobOrigin::mcp, JobOrigin::user, JobOrigin::host};

}  // namespace

void metrics_page(Call& c) {
  Services& server = c.services;
  Page p;

  p.family("kgate_build_info", "gauge", "kgate's version (the value is always 1).");
  p.sample("kgate_build_info", 1, {{"version", std::string(kgate::version())}});
  p.family("kgate_start_time_seconds", "gauge", "When this kgate started, in seconds since the Unix epoch.");
  p.sample("kgate_start_time_seconds", server.started_unix());

  // Kernels: by state, the warm pool's apart.
  std::map<std::string, int> states = {{"starting", 0}, {"idle", 0}, {"busy", 0}, {"restarting", 0}, {"dead", 0}};
  for (const auto& k : server.manager().list()) ++states[k->execution_state()];
  p.family("kgate_kernels", "gauge", "Kernels by execution state (the warm pool's ready kernels not included).");
  for (const auto& [state, n] : states) p.sample("kgate_kernels", n, {{"state", state}});
  auto counts = server.manager().counters();
  p.family("kgate_kernel_starts_total", "counter", "Kernel launches that became ready (warm pool refills included).");
  p.sample("kgate_kernel_starts_total", static_cast<double>(counts.started));
  p.family("kgate_kernel_start_failures_total", "counter", "Kernel launches and restarts that failed.");
  p.sample("kgate_kernel_start_failures_total", static_cast<double>(counts.start_failures));
  p.family("kgate_kernel_restarts_total", "counter", "Kernel restarts that came back ready.");
  p.sample("kgate_kernel_restarts_total", static_cast<double>(counts.restarts));
  // The kernel side (README "kgate's kernel side").
  p.family("kgate_kernel_refused_shutdowns_total", "counter",
           "shutdown_requests from clients other than kgate that the kernel side refused.");
  p.sample("kgate_kernel_refused_shutdowns_total", static_cast<double>(counts.refused_shutdowns));
  p.family("kgate_background_tasks_total", "counter", "Background tasks started (execute background, %%run_async).");
  p.sample("kgate_background_tasks_total", static_cast<double>(counts.tasks_started));
  p.family("kgate_kernel_closes_total", "counter",
           "Closes sent before a shutdown or restart, by whether the kernel answered within close_grace_ms.");
  p.sample("kgate_kernel_closes_total", static_cast<double>(counts.closes_answered), {{"answered", "true"}});
  p.sample("kgate_kernel_closes_total", static_cast<double>(counts.closes_unanswered), {{"answered", "false"}});

  // Executions, from the job records.
  JobStats js = server.jobs().stats();
  p.family("kgate_executions_total", "counter",
           "Cells that ended, by who ran them (mcp: an agent; user: anyone else; host: kgate itself) and how they ended.");
  for (const auto& [key, n] : js.ended)
    p.sample("kgate_executions_total", static_cast<double>(n),
             {{"origin", std::string(origin_name(key.first))}, {"status", std::string(status_name(key.second))}});
  p.family("kgate_execution_duration_seconds", "histogram", "How long cells ran, from their start to their end.");
  for (JobOrigin o : kOrigins) {
    const auto& h = js.duration[static_cast<std::size_t>(o)];
    const std::string origin(origin_name(o));
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i < JobStats::kBuckets.size(); ++i) {
      cumulative += h.bucket[i];
      p.sample("kgate_execution_duration_seconds_bucket", static_cast<double>(cumulative),
               {{"origin", origin}, {"le", number(JobStats::kBuckets[i])}});
    }
    p.sample("kgate_execution_duration_seconds_bucket", static_cast<double>(h.count), {{"origin", origin}, {"le", "+Inf"}});
    p.sample("kgate_execution_duration_seconds_sum", h.sum, {{"origin", origin}});
    p.sample("kgate_execution_duration_seconds_count", static_cast<double>(h.count), {{"origin", origin}});
  }
  p.family("kgate_records_jobs", "gauge", "Job records held.");
  p.sample("kgate_records_jobs", static_cast<double>(js.jobs));
  p.family("kgate_records_bytes", "gauge", "Bytes the job records hold (code, output, results, tracebacks).");
  p.sample("kgate_records_bytes", static_cast<double>(js.bytes));
  p.family("kgate_records_budget_bytes", "gauge", "The records' memory budget ([records] budget_bytes).");
  p.sample("kgate_records_budget_bytes", static_cast<double>(server.jobs().limits().budget_bytes));
  p.family("kgate_records_evicted_total", "counter", "Job records dropped to stay within max_jobs and the budget.");
  p.sample("kgate_records_evicted_total", static_cast<double>(js.evicted));

  // Websockets, from the hub.
  const auto& hc = server.hub().counters();
  p.family("kgate_websocket_connections", "gauge", "Open websocket connections to kernels.");
  p.sample("kgate_websocket_connections", server.hub().connections());
  p.family("kgate_websocket_connections_opened_total", "counter", "Websocket connections to kernels opened.");
  p.sample("kgate_websocket_connections_opened_total", static_cast<double>(hc.opened));
  p.family("kgate_websocket_sent_bytes_total", "counter", "Bytes written to websocket clients.");
  p.sample("kgate_websocket_sent_bytes_total", static_cast<double>(hc.bytes_out));
  p.family("kgate_websocket_dropped_messages_total", "counter",
           "Messages dropped for a client (a slow reader's bounded spill, a replay buffer's limit); each gap was noted to its client.");
  p.sample("kgate_websocket_dropped_messages_total", static_cast<double>(hc.dropped));
  p.family("kgate_websocket_replayed_messages_total", "counter", "Messages replayed to a client that reconnected with its session id.");
  p.sample("kgate_websocket_replayed_messages_total", static_cast<double>(hc.replayed));

  // The warm pool, by kernelspec.
  json pool = server.pool().status();
  p.family("kgate_pool_hits_total", "counter", "Kernel starts served by a warm pool kernel.");
  for (const auto& [name, st] : pool["kernels"].items())
    p.sample("kgate_pool_hits_total", st.value("handed_out", 0.0), {{"kernelspec", name}});
  p.family("kgate_pool_misses_total", "counter", "Kernel starts of a pooled kernelspec that had to start cold.");
  for (const auto& [name, st] : pool["kernels"].items())
    p.sample("kgate_pool_misses_total", st.value("cold_starts", 0.0), {{"kernelspec", name}});
  p.family("kgate_pool_ready", "gauge", "Warm pool kernels ready to hand out.");
  for (const auto& [name, st] : pool["kernels"].items())
    p.sample("kgate_pool_ready", st.value("ready", 0.0), {{"kernelspec", name}});

  p.family("kgate_sessions", "gauge", "Sessions of the sessions API.");
  p.sample("kgate_sessions", static_cast<double>(server.sessions().all().size()));

  Response res{http::status::ok, c.req.version()};
  res.set(http::field::server, kgate::server_header());
  res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
  res.set(http::field::cache_control, "no-store");
  res.keep_alive(c.req.keep_alive());
  res.body() = p.str();
  res.prepare_payload();
  c.respond(std::move(res));
}

}  // namespace kgate::gw
