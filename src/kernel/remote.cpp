// The kernel runtime: remote launchers, their registration, the scheduler poll and SSH tunnels (docs/dev/remote-launchers.md).
#include "kernel_impl.hpp"

namespace kgate {

// ---------------------------------------------------------------------------------------
// Remote launchers (docs/dev/remote-launchers.md)

namespace {

// header.date ("2026-12-05T07:00:00.123456Z", or with an offset of +00:00) as a time point;
// nullopt when it is not that.
std::optional<std::chrono::system_clock::time_point> parse_header_date(const std::string& d) {
  int y, mo, da, h, mi;
  double sec;
  if (std::sscanf(d.c_str(), "%d-%d-%dT%d:%d:%lf", &y, &mo, &da, &h, &mi, &sec) != 6) return std::nullopt;
  std::tm tm{};
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = da;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = 0;
  const time_t t = ::timegm(&tm);
  if (t == static_cast<time_t>(-1)) return std::nullopt;
  return std::chrono::system_clock::from_time_t(t) +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(sec));
}

bool slurm_state_live(const std::string& st) {
  static const std::set<std::string> live = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING",
                                             "SUSPENDED", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                                             "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"};
  return live.count(st) > 0;
}

}  // namespace

// (kernel_impl.hpp)
void wait_forwarding(int local_port, const std::function<bool()>& gone) {
  for (auto until = Clock::now() + std::chrono::seconds(15); Clock::now() < until && !gone();) {
    if (tcp_accepts("127.0.0.1", local_port)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void KernelManager::Impl::ensure_registration() {
  if (reg) return;
  auto s = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::router);
  s->set(zmq::sockopt::linger, 0);
  s->set(zmq::sockopt::maxmsgsize, std::int64_t{64} << 10);  // a registration is a few hundred bytes
  const std::string port = opts.registration_port > 0 ? std::to_string(opts.registration_port) : "*";
  try {
    s->bind("tcp://" + opts.registration_ip + ":" + port);
  } catch (const zmq::error_t& e) {
    throw std::runtime_error("cannot bind the registration endpoint on " + opts.registration_ip + ":" + port +
                             " ([remote] registration_ip/registration_port): " + e.what());
  }
  reg_endpoint = s->get(zmq::sockopt::last_endpoint);
  reg = std::move(s);
  spdlog::info("remote launchers register at {}", reg_endpoint);
}

void KernelManager::Impl::launch_remote(KernelIo& k) {
  ++k.epoch;
  ++k.attempts;
  const LauncherConfig& l = *k.request.launcher;
  const bool ssh = l.kind == LauncherConfig::Kind::ssh;
  if (!ssh) ensure_registration();
  close_sockets(k);
  k.reg_secret = new_hex_id() + new_hex_id();  // 256 bits, for this launch only
  k.reg_nonces.clear();
  k.slurm_job.clear();
  k.running_since = {};
  k.link_down = false;
  k.stall_relaunched = true;  // no stall relaunch: that would be another job
  k.phase = k.phase == KernelPhase::restarting ? KernelPhase::restarting : KernelPhase::launching;
  if (k.tunnel.running()) {  // a new launch has new ports: the old forwards go
    k.tunnel.signal(SIGTERM);
    k.tunnel.wait_for_exit(1000);
  }
  k.tunnel = ChildProcess{};
  for (int p : k.local_ports) reserved_ports.erase(p);
  k.local_ports.clear();
  const std::string id = k.kernel->id();
  ensure_private_dir(opts.remote_dir);
  k.spec_file = opts.remote_dir / (id + "-" + std::to_string(k.attempts) + ".json");
  const std::filesystem::path log = opts.remote_dir / (id + ".log");
  const KernelSpec& spec = k.kernel->spec();
  auto here = current_environment();
  json env = json::object();
  for (const auto& [name, value] : spec.env) env[name] = expand_env(value, here);
  for (const auto& [name, value] : k.request.env) env[name] = value;
  json argv = json::array();
  for (auto arg : spec.argv) {
    const std::string key = "{resource_dir}", val = spec.resource_dir.string();
    for (auto pos = arg.find(key); pos != std::string::npos; pos = arg.find(key, pos + val.size()))
      arg.replace(pos, key.size(), val);
    argv.push_back(arg);
  }
  json launch = {{"format", "kgate-node-launch"},
                 {"version", 1},
                 {"kernel_id", id},
                 {"attempt", k.attempts},
                 // SSH: the report comes back on the SSH channel; Slurm: to kgate's endpoint.
                 {"registration", ssh ? std::string("stdout") : reg_endpoint},
                 {"secret", k.reg_secret},
                 {"key", k.conn.key},
                 {"signature_scheme", k.conn.signature_scheme},
                 {"kernel_name", spec.name},
                 {"argv", argv},
                 {"env", env},
                 {"cwd", k.request.cwd.string()},
                 {"connection_dir", l.connection_dir.string()},
                 {"orphan_timeout_ms", opts.orphan_timeout.count()},
                 {"terminate_grace_ms", opts.terminate_grace.count()}};
  if (ssh) launch["ip"] = l.forward ? std::string("127.0.0.1") : l.bind_ip;
  write_file_atomically(k.spec_file, launch.dump());
  k.kernel->update_placement({{"launcher", l.name},
                              {"kind", l.kind_name()},
                              {"state", ssh ? "CONNECTING" : "SUBMITTING"},
                              {"job_id", nullptr},
                              {"reason", nullptr},
                              {"host", ssh ? json(l.host) : json(nullptr)},
                              {"link", nullptr},
                              {"log", ssh ? json(nullptr) : json(log.string())}});
  const auto epoch = k.epoch;
  if (ssh) {
    spdlog::info("kernel {}: starting on {} over ssh (launcher {}, attempt {})", id, l.host, l.name, k.attempts);
    spawn([this, id, epoch, launcher = k.request.launcher, spec_file = k.spec_file] {
      auto r = ssh_launch(*launcher, spec_file);
      std::error_code ec;
      std::filesystem::remove(spec_file, ec);  // it held the secret; ssh has sent it
      std::string why;
      std::string addr = launcher->forward ? std::string() : resolve_ipv4(launcher->host, &why);
      post([this, id, epoch, r, addr, why] {
        KernelIo* kk = find(id);
        if (!kk || kk->epoch != epoch || !kk->remote()) return;  // deleted meanwhile: its orphan timeout ends it
        if (!r.error.empty()) return fail_start(*kk, r.error);
        if (!kk->request.launcher->forward && addr.empty()) return fail_start(*kk, why);
        kk->host_addr = addr;
        ssh_reported(*kk, r.line);
      });
    });
    return;
  }
  auto argv_sbatch = sbatch_argv(l, id, k.spec_file, log);
  spdlog::info("kernel {}: submitting to Slurm (launcher {}, attempt {})", id, l.name, k.attempts);
  spawn([this, id, epoch, argv_sbatch] {
    auto r = slurm_submit(argv_sbatch);
    post([this, id, epoch, r] {
      KernelIo* kk = find(id);
      if (!kk || kk->epoch != epoch || !kk->remote()) {  // deleted (or relaunched) meanwhile
        if (!r.job_id.empty()) spawn([job = r.job_id] { slurm_cancel(job); });
        return;
      }
      if (r.job_id.empty()) {
        fail_start(*kk, r.error);
        return;
      }
      kk->slurm_job = r.job_id;
      kk->kernel->update_placement({{"job_id", r.job_id}, {"state", "PENDING"}});
      save_entry(*kk);  // a later kgate cancels it if it is still queued then
      spdlog::info("kernel {}: Slurm job {}", id, r.job_id);
      scheduler_arm();
    });
  });
}

void KernelManager::Impl::scheduler_arm() {
  if (sched_timer) return;
  sched_timer = true;
  after(opts.scheduler_poll, [this] {
    sched_timer = false;
    scheduler_tick();
  });
}

void KernelManager::Impl::scheduler_tick() {
  std::vector<std::string> jobs;
  for (auto& [id, kp] : io)
    if (kp->remote() && !kp->slurm_job.empty() && kp->phase != KernelPhase::dead) jobs.push_back(kp->slurm_job);
  if (jobs.empty()) return;
  scheduler_arm();
  if (sched_out) return;  // one squeue at a time
  sched_out = true;
  spawn([this, jobs] {
    std::string why;
    auto res = slurm_query(jobs, &why);
    post([this, jobs, res, why] {
      sched_out = false;
      on_scheduler(jobs, res, why);
    });
  });
}

void KernelManager::Impl::on_scheduler(const std::vector<std::string>& jobs,
                                       const std::optional<std::vector<SlurmJobState>>& res,
                                       const std::string& why) {
  if (!res) {
    spdlog::warn("scheduler poll: {}", why);
    return;
  }
  std::map<std::string, SlurmJobState> by_id;
  for (const auto& j : *res) by_id[j.job_id] = j;
  const auto now = Clock::now();
  std::vector<std::string> ids;
  for (auto& [id, kp] : io) ids.push_back(id);
  for (const auto& id : ids) {
    KernelIo* k = find(id);
    if (!k || !k->remote() || k->slurm_job.empty() ||
        std::find(jobs.begin(), jobs.end(), k->slurm_job) == jobs.end())
      continue;
    auto it = by_id.find(k->slurm_job);
    const std::string state = it == by_id.end() ? "GONE" : it->second.state;
    json fields = {{"state", state}};
    if (it != by_id.end()) {
      const std::string& reason = it->second.reason;
      fields["reason"] = reason.empty() || reason == "None" ? json(nullptr) : json(reason);
      if (!it->second.node.empty() && it->second.node != "(null)") fields["node"] = it->second.node;
    }
    k->kernel->update_placement(fields);
    if (k->link_down && !slurm_state_live(state) && k->phase == KernelPhase::ready) {
      std::string reason = it == by_id.end() ? "" : it->second.reason;
      die(*k, "unreachable (" + k->link_why + "), and its Slurm job " + k->slurm_job + " ended: " + state +
                  (reason.empty() || reason == "None" ? "" : " (" + reason + ")"));
      continue;
    }
    if (k->reg_secret.empty()) continue;  // registered: the control link tells of its end
    const std::string log = k->kernel->placement().value("log", std::string());
    if (!slurm_state_live(state)) {
      std::string reason = it == by_id.end() ? "" : it->second.reason;
      fail_start(*k, "Slurm job " + k->slurm_job + " ended before its kernel registered: " + state +
                         (reason.empty() || reason == "None" ? "" : " (" + reason + ")") + "; see " + log);
      continue;
    }
    if (state == "RUNNING") {
      if (k->running_since == Clock::time_point{}) k->running_since = now;
      else if (now - k->running_since > opts.registration_timeout)
        fail_start(*k, "Slurm job " + k->slurm_job + " runs, but its launcher did not register within " +
                           std::to_string(opts.registration_timeout.count() / 1000) + " s; see " + log);
    }
  }
}

std::string KernelManager::Impl::verify_registration(KernelIo& k, const std::vector<std::string_view>& views,
                                                     json& c, bool& signed_ok) {
  signed_ok = false;
  const std::string id = k.kernel->id();
  if (!k.remote() || k.reg_secret.empty()) return "no registration is expected for this kernel";
  Signer signer(k.reg_secret);
  WireMessage w;
  DecodeLimits lim;
  lim.max_message_bytes = std::size_t{64} << 10;
  if (auto ec = decode(views, signer, w, lim, /*validate_json=*/true); ec)
    return "bad signature (" + ec.message() + "): forged, or not signed with this kernel's secret";
  signed_ok = true;
  json h = json::parse(w.header, nullptr, false);
  c = json::parse(w.content, nullptr, false);
  std::string refuse;
  const std::string nonce = h.value("msg_id", std::string());
  auto date = parse_header_date(h.value("date", std::string()));
  const auto skew = date ? std::chrono::abs(std::chrono::system_clock::now() - *date) : std::chrono::system_clock::duration::max();
  auto port_ok = [&](const char* key) {
    return c.contains(key) && c[key].is_number_integer() && c[key].get<int>() > 0 && c[key].get<int>() < 65536;
  };
  if (h.value("msg_type", std::string()) != kRegisterType) refuse = "not a " + std::string(kRegisterType) + " message";
  else if (nonce.empty() || k.reg_nonces.count(nonce)) refuse = "replayed (its nonce was used already)";
  else if (!date || skew > kRegistrationMaxSkew)
    refuse = "late: its date is more than " + std::to_string(kRegistrationMaxSkew.count()) + " s from kgate's clock";
  else if (!c.is_object() || c.value("kernel_id", std::string()) != id) refuse = "it names another kernel";
  else if (c.value("attempt", -1) != k.attempts) refuse = "it is for an earlier launch of this kernel";
  else if (!c.contains("ip") || !c["ip"].is_string()) refuse = "no ip";
  else {
    for (const char* key : {"shell_port", "iopub_port", "stdin_port", "control_port", "hb_port", "control_link_port"})
      if (!port_ok(key)) refuse = std::string("no valid ") + key;
  }
  if (!nonce.empty()) k.reg_nonces.insert(nonce);
  if (refuse.empty()) k.reg_secret.clear();  // one registration per secret: a replay finds nothing to register
  return refuse;
}

void KernelManager::Impl::on_registration() {
  reg_recheck = false;
  for (int n = 0; reg; ++n) {
    if (n == 64) {  // the rest on the next pass: kernels' sockets get their turn
      reg_recheck = true;
      return;
    }
    std::vector<zmq::message_t> parts;
    zmq::message_t part;
    if (!reg->recv(part, zmq::recv_flags::dontwait)) return;
    bool more = part.more();
    parts.push_back(std::move(part));
    while (more && parts.size() < 32) {
      zmq::message_t p2;
      if (!reg->recv(p2, zmq::recv_flags::dontwait)) break;
      more = p2.more();
      parts.push_back(std::move(p2));
    }
    if (parts.size() < 7) continue;  // not a Jupyter message: nothing to answer
    std::vector<std::string_view> views;
    for (auto& p : parts) views.emplace_back(static_cast<const char*>(p.data()), p.size());
    const std::string identity(views[0]);
    auto answer = [&](const Signer& signer, const std::string& status, const std::string& reason) {
      WireMessage w;
      w.identities = {identity};
      w.header = make_header(kRegisterReplyType, "kgate").dump();
      w.parent_header = "{}";
      w.metadata = "{}";
      w.content = json{{"status", status}, {"reason", reason}}.dump();
      auto frames = encode(w, signer);
      for (std::size_t i = 0; i < frames.size(); ++i)
        (void)reg->send(zmq::buffer(frames[i]),
                        (i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none) |
                            zmq::send_flags::dontwait);
      reg_recheck = true;  // a send may have taken in the next message's signal
    };
    // Which kernel it claims to be, unverified: only to pick the secret to verify it with.
    std::size_t delim = 0;  // [identity, delimiter, signature, header, ...]
    while (delim < views.size() && views[delim] != "<IDS|MSG>") ++delim;
    if (delim + 2 >= views.size()) continue;
    json peek = json::parse(views[delim + 2], nullptr, false);
    const std::string id = peek.is_object() && peek.contains("session") && peek["session"].is_string()
                               ? peek["session"].get<std::string>() : std::string();
    KernelIo* k = find(id);
    static const Signer unsigned_signer;
    if (!k || !k->remote() || k->reg_secret.empty()) {
      spdlog::warn("registration refused: no registration is expected for kernel '{}' (unknown, or registered already)",
                   id.substr(0, 64));
      answer(unsigned_signer, "error", "no registration is expected for this kernel");
      continue;
    }
    Signer signer(k->reg_secret);  // before verify_registration uses the secret up
    json c;
    bool signed_ok = false;
    std::string refuse = verify_registration(*k, views, c, signed_ok);
    if (!refuse.empty()) {
      spdlog::warn("kernel {}: registration refused: {}", id, refuse);
      answer(signed_ok ? signer : unsigned_signer, "error", signed_ok ? refuse : "bad signature");
      continue;
    }
    answer(signer, "ok", "");
    registered(*k, c);
  }
}

void KernelManager::Impl::ssh_reported(KernelIo& k, const std::string& line) {
  json j = json::parse(line, nullptr, false);
  if (!j.is_object() || !j.contains("kgate_register") || !j["kgate_register"].is_array())
    return fail_start(k, "the node launcher on " + k.request.launcher->host + " answered '" + line.substr(0, 200) +
                             "', not its report (is kgate_path a kgate of this version?)");
  std::vector<std::string> frames;
  for (const auto& f : j["kgate_register"]) frames.push_back(f.is_string() ? f.get<std::string>() : std::string());
  std::vector<std::string_view> views(frames.begin(), frames.end());
  json c;
  bool signed_ok = false;
  std::string refuse = verify_registration(k, views, c, signed_ok);
  if (!refuse.empty()) return fail_start(k, "the node launcher's report was refused: " + refuse);
  registered(k, c);
}

void KernelManager::Impl::registered(KernelIo& k, const json& c) {
  const std::string id = k.kernel->id();
  const LauncherConfig& l = *k.request.launcher;
  k.node_ip = c["ip"].get<std::string>();
  k.node_ports.clear();
  for (const char* key : {"shell_port", "iopub_port", "stdin_port", "control_port", "hb_port", "control_link_port"})
    k.node_ports.push_back(c[key].get<int>());
  k.control_link_port = k.node_ports[5];
  // Where kgate reaches them: the node's address as reported; a host that bound every address
  // (SSH, bind_ip 0.0.0.0) at the address kgate resolved its name to; forwarded, 127.0.0.1.
  k.connect_ip = k.node_ip == "0.0.0.0" ? k.host_addr : k.node_ip;
  const std::string host = c.value("hostname", std::string());
  k.kernel->update_placement({{"host", host}, {"ip", k.node_ip}});
  if (l.kind == LauncherConfig::Kind::ssh) k.kernel->update_placement({{"state", "RUNNING"}});
  spdlog::info("kernel {}: registered from {} ({}), pid {}{}", id, host, k.node_ip, c.value("pid", 0),
               k.slurm_job.empty() ? "" : ", Slurm job " + k.slurm_job);
  open_link(k, /*reconnect=*/false);
}

bool KernelManager::Impl::start_tunnel(KernelIo& k, std::string& why) {
  const LauncherConfig& l = *k.request.launcher;
  if (k.local_ports.empty()) {
    try {
      k.local_ports = pick_ports("127.0.0.1", 6, reserved_ports);
    } catch (const std::exception& e) {
      why = e.what();
      return false;
    }
    for (int p : k.local_ports) reserved_ports.insert(p);
  }
  LaunchOptions lo;
  lo.env = current_environment();
  lo.argv = ssh_tunnel_argv(l, k.local_ports, k.node_ports);
  lo.argv[0] = find_program(lo.argv[0], lo.env);
  // Started from kgate-io, which lives as long as kgate: PR_SET_PDEATHSIG follows the thread.
  lo.die_with_parent = true;
  try {
    k.tunnel = ChildProcess::launch(lo);
  } catch (const std::exception& e) {
    why = std::string("ssh: ") + e.what();
    return false;
  }
  spdlog::info("kernel {}: forwarding its ports through ssh to {} (pid {})", k.kernel->id(), l.host, k.tunnel.pid());
  return true;
}

}  // namespace kgate
