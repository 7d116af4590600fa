// The warm pool (see pool.hpp and docs/dev/kernel-lifecycle.md "Warm pool").
#include "pool.hpp"

#include <algorithm>
#include <cctype>

#include <spdlog/spdlog.h>

#include "kgate/jupyter/kernelspec.hpp"
#include "kgate/process/process.hpp"
#include "services.hpp"

namespace kgate::gw {

namespace {

bool starts_with(const std::string& s, std::string_view p) { return s.compare(0, p.size(), p) == 0; }

// What a pooled kernel was started from: a kernelspec edited on disk since makes its pooled
// kernels stale.
std::string fingerprint(const KernelSpec& spec) {
  return nlohmann::json{{"argv", spec.argv},
                        {"env", spec.env},
                        {"language", spec.language},
                        {"interrupt_mode", spec.interrupt_mode},
                        {"resource_dir", spec.resource_dir.string()}}
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

constexpr std::chrono::seconds kFirstBackoff{5};
constexpr std::chrono::seconds kMaxBackoff{300};
// The quiet refill (refill_when_quiet).
constexpr std::chrono::milliseconds kQuiet{1000};
constexpr std::chrono::milliseconds kQuietPoll{250};
constexpr std::chrono::seconds kMaxRefillDelay{30};

}  // namespace

std::string pool_refusal(const KernelSpec& spec, const std::map<std::string, std::string>& env) {
  std::string lang = spec.language;
  std::transform(lang.begin(), lang.end(), lang.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (lang != "python")
    return "kernelspec " + spec.name + " is not a Python kernel (language \"" + spec.language +
           "\"): a pooled kernel takes its cwd and env through Python code";
  bool ipykernel = std::any_of(spec.argv.begin(), spec.argv.end(),
                               [](const std::string& a) { return a.find("ipykernel") != std::string::npos; });
  if (!ipykernel) return "kernelspec " + spec.name + " does not run ipykernel";
  // A pooled kernel started with kgate's environment and the spec's env: a variable read only at
  // start is no obstacle when the request asks for the value it already has (an agent's shell
  // and kgate's often share PYTHONUNBUFFERED, PYTHONDONTWRITEBYTECODE, PYTHONPATH).
  // Two are taken on at hand-out all the same: PYTHONDONTWRITEBYTECODE sets
  // sys.dont_write_bytecode there, and PYTHONUNBUFFERED only changes sys.__stdout__ (the
  // kernel's output goes through ipykernel's streams; child processes see os.environ).
  std::optional<std::map<std::string, std::string>> here;
  for (const auto& [k, v] : env) {
    if (!starts_with(k, "PYTHON") && !starts_with(k, "LD_") && !starts_with(k, "DYLD_")) continue;
    if (k == "PYTHONDONTWRITEBYTECODE" || k == "PYTHONUNBUFFERED") continue;
    if (!here) here = current_environment();
    std::optional<std::string> pooled;
    if (auto s = spec.env.find(k); s != spec.env.end()) pooled = expand_env(s->second, *here);
    else if (auto h = here->find(k); h != here->end()) pooled = h->second;
    if (pooled != v) return "env " + k + " is read only when a Python process starts, and the warm kernels have " +
                            (pooled ? "another value" : "none");
  }
  return {};
}

WarmPool::WarmPool(Services& server) : server_(server) {}

std::size_t WarmPool::want_for(const std::string& name) const {
  const auto& o = server_.options().pool;
  if (auto it = o.kernels.find(name); it != o.kernels.end()) return it->second;
  return name == default_name_ ? o.size : 0;
}

void WarmPool::configure() {
  if (stopping_) return;
  fill("");  // the default kernelspec: its name comes from the catalog
  for (const auto& [name, n] : server_.options().pool.kernels) fill(name);
  for (auto& [name, p] : pools_) {  // kernelspecs no longer configured: trim to 0
    if (server_.options().pool.kernels.count(name) || name == default_name_) continue;
    p.want = 0;
    discard(p, 0, "no longer configured");
  }
}

void WarmPool::fill(const std::string& name) {
  if (stopping_) return;
  server_.with_catalog([this, name](std::shared_ptr<const Catalog> cat) {
    if (stopping_ || !cat) return;
    std::string n = name.empty() ? cat->default_name : name;
    if (name.empty()) default_name_ = n;
    if (n.empty()) return;
    std::size_t want = want_for(n);
    auto it = pools_.find(n);
    if (want == 0 && it == pools_.end()) return;
    SpecPool& p = pools_[n];
    p.want = want;
    const CatalogEntry* e = cat->find(n);
    std::string why;
    if (!e) why = "no kernelspec named " + n;
    else if (!e->launchable) why = "kernelspec " + n + " cannot be launched: " + e->reason;
    else why = pool_refusal(e->spec, {});
    if (!why.empty()) {
      if (want > 0 && p.error != why) spdlog::warn("warm pool: {}; no warm kernels for it", why);
      p.error = why;
      discard(p, 0, why);
      return;
    }
    fill_from(n, e->spec);
  }, name);
}

void WarmPool::discard(SpecPool& p, std::size_t keep, const std::string& why) {
  while (p.ready.size() > keep) {
    std::string id = p.ready.front();
    p.ready.pop_front();
    spdlog::info("warm pool: stopping pooled kernel {} ({})", id, why);
    server_.manager().shutdown(id, {});
  }
}

void WarmPool::fill_from(const std::string& name, const KernelSpec& spec) {
  SpecPool& p = pools_[name];
  std::string fp = fingerprint(spec);
  if (p.fingerprint != fp) {
    p.fingerprint = fp;
    for (const auto& id : p.ready) server_.manager().shutdown(id, {});
    if (!p.ready.empty()) spdlog::info("warm pool: kernelspec {} changed; restarting its {} warm kernel(s)", name, p.ready.size());
    p.ready.clear();
  }
  discard(p, p.want, "the pool is smaller now");
  if (p.ready.size() + p.starting >= p.want) return;
  auto now = std::chrono::steady_clock::now();
  if (now < p.retry_at) {  // after a failed start: one timer, then try again
    if (!p.fill_pending) {
      p.fill_pending = true;
      auto t = std::make_shared<net::steady_timer>(server_.ioc(), p.retry_at - now);
      t->async_wait([this, t, name](beast::error_code ec) {
        pools_[name].fill_pending = false;
        if (!ec) fill(name);
      });
    }
    return;
  }
  while (p.ready.size() + p.starting < p.want) {
    ++p.starting;
    StartRequest sr;
    sr.spec = spec;
    sr.pooled = true;
    auto& ioc = server_.ioc();
    sr.on_pool_lost = [this, &ioc, name](const std::string& id, const std::string& why) {
      net::post(ioc, [this, name, id, why] { on_lost(name, id, why); });
    };
    server_.manager().start(std::move(sr), [this, &ioc, name, fp](StartResult r) {
      net::post(ioc, [this, name, fp, r = std::move(r)]() mutable { on_started(name, fp, std::move(r)); });
    });
  }
}

void WarmPool::on_started(const std::string& name, const std::string& fp, StartResult r) {
  SpecPool& p = pools_[name];
  if (p.starting > 0) --p.starting;
  if (!r.kernel && stopping_) {  // kgate's shutdown ended the start: not a failure to report
    spdlog::debug("warm pool: a {} kernel's start ended by the shutdown ({})", name, r.error);
    return;
  }
  if (!r.kernel) {
    p.error = "the last start failed: " + r.error;
    p.backoff = p.backoff.count() == 0 ? kFirstBackoff : std::min(kMaxBackoff, p.backoff * 2);
    p.retry_at = std::chrono::steady_clock::now() + p.backoff;
    spdlog::warn("warm pool: a {} kernel failed to start ({}); next try in {} s", name, r.error, p.backoff.count());
    if (!stopping_) fill(name);  // arms the backoff timer
    return;
  }
  if (stopping_ || fp != p.fingerprint || p.ready.size() >= p.want) {
    server_.manager().shutdown(r.kernel->id(), {});
    return;
  }
  p.error.clear();
  p.backoff = std::chrono::seconds(0);
  p.ready.push_back(r.kernel->id());
  spdlog::info("warm pool: kernel {} ({}) ready ({} of {})", r.kernel->id(), name, p.ready.size(), p.want);
}

std::size_t WarmPool::stop() {
  stopping_ = true;
  std::size_t n = 0;
  for (const auto& [name, p] : pools_) n += p.ready.size() + p.starting;
  return n;
}

void WarmPool::on_lost(const std::string& name, const std::string& id, const std::string& why) {
  SpecPool& p = pools_[name];
  auto it = std::find(p.ready.begin(), p.ready.end(), id);
  if (it == p.ready.end()) return;  // handed out or discarded already
  p.ready.erase(it);
  if (stopping_) {  // kgate's own shutdown stopped it: nothing was lost, nothing is replaced
    spdlog::debug("warm pool: pooled kernel {} stopped", id);
    return;
  }
  spdlog::warn("warm pool: pooled kernel {} lost ({}); starting another", id, why);
  fill(name);
}

void WarmPool::cold(StartRequest sr, std::function<void(StartResult)> done) {
  server_.manager().start(std::move(sr), std::move(done));
}

void WarmPool::start(StartRequest sr, std::function<void(StartResult)> done) {
  const std::string name = sr.spec.name;
  auto it = pools_.find(name);
  if (stopping_ || it == pools_.end()) return cold(std::move(sr), std::move(done));
  SpecPool& p = it->second;
  std::string why = pool_refusal(sr.spec, sr.env);
  if (p.ready.empty() || !why.empty() || fingerprint(sr.spec) != p.fingerprint) {
    ++p.cold_starts;
    if (!why.empty()) spdlog::info("kernel start of {}: cold, not from the pool ({})", name, why);
    cold(std::move(sr), std::move(done));
    if (why.empty()) refill_when_quiet(name);  // an empty or stale pool: (re)fill it
    return;
  }
  std::string id = p.ready.front();
  p.ready.pop_front();
  HandOut h;
  h.env = sr.env;
  h.cwd = sr.cwd;
  h.cull_idle_timeout = sr.cull_idle_timeout;
  auto& ioc = server_.ioc();
  server_.manager().hand_out(id, std::move(h), [this, &ioc, name, sr = std::move(sr), done = std::move(done)](StartResult r) mutable {
    net::post(ioc, [this, name, sr = std::move(sr), done = std::move(done), r = std::move(r)]() mutable {
      SpecPool& sp = pools_[name];
      if (r.kernel) {
        ++sp.handed_out;
        done(std::move(r));
      } else {
        ++sp.cold_starts;
        spdlog::warn("warm pool: hand-out failed ({}); starting {} cold", r.error, name);
        cold(std::move(sr), std::move(done));
      }
      refill_when_quiet(name);
    });
  });
}

bool WarmPool::kernels_quiet() const {
  for (const auto& k : server_.manager().list()) {
    std::string st = k->execution_state();
    if (st == "busy" || st == "starting" || st == "restarting" || k->idle_for() < kQuiet) return false;
  }
  return true;
}

void WarmPool::refill_when_quiet(const std::string& name) {
  if (stopping_) return;
  SpecPool& p = pools_[name];
  if (p.quiet_deadline) return;  // a check is already armed
  p.quiet_deadline = std::chrono::steady_clock::now() + kMaxRefillDelay;
  check_quiet(name);
}

void WarmPool::check_quiet(const std::string& name) {
  SpecPool& p = pools_[name];
  if (stopping_ || !p.quiet_deadline) return;
  if (kernels_quiet() || std::chrono::steady_clock::now() >= *p.quiet_deadline) {
    p.quiet_deadline.reset();
    fill(name);
    return;
  }
  auto t = std::make_shared<net::steady_timer>(server_.ioc(), kQuietPoll);
  t->async_wait([this, t, name](beast::error_code ec) {
    if (!ec) check_quiet(name);
  });
}

nlohmann::json WarmPool::status() const {
  nlohmann::json kernels = nlohmann::json::object();
  for (const auto& [name, p] : pools_) {
    nlohmann::json j{{"size", p.want},
                     {"ready", p.ready.size()},
                     {"starting", p.starting},
                     {"handed_out", p.handed_out},
                     {"cold_starts", p.cold_starts},
                     {"refill_waits", p.quiet_deadline.has_value()},
                     {"default", name == default_name_}};
    if (!p.error.empty()) j["error"] = p.error;
    kernels[name] = std::move(j);
  }
  return {{"kernels", std::move(kernels)}};
}

}  // namespace kgate::gw
