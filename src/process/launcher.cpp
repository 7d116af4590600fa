// Remote launchers (launcher.hpp, docs/dev/remote-launchers.md): the scheduler's commands on kgate's side, and
// `kgate node-launch`, the node's side.
#include "kgate/process/launcher.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <netdb.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <zmq.hpp>

#include "kgate/jupyter/connection.hpp"
#include "kgate/process/process.hpp"
#include "kgate/process/supervisor.hpp"

namespace kgate {

const std::vector<std::string>& LauncherConfig::slurm_keys() {
  static const std::vector<std::string> keys = {"partition", "time", "gres", "account", "cpus", "mem"};
  return keys;
}

json launcher_to_json(const LauncherConfig& l) {
  return {{"name", l.name},           {"kind", l.kind_name()},
          {"slurm", l.slurm},         {"sbatch_args", l.sbatch_args},
          {"kgate_path", l.kgate_path.string()}, {"connection_dir", l.connection_dir.string()},
          {"allow_override", l.allow_override},
          {"host", l.host}, {"user", l.user}, {"port", l.port}, {"identity_file", l.identity_file.string()},
          {"ssh_options", l.ssh_options}, {"forward", l.forward}, {"bind_ip", l.bind_ip}};
}

LauncherPtr launcher_from_json(const json& j) {
  try {
    auto l = std::make_shared<LauncherConfig>();
    l->name = j.at("name").get<std::string>();
    const std::string kind = j.at("kind").get<std::string>();
    if (kind == "slurm") l->kind = LauncherConfig::Kind::slurm;
    else if (kind == "ssh") l->kind = LauncherConfig::Kind::ssh;
    else throw std::runtime_error("unknown kind " + kind);
    l->slurm = j.at("slurm").get<std::map<std::string, std::string>>();
    l->sbatch_args = j.at("sbatch_args").get<std::vector<std::string>>();
    l->kgate_path = j.at("kgate_path").get<std::string>();
    l->connection_dir = j.at("connection_dir").get<std::string>();
    l->allow_override = j.at("allow_override").get<std::vector<std::string>>();
    l->host = j.value("host", "");
    l->user = j.value("user", "");
    l->port = j.value("port", 0);
    l->identity_file = j.value("identity_file", "");
    l->ssh_options = j.value("ssh_options", std::vector<std::string>{});
    l->forward = j.value("forward", false);
    l->bind_ip = j.value("bind_ip", std::string("0.0.0.0"));
    return l;
  } catch (const json::exception& e) {
    throw std::runtime_error(std::string("a launcher's entry: ") + e.what());
  }
}

LauncherPtr with_overrides(const LauncherConfig& base, const json& options) {
  auto l = std::make_shared<LauncherConfig>(base);
  if (options.is_null()) return l;
  if (!options.is_object()) throw std::invalid_argument("kgate_launcher_options must be an object");
  for (const auto& [key, value] : options.items()) {
    if (std::find(base.allow_override.begin(), base.allow_override.end(), key) == base.allow_override.end())
      throw std::invalid_argument("kgate_launcher_options." + key + ": launcher " + base.name +
                                  " does not allow overriding it (allow_override lists " +
                                  [&] {
                                    std::string s;
                                    for (const auto& k : base.allow_override) s += (s.empty() ? "" : ", ") + k;
                                    return s.empty() ? std::string("nothing") : s;
                                  }() + ")");
    std::string v;
    if (value.is_string()) v = value.get<std::string>();
    else if (value.is_number_integer()) v = std::to_string(value.get<long long>());
    else throw std::invalid_argument("kgate_launcher_options." + key + ": must be a string or an integer");
    if (v.empty() || v.size() > 256 ||
        !std::all_of(v.begin(), v.end(), [](unsigned char c) { return std::isprint(c) && c != ' '; }))
      throw std::invalid_argument("kgate_launcher_options." + key +
                                  ": must be 1 to 256 printable characters without spaces");
    l->slurm[key] = v;
  }
  return l;
}

namespace {

RunResult run_tool(std::vector<std::string> argv, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  RunOptions o;
  o.env = current_environment();
  argv[0] = find_program(argv[0], o.env);
  o.argv = std::move(argv);
  o.timeout = timeout;
  return run(o);
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  std::size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

// 'it''s' for a POSIX shell.
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string failure(const RunResult& r, const std::string& what) {
  if (!r.started()) return what + ": " + r.spawn_error;
  if (r.timed_out) return what + ": timed out";
  std::string err = trim(r.err_head + r.err_tail);
  if (err.empty()) err = trim(r.out);
  return what + " failed" + (err.empty() ? "" : ": " + err);
}

}  // namespace

LauncherStatus probe_launcher(const LauncherConfig& l) {
  LauncherStatus st;
  if (l.kind == LauncherConfig::Kind::ssh) {
    auto argv = ssh_argv(l);
    argv.insert(argv.end(), {l.host, "--", "test", "-x", shell_quote(l.kgate_path.string())});
    auto r = run_tool(argv, std::chrono::seconds(20));
    if (r.started() && !r.timed_out && r.status == 0) {
      st.usable = true;
    } else if (r.started() && !r.timed_out && WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1) {
      st.reason = "the node launcher " + l.kgate_path.string() + " is not executable on " + l.host;
    } else {
      st.reason = failure(r, "ssh " + l.host);
    }
    return st;
  }
  auto env = current_environment();
  for (const char* tool : {"sbatch", "squeue", "scancel"}) {
    if (find_program(tool, env) == tool) {
      st.reason = std::string(tool) + " not found on PATH";
      return st;
    }
  }
  auto r = run_tool({"squeue", "-h", "-o", "%i", "-j", "0"}, std::chrono::seconds(10));
  // "Invalid job id specified" is an answer: the controller is there.
  std::string err = r.err_head + r.err_tail;
  if (!r.started() || r.timed_out ||
      (r.status != 0 && err.find("Invalid job id") == std::string::npos)) {
    st.reason = failure(r, "squeue");
    return st;
  }
  if (!std::filesystem::exists(l.kgate_path)) {
    st.reason = "the node launcher " + l.kgate_path.string() + " does not exist here";
    return st;
  }
  st.usable = true;
  return st;
}

std::vector<std::string> ssh_argv(const LauncherConfig& l) {
  std::vector<std::string> a = {"ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"};
  if (l.port > 0) a.insert(a.end(), {"-p", std::to_string(l.port)});
  if (!l.identity_file.empty()) a.insert(a.end(), {"-i", l.identity_file.string(), "-o", "IdentitiesOnly=yes"});
  if (!l.user.empty()) a.insert(a.end(), {"-l", l.user});
  for (const auto& o : l.ssh_options) a.insert(a.end(), {"-o", o});
  return a;
}

std::vector<std::string> ssh_launch_argv(const LauncherConfig& l) {
  auto a = ssh_argv(l);
  // The remote side joins these into a shell command line: the path is quoted.
  a.insert(a.end(), {l.host, "--", shell_quote(l.kgate_path.string()), "node-launch", "-"});
  return a;
}

std::vector<std::string> ssh_tunnel_argv(const LauncherConfig& l, const std::vector<int>& local,
                                         const std::vector<int>& remote) {
  auto a = ssh_argv(l);
  // A dead connection is noticed within ~15 s (ServerAlive) and ends ssh: kgate then restarts it.
  a.insert(a.end(), {"-N", "-o", "ExitOnForwardFailure=yes", "-o", "ServerAliveInterval=5", "-o",
                     "ServerAliveCountMax=3"});
  for (std::size_t i = 0; i < local.size() && i < remote.size(); ++i)
    a.insert(a.end(), {"-L", "127.0.0.1:" + std::to_string(local[i]) + ":127.0.0.1:" + std::to_string(remote[i])});
  a.push_back(l.host);
  return a;
}

SshLaunchResult ssh_launch(const LauncherConfig& l, const std::filesystem::path& spec_file) {
  SshLaunchResult res;
  RunOptions o;
  o.env = current_environment();
  o.argv = ssh_launch_argv(l);
  o.argv[0] = find_program(o.argv[0], o.env);
  o.timeout = std::chrono::seconds(60);
  o.stdin_file = spec_file;
  o.exit_grace = std::chrono::seconds(2);
  auto r = run(o);
  std::string out = trim(r.out);
  if (!r.started() || r.timed_out || r.status != 0 || out.empty()) {
    res.error = failure(r, "ssh " + l.host);
    return res;
  }
  res.line = out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
  return res;
}

std::string resolve_ipv4(const std::string& host, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) {
    if (why) *why = "cannot resolve " + host + ": " + ::gai_strerror(rc);
    return {};
  }
  char buf[INET_ADDRSTRLEN] = {0};
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof buf);
  ::freeaddrinfo(res);
  return buf;
}

std::vector<std::string> sbatch_argv(const LauncherConfig& l, const std::string& kernel_id,
                                     const std::filesystem::path& spec_file,
                                     const std::filesystem::path& log_file) {
  std::vector<std::string> a = {"sbatch", "--parsable", "--job-name=kgate-" + kernel_id.substr(0, 8),
                                "--output=" + log_file.string(), "--open-mode=append"};
  static const std::map<std::string, std::string> flag = {
      {"partition", "--partition="}, {"time", "--time="},    {"gres", "--gres="},
      {"account", "--account="},     {"cpus", "--cpus-per-task="}, {"mem", "--mem="}};
  for (const auto& [key, value] : l.slurm)
    if (auto f = flag.find(key); f != flag.end() && !value.empty()) a.push_back(f->second + value);
  a.insert(a.end(), l.sbatch_args.begin(), l.sbatch_args.end());
  // The job: one process, the launcher, exec'd by the batch shell (no shell of our own text but
  // the quoting of two paths).
  a.push_back("--wrap=exec " + shell_quote(l.kgate_path.string()) + " node-launch " + shell_quote(spec_file.string()));
  return a;
}

SubmitResult slurm_submit(const std::vector<std::string>& argv) {
  SubmitResult res;
  auto r = run_tool(argv, std::chrono::seconds(60));
  std::string out = trim(r.out);
  if (!r.started() || r.timed_out || r.status != 0 || out.empty()) {
    res.error = failure(r, "sbatch");
    return res;
  }
  res.job_id = out.substr(0, out.find(';'));  // --parsable: "id" or "id;cluster"
  if (res.job_id.empty() || !std::all_of(res.job_id.begin(), res.job_id.end(), ::isdigit)) {
    res.error = "sbatch answered '" + out.substr(0, 200) + "', not a job id";
    res.job_id.clear();
  }
  return res;
}

std::optional<std::vector<SlurmJobState>> slurm_query(const std::vector<std::string>& job_ids,
                                                     std::string* why) {
  std::vector<SlurmJobState> out;
  if (job_ids.empty()) return out;
  std::string list;
  for (const auto& j : job_ids) list += (list.empty() ? "" : ",") + j;
  // -t all: a job that just ended is still listed (CG, CD, TO, ...) for MinJobAge.
  auto r = run_tool({"squeue", "-h", "-t", "all", "-j", list, "-o", "%i|%T|%r|%N"}, std::chrono::seconds(15));
  std::string err = r.err_head + r.err_tail;
  if (!r.started() || r.timed_out || (r.status != 0 && err.find("Invalid job id") == std::string::npos)) {
    if (why) *why = failure(r, "squeue");
    return std::nullopt;
  }
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    SlurmJobState s;
    std::istringstream f(line);
    std::getline(f, s.job_id, '|');
    std::getline(f, s.state, '|');
    std::getline(f, s.reason, '|');
    std::getline(f, s.node);
    if (!s.job_id.empty()) out.push_back(std::move(s));
  }
  return out;
}

std::string slurm_end_reason(const std::string& job_id) {
  auto r = run_tool({"scontrol", "show", "job", "-o", job_id}, std::chrono::seconds(10));
  if (!r.started() || r.timed_out || r.status != 0) return {};
  auto field = [&](const std::string& name) {
    auto p = r.out.find(" " + name + "=");
    if (p == std::string::npos) return std::string();
    p += name.size() + 2;
    return r.out.substr(p, r.out.find(' ', p) - p);
  };
  std::string state = field("JobState"), reason = field("Reason");
  if (state.empty()) return {};
  return reason.empty() || reason == "None" ? state : state + " (" + reason + ")";
}

std::string slurm_cancel(const std::string& job_id) {
  auto r = run_tool({"scancel", "--full", job_id}, std::chrono::seconds(15));
  if (r.started() && !r.timed_out && r.status == 0) return {};
  return failure(r, "scancel " + job_id);
}

// ---------------------------------------------------------------------------------------
// The node's side

namespace {

void note(const std::string& text) {
  std::fprintf(stderr, "kgate node-launch: %s\n", text.c_str());
  std::fflush(stderr);
}

// The address this host reaches `ip` from: a UDP socket "connected" there sends nothing.
std::string local_ip_towards(const std::string& ip, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) throw std::runtime_error("not an IPv4 address: " + ip);
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("no route to kgate at " + ip);
  }
  sockaddr_in me{};
  socklen_t len = sizeof me;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len);
  ::close(fd);
  char buf[INET_ADDRSTRLEN] = {0};
  ::inet_ntop(AF_INET, &me.sin_addr, buf, sizeof buf);
  return buf;
}

int listen_tcp(const std::string& ip, int& port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 4) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("cannot listen on " + ip);
  }
  port = ntohs(a.sin_port);
  return fd;
}

// Sends the registration and waits for kgate's verdict.
bool register_with_kgate(const json& spec, const json& content, std::chrono::seconds timeout) {
  const std::string secret = spec.at("secret").get<std::string>();
  const std::string address = spec.at("registration").get<std::string>();
  Signer signer(secret);
  zmq::context_t ctx(1);
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.connect(address);
  WireMessage w;
  w.header = make_header(kRegisterType, spec.at("kernel_id").get<std::string>(), "kgate-node").dump();
  w.parent_header = "{}";
  w.metadata = "{}";
  w.content = content.dump();
  auto frames = encode(w, signer);
  for (std::size_t i = 0; i < frames.size(); ++i)
    s.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, std::chrono::duration_cast<std::chrono::milliseconds>(timeout)) <= 0) {
    note("kgate did not answer the registration at " + address + " within " + std::to_string(timeout.count()) + " s");
    return false;
  }
  std::vector<zmq::message_t> parts;
  for (bool more = true; more;) {
    zmq::message_t m;
    if (!s.recv(m, zmq::recv_flags::none)) break;
    more = m.more();
    parts.push_back(std::move(m));
  }
  std::vector<std::string_view> views;
  for (auto& p : parts) views.emplace_back(static_cast<const char*>(p.data()), p.size());
  WireMessage reply;
  if (auto ec = decode(views, signer, reply); ec) {
    note("kgate's answer is not signed with this kernel's secret (" + ec.message() + ")");
    return false;
  }
  json c = json::parse(reply.content, nullptr, false);
  if (c.is_discarded() || c.value("status", "") != "ok") {
    note("kgate refused the registration: " + (c.is_object() ? c.value("reason", std::string("no reason")) : std::string("?")));
    return false;
  }
  return true;
}

// The registration as one line of JSON (the frames of the signed message), for a launcher that
// reports through its SSH channel's stdout instead of a ZMQ connection to kgate.
std::string registration_line(const json& spec, const json& content) {
  Signer signer(spec.at("secret").get<std::string>());
  WireMessage w;
  w.header = make_header(kRegisterType, spec.at("kernel_id").get<std::string>(), "kgate-node").dump();
  w.parent_header = "{}";
  w.metadata = "{}";
  w.content = content.dump();
  return json{{"kgate_register", encode(w, signer)}}.dump();
}

}  // namespace

int node_launch(const std::filesystem::path& spec_file) {
  json spec;
  const bool from_stdin = spec_file == "-";
  try {
    if (from_stdin) {
      spec = json::parse(std::cin);
    } else {
      std::ifstream in(spec_file);
      if (!in) throw std::runtime_error("cannot read " + spec_file.string());
      spec = json::parse(in);
    }
    if (spec.value("format", "") != "kgate-node-launch" || spec.value("version", 0) != 1)
      throw std::runtime_error(spec_file.string() + " is not a version 1 kgate launch spec");
  } catch (const std::exception& e) {
    note(e.what());
    return 2;
  }
  // The secret is for one registration: nobody else reads it from here on.
  std::error_code ec;
  if (!from_stdin) std::filesystem::remove(spec_file, ec);

  try {
    const std::string id = spec.at("kernel_id").get<std::string>();
    if (id.empty() || id.find('/') != std::string::npos) throw std::runtime_error("bad kernel id");
    const std::string reg = spec.at("registration").get<std::string>();  // tcp://ip:port, or "stdout"
    const bool report_stdout = reg == "stdout";
    std::string ip = spec.value("ip", std::string());
    if (ip.empty()) {
      auto colon = reg.rfind(':');
      if (reg.rfind("tcp://", 0) != 0 || colon == std::string::npos) throw std::runtime_error("bad registration address " + reg);
      ip = local_ip_towards(reg.substr(6, colon - 6), std::stoi(reg.substr(colon + 1)));
    }

    ConnectionInfo conn;
    conn.ip = ip;
    conn.key = spec.at("key").get<std::string>();
    conn.signature_scheme = spec.value("signature_scheme", "hmac-sha256");
    conn.kernel_name = spec.value("kernel_name", "");
    std::filesystem::path dir = spec.value("connection_dir", "");
    if (dir.empty()) dir = jupyter_runtime_dir();
    ensure_private_dir(dir);
    const std::filesystem::path file = dir / ("kernel-" + id + ".json");

    int control_port = 0;
    const int tfd = listen_tcp(ip, control_port);

    // Reporting on stdout (SSH): the launcher goes on in the background, in a session of its
    // own, its output in a log beside the connection file; the foreground process prints the
    // registration the background one sends it, and exits, so the SSH command ends.
    int report_fd = -1;
    if (report_stdout) {
      int p[2];
      if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe: " + std::string(std::strerror(errno)));
      const pid_t child = ::fork();
      if (child < 0) throw std::runtime_error("fork: " + std::string(std::strerror(errno)));
      if (child > 0) {
        ::close(p[1]);
        ::close(tfd);
        std::string line;
        char buf[4096];
        for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) != 0;) {
          if (n < 0 && errno == EINTR) continue;
          if (n < 0) break;
          line.append(buf, static_cast<std::size_t>(n));
        }
        if (line.empty()) {
          note("the kernel did not start (see " + (dir / ("kgate-node-" + id + ".log")).string() + ")");
          return 1;
        }
        std::fwrite(line.data(), 1, line.size(), stdout);
        std::fflush(stdout);
        return 0;
      }
      ::close(p[0]);
      report_fd = p[1];
      const std::string log = (dir / ("kgate-node-" + id + ".log")).string();
      int lfd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
      int nul = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (nul >= 0) ::dup2(nul, 0);
      if (lfd >= 0) {
        ::dup2(lfd, 1);
        ::dup2(lfd, 2);
      }
      // supervise() calls setsid(): the SSH session's hangup does not reach it.
    }

    // Bound first: items() of the temporary value() returns would dangle in the loop (ASan).
    const json env = spec.value("env", json::object());
    for (const auto& [name, value] : env.items())
      if (value.is_string()) ::setenv(name.c_str(), value.get<std::string>().c_str(), 1);

    SuperviseOptions so;
    so.control_fd = -1;
    so.orphan_timeout = std::chrono::milliseconds(spec.value("orphan_timeout_ms", 3600000LL));
    so.terminate_grace = std::chrono::milliseconds(spec.value("terminate_grace_ms", 2500LL));
    so.cwd = spec.value("cwd", "");
    for (const auto& a : spec.at("argv")) {
      std::string arg = a.get<std::string>();
      const std::string key = "{connection_file}";
      for (auto pos = arg.find(key); pos != std::string::npos; pos = arg.find(key, pos + file.string().size()))
        arg.replace(pos, key.size(), file.string());
      so.argv.push_back(std::move(arg));
    }
    // The kernel, started here: its ports are picked by binding and closing them, so another
    // process on this host (twenty jobs starting at once) can take one in between.  ipykernel
    // then exits (EADDRINUSE), except on its heartbeat port: that thread dies alone and the
    // kernel runs on, never ready.  So it is registered only once its own session listens on
    // all five (session_tcp_listeners); one that exits first, or one of whose ports another
    // process listens on, is started again on fresh ports, three times at most.
    ::setenv("JPY_PARENT_PID", std::to_string(::getpid()).c_str(), 1);  // ipykernel's parent poller watches us
    LaunchOptions lo;
    lo.argv = so.argv;
    lo.cwd = so.cwd;
    lo.die_with_parent = true;
    ChildProcess kernel;
    const std::string probe_ip = ip == "0.0.0.0" ? "127.0.0.1" : ip;
    for (int attempt = 1;; ++attempt) {
      auto ports = pick_ports(ip, 5);
      conn.shell_port = ports[0];
      conn.iopub_port = ports[1];
      conn.stdin_port = ports[2];
      conn.control_port = ports[3];
      conn.hb_port = ports[4];
      write_connection_file(file, conn);
      lo.env = current_environment();
      kernel = ChildProcess::launch(lo);  // throws when it cannot be started at all
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      bool exited = false;
      int taken = 0;       // a port another process listens on, seen in two reads in a row
      int seen_before = 0;  // the one the last read saw: looked at again 20 ms later before the kill
      std::size_t listening = 0;
      while (std::chrono::steady_clock::now() < until) {
        if (kernel.try_reap()) {
          exited = true;
          break;
        }
        // Read from /proc, not probed: a connection to a port another process listens on but
        // does not accept from would hang the probe.
        const TcpListeners l = session_tcp_listeners(static_cast<int>(kernel.pid()));
        listening = 0;
        int others = 0;
        for (int p : ports) {
          if (l.own.count(p)) ++listening;
          else if (l.others.count(p)) others = p;
        }
        if (others && others == seen_before) taken = others;
        seen_before = others;
        if (!l.readable) {  // no /proc/net/tcp: whether something accepts on each, as before
          listening = 0;
          for (int p : ports) listening += tcp_accepts(probe_ip, p) ? 1 : 0;
        }
        if (listening == ports.size() || taken) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (!exited && !taken) {
        if (listening < ports.size()) note("the kernel does not listen on all its ports after 60 s; registering it anyway");
        break;
      }
      std::string why;
      if (taken) {
        why = "port " + std::to_string(taken) + " was taken by another process before the kernel bound it";
        kernel.signal_group(SIGKILL);
        kernel.wait_for_exit(5000);
      } else {
        why = "the kernel " + kernel.describe_exit() + " during startup (a port taken meanwhile?)";
      }
      if (attempt == 3) throw std::runtime_error(why + ", 3 times");
      note(why + "; again on fresh ports");
    }
    so.prelaunched = &kernel;
    so.tcp_listen_fd = tfd;
    so.auth_key = conn.key;
    so.kernel_id = id;
    so.on_started = [&](int pid, unsigned long long start_time) {
      char host[256] = {0};
      ::gethostname(host, sizeof host - 1);
      const char* job = std::getenv("SLURM_JOB_ID");
      json content = {{"kernel_id", id},
                      {"attempt", spec.value("attempt", 0)},
                      {"ip", ip},
                      {"transport", "tcp"},
                      {"shell_port", conn.shell_port},
                      {"iopub_port", conn.iopub_port},
                      {"stdin_port", conn.stdin_port},
                      {"control_port", conn.control_port},
                      {"hb_port", conn.hb_port},
                      {"control_link_port", control_port},
                      {"pid", pid},
                      {"start_time", start_time},
                      {"hostname", host},
                      {"connection_file", file.string()},
                      {"slurm_job_id", job ? job : ""}};
      if (report_fd >= 0) {
        note("kernel " + id + " started (pid " + std::to_string(pid) + ") on " + ip + "; reporting on stdout");
        std::string line = registration_line(spec, content) + "\n";
        const bool ok = ::write(report_fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
        ::close(report_fd);
        report_fd = -1;
        return ok;
      }
      note("kernel " + id + " started (pid " + std::to_string(pid) + ") on " + ip + "; registering with " + reg);
      return register_with_kgate(spec, content, std::chrono::seconds(30));
    };
    int rc = supervise(so);
    if (report_fd >= 0) ::close(report_fd);  // it never started: the foreground says so
    std::filesystem::remove(file, ec);
    return rc;
  } catch (const std::exception& e) {
    note(e.what());
    return 1;
  }
}

}  // namespace kgate
