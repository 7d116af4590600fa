#!/usr/bin/python3
"""Side-by-side benchmark: the raw ZMQ floor vs jupyter_server (the peer) vs kgate.

usage: bench/run.sh [-h]            (run via run.sh; it calls this file with /usr/bin/python3)

Environment:
  KGATE_BIN      kgate binary           (default <repo>/build/gateway/kgate)
  BENCH_N        execute round trips    (default 200)
  BENCH_MB       flood size, megabytes  (default 20)
  BENCH_ROUNDS   alternating flood rounds with the client's UTF-8 check off, each gateway's
                 flood read both by websocket-client's frame reader and with a frame read
                 whole; medians reported (default 5)
  BENCH_PRINTS   small prints in the per-message run (default 100000; 0 skips it)
  BENCH_REPS     latency repetitions, interleaved direct/peer/kgate, each followed by one
                 `wsclient.py interleaved` run per gateway and one `wsclient.py relayed` run
                 (bench/relay.py, a relay that does nothing) (default 2)
  BENCH_PAIRS    kernel pairs in each interleaved run (default 4)
  BENCH_COLD     kgate cold starts, median reported (default 5)
  BENCH_PEER_COLD  jupyter_server cold starts, median reported (default 3, at least 2)
  BENCH_TCP=0    skip the second kgate whose kernels are on tcp ([kernel] transport = "tcp"),
                 measured beside the first (kernels on ipc, the default) in the same run
  BENCH_BUDGET   total time budget, seconds (default 900)
  BENCH_OUT      results JSON           (default bench/results/latest.json)
  BENCH_KEEP_TMP=1  keep the temp dir (server logs) for inspection

The round trips and floods are run by bench/wsclient.py (this project's client), one subprocess
per measurement. Every default path is relative to this checkout.

Every server, benchmark client and kernel this script starts is stopped on exit, error,
Ctrl-C or SIGTERM: each runs in its own session (process group); before a group is killed
its descendants are collected, and a final sweep kills anything whose command line names
this run's private temp dir (every kernel's connection file lives there).
"""
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"
_REPO = os.path.dirname(HERE)
CLIENT = os.path.join(HERE, "wsclient.py")   # the round-trip and flood clients
KGATE_BIN = os.path.abspath(os.environ.get("KGATE_BIN", os.path.join(_REPO, "build", "gateway", "kgate")))
N = int(os.environ.get("BENCH_N", "200"))
MB = int(os.environ.get("BENCH_MB", "20"))
# How long one flood client may take: 150 s for the 20 MB default, less for a small flood, so a
# peer that hangs on one (jupyter_server did, once, under a loaded sanitizer run) costs seconds of
# the budget, not all of it.
FLOOD_WANT = min(150, 30 + 6 * MB)
REPS = max(1, int(os.environ.get("BENCH_REPS", "2")))
PAIRS = max(1, min(N, int(os.environ.get("BENCH_PAIRS", "4"))))
COLD = max(1, int(os.environ.get("BENCH_COLD", "5")))
PEER_COLD = max(2, int(os.environ.get("BENCH_PEER_COLD", "3")))
ROUNDS = max(1, int(os.environ.get("BENCH_ROUNDS", "5")))
PRINTS = max(0, int(os.environ.get("BENCH_PRINTS", "100000")))
BUDGET = float(os.environ.get("BENCH_BUDGET", "900"))
OUT = os.environ.get("BENCH_OUT", os.path.join(HERE, "results", "latest.json"))
KEEP_TMP = os.environ.get("BENCH_KEEP_TMP") == "1"
TCP_SIDE = os.environ.get("BENCH_TCP", "1") != "0"

T_START = time.monotonic()
POLL = 0.005            # cold-start poll interval (5 ms)
START_TIMEOUT = 30.0    # a server that has not answered GET /api by then failed to start


def logger(name, t0):
    """A bench script's log: a line on stderr, "[name seconds-since-t0] ..."."""
    def log_fn(*a):
        print("[%s %6.1fs]" % (name, time.monotonic() - t0), *a, file=sys.stderr, flush=True)
    return log_fn


log = logger("bench", T_START)


def remaining():
    return BUDGET - (time.monotonic() - T_START)


class StepError(Exception):
    pass


def error_text(e):
    """What a failed step says: a StepError's own message, else the exception's type and text."""
    return str(e) if isinstance(e, StepError) else "%s: %s" % (type(e).__name__, e)


def run_step(name, errors, log_fn, fn, *a):
    """fn(*a), or None when it fails: the failure is logged and added to `errors` as
    {"step": name, "error": ...}, and the run goes on.  Ctrl-C is not caught."""
    try:
        return fn(*a)
    except KeyboardInterrupt:
        raise
    except Exception as e:
        msg = error_text(e)
        log_fn("FAILED %s: %s" % (name, msg))
        errors.append({"step": name, "error": msg})
        return None


class OutOfTime(StepError):
    pass


def budget(want):
    """A timeout for the next step: `want` seconds, cut to what the total budget leaves."""
    left = remaining()
    if left < 5:
        raise OutOfTime("skipped: total time budget (BENCH_BUDGET=%gs) used up" % BUDGET)
    return min(want, left)


# ---------------------------------------------------------------- processes

def _proc_table():
    """pid -> (ppid, starttime) for every visible process."""
    table = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                s = f.read()
        except OSError:
            continue
        rest = s[s.rfind(")") + 2:].split()
        table[int(d)] = (int(rest[1]), rest[19])   # ppid, starttime (fields 4 and 22)
    return table


def descendants(pid):
    """[(pid, starttime)] of every live descendant of pid (children, grandchildren, ...)."""
    table = _proc_table()
    kids = {}
    for p, (pp, _) in table.items():
        kids.setdefault(pp, []).append(p)
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append((c, table[c][1]))
            todo.append(c)
    return out


def _same_process(pid, starttime):
    try:
        with open("/proc/%d/stat" % pid) as f:
            s = f.read()
    except OSError:
        return False
    return s[s.rfind(")") + 2:].split()[19] == starttime


def kill_tree(popen, grace=5.0):
    """Stop popen's process group (SIGTERM, then SIGKILL after `grace` s) and every descendant,
    including kernels that moved to process groups of their own."""
    if popen is None:
        return
    kids = descendants(popen.pid) if popen.poll() is None else []
    if popen.poll() is None:
        try:
            os.killpg(popen.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(popen.pid, signal.SIGKILL)   # leftovers in the group, or the leader itself
    except (ProcessLookupError, PermissionError):
        pass
    try:
        popen.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    # descendants the server did not shut down itself (kernels sit in their own sessions)
    deadline = time.monotonic() + 2.0
    while True:
        alive = [(p, st) for p, st in kids if _same_process(p, st)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for p, st in alive:
        if _same_process(p, st):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def sweep(marker):
    """Kill every process of ours whose command line contains marker (this run's temp dir)."""
    me = os.getpid()
    killed = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            try:
                os.kill(int(d), signal.SIGKILL)
                killed.append((int(d), cmd.strip()[:120]))
            except ProcessLookupError:
                pass
    return killed


def rss_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024.0, 1)
    raise StepError("no VmRSS for pid %d" % pid)


def cpu_s(pid):
    """utime + stime of one process (not its children), seconds."""
    with open("/proc/%d/stat" % pid) as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def stop_all(servers, tmp, R, keep_tmp, log_fn=None):
    """Stops every server, sweeps leftover processes of this run (marked by `tmp`), records them in
    R["meta"], then removes `tmp` unless `keep_tmp`.  For the other bench scripts' teardown."""
    log_fn = log_fn or log
    for s in list(servers):
        try:
            s.stop()
        except Exception as e:
            log_fn("stopping %s: %s" % (s.label, e))
    killed = sweep(tmp)
    if killed:
        log_fn("swept %d leftover process(es): %s" % (len(killed), killed))
        R["meta"]["swept_leftovers"] = killed
    if keep_tmp:
        log_fn("temp dir kept: %s" % tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path, n=25):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


# ---------------------------------------------------------------- servers

class Server:
    """One gateway process (jupyter_server or kgate) with its own dirs, port and token."""

    def __init__(self, kind, tmp, label, extra_args=()):
        self.kind, self.label = kind, label
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.root = tempfile.mkdtemp(prefix=label + "-", dir=tmp)
        self.log_path = os.path.join(self.root, "server.log")
        self.env = private_env(self.root)
        if kind == "peer":
            self.argv = [PY, "-m", "jupyter_server", "--allow-root", "--no-browser",
                         "--port=%d" % self.port, "--ServerApp.port_retries=0",
                         "--ServerApp.token=" + self.token, "--ServerApp.password=",
                         "--ServerApp.disable_check_xsrf=True", *extra_args]
        else:
            self.argv = [KGATE_BIN, "serve", "--ip", "127.0.0.1", "--port", str(self.port),
                         "--token", self.token, *extra_args]
        self.proc = None
        self.cold_start_ms = None

    def start(self):
        """Spawn and poll GET /api every 5 ms; cold start = spawn -> first 200."""
        logf = open(self.log_path, "wb")
        req = urllib.request.Request(self.url + "/api", headers={"Authorization": "token " + self.token})
        t0 = time.perf_counter()
        try:
            self.proc = subprocess.Popen(self.argv, cwd=self.root, env=self.env, stdin=subprocess.DEVNULL,
                                         stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            logf.close()
            raise StepError("%s: cannot spawn %s: %s" % (self.label, self.argv[0], e))
        finally:
            logf.close()
        last = None
        while True:
            try:
                with urllib.request.urlopen(req, timeout=2) as r:
                    if r.status == 200:
                        r.read()
                        self.cold_start_ms = (time.perf_counter() - t0) * 1e3
                        return self.cold_start_ms
                    last = "HTTP %d" % r.status
            except urllib.error.HTTPError as e:
                last = "HTTP %d" % e.code
            except (urllib.error.URLError, OSError) as e:
                last = str(getattr(e, "reason", e))
            if self.proc.poll() is not None:
                raise StepError("%s exited with status %s before answering GET /api (last: %s); log tail:\n%s"
                                % (self.label, self.proc.returncode, last, tail(self.log_path)))
            if time.perf_counter() - t0 > START_TIMEOUT:
                raise StepError("%s: no 200 on GET %s/api within %gs (last: %s); log tail:\n%s"
                                % (self.label, self.url, START_TIMEOUT, last, tail(self.log_path)))
            time.sleep(POLL)

    def rest(self, method, path, body=None, timeout=30):
        req = urllib.request.Request(self.url + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": "token " + self.token,
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            data = r.read()
            return json.loads(data) if data else None

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:  # polite first: leave no kernels behind
                for k in self.rest("GET", "/api/kernels", timeout=5) or []:
                    try:
                        self.rest("DELETE", "/api/kernels/" + k["id"], timeout=10)
                    except Exception as e:
                        log("%s: DELETE kernel %s failed: %s" % (self.label, k.get("id"), e))
            except Exception as e:
                log("%s: GET /api/kernels failed at stop: %s" % (self.label, e))
        kill_tree(self.proc)
        self.proc = None


def private_env(root):
    env = dict(os.environ)
    for var, sub in (("JUPYTER_RUNTIME_DIR", "runtime"), ("JUPYTER_CONFIG_DIR", "config"),
                     ("JUPYTER_DATA_DIR", "data")):
        env[var] = os.path.join(root, sub)
        os.makedirs(env[var], exist_ok=True)
    env["XDG_STATE_HOME"] = os.path.join(root, "state")   # one kgate per state directory
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    env["JUPYTER_NO_CONFIG"] = "1"
    # ... which makes jupyter_core leave a jupyter-clean-cfg-* dir in $TMPDIR at every lookup
    env["TMPDIR"] = os.path.join(root, "tmp")
    os.makedirs(env["TMPDIR"], exist_ok=True)
    env.pop("JUPYTER_PATH", None)
    env.pop("JUPYTER_CONFIG_PATH", None)
    return env


def execute_request(code):
    """(msg_id, text) of a websocket execute_request for `code` (legacy JSON frame)."""
    msg_id = uuid.uuid4().hex
    return msg_id, json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "bench",
                   "session": uuid.uuid4().hex, "date": "", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True}})


def open_channels(server, kid, timeout=60):
    """A websocket on kernel kid's channels through `server` (kgate answers a starting kernel's
    channel once it is ready)."""
    import websocket
    return websocket.create_connection(
        server.url.replace("http", "ws", 1) + "/api/kernels/%s/channels" % kid,
        header=["Authorization: token " + server.token], timeout=timeout)


def ws_run(ws, code, what="kernel"):
    """stdout of `code` run over the open channels websocket `ws`: its execute_reply (a status
    other than ok is a StepError naming `what`) and the idle status it caused both arrived."""
    msg_id, request = execute_request(code)
    ws.send(request)
    out, replied, idle = "", False, False
    while not (replied and idle):
        m = json.loads(ws.recv())
        if m.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        t = m.get("msg_type")
        if t == "stream":
            out += m["content"]["text"]
        elif t == "execute_reply":
            if m["content"]["status"] != "ok":
                raise StepError("%s: %s" % (what, m["content"]))
            replied = True
        elif t == "status" and m["content"]["execution_state"] == "idle":
            idle = True
    return out


def kernel_rss(server):
    """(rss MB with no kernels, rss MB with one idle kernel) of the server process itself."""
    import websocket
    time.sleep(0.5)
    idle = rss_mb(server.proc.pid)
    k = server.rest("POST", "/api/kernels", {"name": "python3"}, timeout=budget(60))
    kid = k["id"]
    try:
        ws = websocket.create_connection(server.url.replace("http", "ws", 1) + "/api/kernels/%s/channels" % kid,
                                         header=["Authorization: token " + server.token], timeout=budget(60))
        try:
            # a kernel_info round trip proves the kernel is up and idle
            deadline = time.monotonic() + 60
            while True:
                mid = uuid.uuid4().hex
                ws.send(json.dumps({"header": {"msg_id": mid, "msg_type": "kernel_info_request", "session": mid,
                                               "username": "bench", "version": "5.3", "date": ""},
                                    "parent_header": {}, "metadata": {}, "content": {}, "channel": "shell"}))
                ws.settimeout(5)
                try:
                    while True:
                        m = json.loads(ws.recv())
                        if m.get("msg_type") == "kernel_info_reply" and m.get("parent_header", {}).get("msg_id") == mid:
                            break
                    break
                except websocket.WebSocketTimeoutException:
                    if time.monotonic() > deadline:
                        raise StepError("%s: no kernel_info_reply within 60 s" % server.label)
        finally:
            ws.close()
        time.sleep(1.0)
        one = rss_mb(server.proc.pid)
    finally:
        try:
            server.rest("DELETE", "/api/kernels/" + kid, timeout=30)
        except Exception as e:
            log("%s: DELETE kernel %s failed: %s" % (server.label, kid, e))
    return idle, one


# ---------------------------------------------------------------- the clients

def run_client(env, cwd, args, want_timeout, watch=None):
    """Run bench/wsclient.py with `args` (e.g. ["gateway", url, token, N]), return its JSON lines
    merged into one dict (plus, with watch=a Server, "gateway_cpu_s": that server process's own
    CPU seconds over the run)."""
    timeout = budget(want_timeout)
    cpu0 = cpu_s(watch.proc.pid) if watch else None
    cmd = [PY, CLIENT, *map(str, args)]
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(p, grace=2)   # SIGTERM first: a flood or prints client prints how far it got
        why = "client %s: timed out after %.0fs" % (" ".join(map(str, args[:1])), timeout)
        try:
            late, _ = p.communicate(timeout=5)
        except (subprocess.TimeoutExpired, ValueError, OSError):
            late = ""
        for line in (late or "").splitlines():
            try:
                part = json.loads(line) if line.strip().startswith("{") else None
            except ValueError:
                part = None
            if part and part.get("incomplete"):
                why += ("; what had arrived by then: stream messages %s, bytes %s, reply %s, idle %s"
                        % ("{:,}".format(part.get("received_messages", 0)), "{:,}".format(part.get("received_bytes", 0)),
                           "yes" if part.get("replied") else "no", "yes" if part.get("idle") else "no"))
        if watch and watch.proc and watch.proc.poll() is None:
            why += "; the server used %.1f s of CPU" % (cpu_s(watch.proc.pid) - cpu0)
        raise StepError(why)
    finally:
        if p.poll() is None:
            kill_tree(p, grace=2)
    res = {}
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                res.update(json.loads(line))
            except ValueError:
                pass
    if p.returncode != 0 or not res:
        raise StepError("client %s exited %s; stderr tail:\n%s" % (args[0], p.returncode,
                                                                   "\n".join(err.strip().splitlines()[-15:])))
    if watch:
        if watch.proc.poll() is not None:
            raise StepError("%s exited with status %s during client %s; log tail:\n%s"
                            % (watch.label, watch.proc.returncode, args[0], tail(watch.log_path)))
        res["gateway_cpu_s"] = round(cpu_s(watch.proc.pid) - cpu0, 3)
    return res


# ---------------------------------------------------------------- the run

def interrupt_on_stop_signals():
    """SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread, so a bench run cleans up
    (its `finally`) for them as for ^C."""
    def on_signal(signum, frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)


def print_usage(doc, arg):
    """A bench script's answer to any argument: its docstring; exit status 0 for -h/--help, else 2."""
    print(doc.strip())
    return 0 if arg in ("-h", "--help") else 2


def main():
    if len(sys.argv) > 1:
        return print_usage(__doc__, sys.argv[1])
    interrupt_on_stop_signals()

    for f in (CLIENT, PY):
        if not os.path.exists(f):
            print("bench: missing %s" % f, file=sys.stderr)
            return 2
    have_kgate = os.access(KGATE_BIN, os.X_OK)

    tmp = tempfile.mkdtemp(prefix="kgate-bench-")
    bench_env = private_env(os.path.join(tmp, "client"))
    R = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(),
                  "cpus": os.cpu_count(), "kernel": platform.release(), "N": N, "MB": MB, "reps": REPS, "pairs": PAIRS, "rounds": ROUNDS, "prints": PRINTS,
                  "kgate_cold_starts": COLD, "peer_cold_starts": PEER_COLD, "kgate_bin": KGATE_BIN,
                  "client": os.path.relpath(CLIENT, _REPO), "versions": versions(),
                  "kgate_mtime": (time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(os.path.getmtime(KGATE_BIN)))
                                  if have_kgate else None)},
         "direct": {"latency": [], "flood_rounds": []}, "relay": {"interleaved": []},
         "peer": {"latency": [], "interleaved": [], "cold_start_ms": [], "flood_rounds": [], "flood_rounds_whole": []},
         "kgate": {"latency": [], "interleaved": [], "cold_start_ms": [], "flood_rounds": [], "flood_rounds_whole": []},
         "kgate_tcp": {"latency": [], "interleaved": [], "cold_start_ms": [], "flood_rounds": [], "flood_rounds_whole": []},
         "errors": []}
    live = []          # servers to stop in the end
    interrupted = False

    def step(name, fn, *a):
        return run_step(name, R["errors"], log, fn, *a)

    def start(kind, label, extra=()):
        budget(START_TIMEOUT)  # no new server once the time budget is (nearly) used up
        s = Server(kind, tmp, label, extra)
        live.append(s)
        log("starting %s on %s" % (label, s.url))
        ms = s.start()
        log("%s answered GET /api after %.1f ms" % (label, ms))
        return s

    def stop(s):
        if s is not None:
            s.stop()
            if s in live:
                live.remove(s)

    try:
        unlimited = ("--ServerApp.iopub_data_rate_limit=0", "--ServerApp.iopub_msg_rate_limit=0")
        # 1. the peer: extra throwaway cold starts first, then the one (defaults) we keep
        for i in range(PEER_COLD - 2):
            s = step("peer cold start %d" % (i + 1), start, "peer", "peer-cold%d" % i)
            if s:
                R["peer"]["cold_start_ms"].append(round(s.cold_start_ms, 1))
            stop(s)
        peer = step("peer start (defaults)", start, "peer", "peer-defaults")
        if peer:
            R["peer"]["cold_start_ms"].append(round(peer.cold_start_ms, 1))
            r = step("peer RSS", kernel_rss, peer)
            if r:
                R["peer"]["rss_idle_mb"], R["peer"]["rss_one_kernel_mb"] = r

        # 2. kgate: COLD cold starts, keep the last one running
        kg = None
        if not have_kgate:
            R["errors"].append({"step": "kgate", "error": "%s is missing or not executable" % KGATE_BIN})
        else:
            for i in range(COLD):
                s = step("kgate cold start %d" % (i + 1), start, "kgate", "kgate-%d" % i)
                if s:
                    R["kgate"]["cold_start_ms"].append(round(s.cold_start_ms, 1))
                if i < COLD - 1:
                    stop(s)
                else:
                    kg = s
            if kg:
                r = step("kgate RSS", kernel_rss, kg)
                if r:
                    R["kgate"]["rss_idle_mb"], R["kgate"]["rss_one_kernel_mb"] = r
        # 2b. the same kgate with its kernels on tcp, the transport before ipc became the default
        kg_tcp = None
        if have_kgate and TCP_SIDE:
            conf = os.path.join(tmp, "kgate-tcp.toml")
            with open(conf, "w") as f:
                f.write('[kernel]\ntransport = "tcp"\n')
            kg_tcp = step("kgate start (kernels on tcp)", start, "kgate", "kgate-tcp", ("--config", conf))

        # 3. execute round trips, interleaved so drift hits all three alike
        for rep in range(REPS):
            log("latency rep %d/%d: direct" % (rep + 1, REPS))
            r = step("direct latency", run_client, bench_env, tmp, ["direct", N], 120)
            if r:
                R["direct"]["latency"].append(r)
            if peer:
                log("latency rep %d/%d: jupyter_server" % (rep + 1, REPS))
                r = step("peer latency", run_client, bench_env, tmp, ["gateway", peer.url, peer.token, N], 120, peer)
                if r:
                    R["peer"]["latency"].append(r)
            for side, srv in (("kgate", kg), ("kgate_tcp", kg_tcp)):
                if srv:
                    log("latency rep %d/%d: %s" % (rep + 1, REPS, srv.label))
                    r = step("%s latency" % side, run_client, bench_env, tmp, ["gateway", srv.url, srv.token, N], 120, srv)
                    if r:
                        R[side]["latency"].append(r)
            # the same round trips, request by request in turn with a direct client of a kernel of
            # its own, over BENCH_PAIRS pairs of kernels: no drift between the two sides
            for side, srv in (("peer", peer), ("kgate", kg), ("kgate_tcp", kg_tcp)):
                if srv:
                    log("interleaved rep %d/%d: %s and direct ZMQ, %d pairs of kernels" % (rep + 1, REPS, srv.label, PAIRS))
                    r = step("%s interleaved" % side, run_client, bench_env, tmp,
                             ["interleaved", srv.url, srv.token, N, "--pairs", PAIRS], 240, srv)
                    if r:
                        R[side]["interleaved"].append(r)
            # the floor of any gateway process: a relay that does nothing (bench/relay.py), the same way
            log("interleaved rep %d/%d: a relay that does nothing and direct ZMQ, %d pairs of kernels" % (rep + 1, REPS, PAIRS))
            r = step("relay interleaved", run_client, bench_env, tmp, ["relayed", N, "--pairs", PAIRS], 240)
            if r:
                R["relay"]["interleaved"].append(r)

        # 4. floods
        log("flood %d MB: direct" % MB)
        R["direct"]["flood"] = step("direct flood", run_client, bench_env, tmp, ["direct-flood", MB], FLOOD_WANT)
        if peer:
            log("flood %d MB: jupyter_server (default rate limits)" % MB)
            R["peer"]["flood_default"] = step("peer flood (defaults)", run_client, bench_env, tmp,
                                              ["flood", peer.url, peer.token, MB], FLOOD_WANT, peer)
            stop(peer)
            peer = None
        peer2 = step("peer start (unlimited)", start, "peer", "peer-unlimited", unlimited)
        if peer2:
            R["peer"]["cold_start_ms"].append(round(peer2.cold_start_ms, 1))
            log("flood %d MB: jupyter_server (rate limits lifted)" % MB)
            R["peer"]["flood_unlimited"] = step("peer flood (unlimited)", run_client, bench_env, tmp,
                                                ["flood", peer2.url, peer2.token, MB], FLOOD_WANT, peer2)
        if kg:
            log("flood %d MB: kgate" % MB)
            R["kgate"]["flood"] = step("kgate flood", run_client, bench_env, tmp, ["flood", kg.url, kg.token, MB], FLOOD_WANT, kg)
        # 5. the same flood with the client's UTF-8 check off, in alternating rounds (direct, peer,
        # kgate) so drift hits all three alike; each one's median is reported. Each gateway has
        # it twice a round, read by websocket-client's own frame reader and with a frame read
        # whole (--whole-frames), the two taking turns at going first.
        for rnd in range(ROUNDS):
            log("flood %d MB, client UTF-8 check off: round %d/%d" % (MB, rnd + 1, ROUNDS))
            r = step("direct flood (round %d)" % (rnd + 1), run_client, bench_env, tmp, ["direct-flood", MB], FLOOD_WANT)
            if r:
                R["direct"]["flood_rounds"].append(r)
            readers = (("flood_rounds", []), ("flood_rounds_whole", ["--whole-frames"]))
            for side, server in (("peer", peer2), ("kgate", kg), ("kgate_tcp", kg_tcp)):
                if not server:
                    continue
                for key, extra in (readers if rnd % 2 == 0 else readers[::-1]):
                    what = "whole frames" if extra else "UTF-8 check off"
                    r = step("%s flood (%s, round %d)" % (side, what, rnd + 1), run_client, bench_env, tmp,
                             ["flood", server.url, server.token, MB, "--no-utf8-check", *extra], FLOOD_WANT, server)
                    if r:
                        R[side][key].append(r)
                        if extra and r.get("reader") != "whole":   # this websocket-client lacks the reader
                            R["errors"].append({"step": "%s flood (whole frames)" % side,
                                                "error": "wsclient.py fell back to websocket-client's own frame reader"})
        # 6. many small messages: PRINTS prints, one stream message each
        if PRINTS:
            log("%d small prints: direct" % PRINTS)
            R["direct"]["prints"] = step("direct prints", run_client, bench_env, tmp, ["direct-prints", PRINTS], 300)
            if peer2:
                log("%d small prints: jupyter_server (rate limits lifted)" % PRINTS)
                R["peer"]["prints"] = step("peer prints", run_client, bench_env, tmp,
                                           ["prints", peer2.url, peer2.token, PRINTS, "--no-utf8-check"], 300, peer2)
            for side, srv in (("kgate", kg), ("kgate_tcp", kg_tcp)):
                if srv:
                    log("%d small prints: %s" % (PRINTS, srv.label))
                    R[side]["prints"] = step("%s prints" % side, run_client, bench_env, tmp,
                                             ["prints", srv.url, srv.token, PRINTS, "--no-utf8-check"], 300, srv)
        if peer2:
            stop(peer2)
        if kg_tcp:
            stop(kg_tcp)
        if kg:
            if kg.proc.poll() is not None:
                R["errors"].append({"step": "kgate", "error": "kgate exited with status %s during the run; log tail:\n%s"
                                    % (kg.proc.returncode, tail(kg.log_path))})
    except KeyboardInterrupt as e:
        interrupted = True
        log("interrupted (%s): stopping everything" % (str(e) or "Ctrl-C"))
    finally:
        stop_all(live, tmp, R, KEEP_TMP)

    R["meta"]["seconds"] = round(time.monotonic() - T_START, 1)
    R["summary"] = summarize(R)
    out = OUT
    if interrupted:  # keep the last complete run's figures; partial ones go beside them
        out = os.path.join(os.path.dirname(OUT), "interrupted.json")
        R["meta"]["interrupted"] = True
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".tmp", "w") as f:
        json.dump(R, f, indent=2)
    os.replace(out + ".tmp", out)
    print_table(R)
    print("\nraw results: %s   (total %.0f s)" % (os.path.relpath(out), R["meta"]["seconds"]))
    if R["errors"]:
        print("\nerrors:")
        for e in R["errors"]:
            print("  - %s: %s" % (e["step"], e["error"].replace("\n", "\n      ")))
    if interrupted:
        return 130
    return 1 if R["errors"] else 0


def finish(R, out, interrupted):
    """The end of a bench/*.py run (discovery, mcp, records): the raw JSON at `out` (not when
    interrupted), the totals line and R["errors"]. Returns the exit status: 130, 1 or 0."""
    if not interrupted:
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out + ".tmp", "w") as f:
            json.dump(R, f, indent=1)
        os.replace(out + ".tmp", out)
        print("\nraw results: %s" % os.path.relpath(out))
    print("total %.0f s; load average %s at start, %s at end"
          % (R["meta"]["seconds"], " ".join(R["meta"]["loadavg_start"]), " ".join(R["meta"]["loadavg_end"])))
    if R["errors"]:
        print("\nerrors:")
        for e in R["errors"]:
            print("  - %s: %s" % (e["step"], e["error"].replace("\n", "\n      ")))
    if interrupted:
        return 130
    return 1 if R["errors"] else 0


def versions():
    from importlib import metadata
    out = {"python": platform.python_version()}
    for pkg in ("jupyter_server", "jupyter_client", "ipykernel", "pyzmq", "websocket-client", "tornado"):
        try:
            out[pkg] = metadata.version(pkg)
        except Exception:
            out[pkg] = None
    return out


# ---------------------------------------------------------------- summary

def _mid(runs, key):
    """Median across repetitions of one client statistic (the mean when there are two)."""
    vals = [r[key] for r in runs if r and key in r]
    return round(statistics.median(vals)) if vals else None


def _ratio(runs):
    """Median across repetitions of an interleaved run's gateway/direct ratio."""
    vals = [r["ratio"] for r in runs if r and "ratio" in r]
    return round(statistics.median(vals), 3) if vals else None


def summarize(R):
    d, p, k, t = R["direct"], R["peer"], R["kgate"], R.get("kgate_tcp", {})
    df, pd, pu, kf = (d.get("flood") or {}), (p.get("flood_default") or {}), (p.get("flood_unlimited") or {}), (k.get("flood") or {})
    med = lambda xs: round(statistics.median(xs), 1) if xs else None
    cpu_lat = lambda runs: (round(statistics.median([r["gateway_cpu_s"] for r in runs if "gateway_cpu_s" in r]) * 1e3)
                            if any("gateway_cpu_s" in r for r in runs) else None)
    cpu_ms = lambda r: round(r["gateway_cpu_s"] * 1e3) if "gateway_cpu_s" in r else None
    pr = lambda side: side.get("prints") or {}
    # the gateway's CPU divided by the prints the kernel made (one stream message each)
    per_msg_us = lambda r: round(r["gateway_cpu_s"] * 1e6 / r["count"], 1) if "gateway_cpu_s" in r and r.get("count") else None
    # ... and by the stream messages that reached the client (a server that drops some looks cheaper
    # per print than it is per message it delivered)
    per_got_us = lambda r: (round(r["gateway_cpu_s"] * 1e6 / r["received_messages"], 1)
                            if "gateway_cpu_s" in r and r.get("received_messages") else None)

    def rmed(side, key, scale=1, rounds="flood_rounds"):  # the median over the alternating flood rounds
        vals = [r[key] * scale for r in side.get(rounds, []) if r and key in r]
        return (round(statistics.median(vals), 3) if scale == 1 else round(statistics.median(vals))) if vals else None

    def rmin(side, key, rounds="flood_rounds"):
        vals = [r[key] for r in side.get(rounds, []) if r and key in r]
        return min(vals) if vals else None
    W = "flood_rounds_whole"
    rows = [  # (metric, format, direct, peer, kgate)
        ("execute round trip, median (µs)", "int", _mid(d["latency"], "median_us"), _mid(p["latency"], "median_us"), _mid(k["latency"], "median_us")),
        ("execute round trip, p90 (µs)", "int", _mid(d["latency"], "p90_us"), _mid(p["latency"], "p90_us"), _mid(k["latency"], "p90_us")),
        ("execute round trip, interleaved with direct ZMQ, median (µs)", "int",
         _mid(k["interleaved"], "direct_median_us"), _mid(p["interleaved"], "gateway_median_us"), _mid(k["interleaved"], "gateway_median_us")),
        ("the same, gateway / direct ZMQ in one interleaved run (×)", "3", None, _ratio(p["interleaved"]), _ratio(k["interleaved"])),
        # in the floor's column: what a relay that does nothing (bench/relay.py) adds the same way
        ("the same, a relay that does nothing (libzmq's zmq_proxy) / direct ZMQ (×)", "3", _ratio(R["relay"]["interleaved"]), None, None),
        ("gateway CPU over one latency run (ms)", "int", None, cpu_lat(p["latency"]), cpu_lat(k["latency"])),
        ("%d MB flood, seconds (peer: unlimited)" % MB, "s", df.get("seconds"), pu.get("seconds"), kf.get("seconds")),
        ("%d MB flood, bytes received (peer: unlimited)" % MB, "int", df.get("received_bytes"), pu.get("received_bytes"), kf.get("received_bytes")),
        ("%d MB flood, gateway CPU (ms) (peer: unlimited)" % MB, "int", None, cpu_ms(pu), cpu_ms(kf)),
        ("%d MB flood, seconds, client UTF-8 check off, median of %d rounds (peer: unlimited)" % (MB, ROUNDS), "s",
         rmed(d, "seconds"), rmed(p, "seconds"), rmed(k, "seconds")),
        ("%d MB flood, gateway CPU (ms), client UTF-8 check off, median (peer: unlimited)" % MB, "int",
         None, rmed(p, "gateway_cpu_s", 1e3), rmed(k, "gateway_cpu_s", 1e3)),
        ("%d MB flood, bytes, client UTF-8 check off, fewest of the rounds (peer: unlimited)" % MB, "int",
         rmin(d, "received_bytes"), rmin(p, "received_bytes"), rmin(k, "received_bytes")),
        ("%d MB flood, seconds, a frame read whole, median of %d rounds (peer: unlimited)" % (MB, ROUNDS), "s",
         rmed(d, "seconds"), rmed(p, "seconds", rounds=W), rmed(k, "seconds", rounds=W)),
        ("%d MB flood, gateway CPU (ms), a frame read whole, median (peer: unlimited)" % MB, "int",
         None, rmed(p, "gateway_cpu_s", 1e3, rounds=W), rmed(k, "gateway_cpu_s", 1e3, rounds=W)),
        ("%d MB flood, bytes, a frame read whole, fewest of the rounds (peer: unlimited)" % MB, "int",
         rmin(d, "received_bytes"), rmin(p, "received_bytes", rounds=W), rmin(k, "received_bytes", rounds=W)),
        ("%d small prints, one message each, seconds (peer: unlimited)" % PRINTS, "s",
         pr(d).get("seconds"), pr(p).get("seconds"), pr(k).get("seconds")),
        ("%d small prints, gateway CPU (ms) (peer: unlimited)" % PRINTS, "int", None, cpu_ms(pr(p)), cpu_ms(pr(k))),
        ("small prints, gateway CPU per message (µs) (peer: unlimited)", "1", None, per_msg_us(pr(p)), per_msg_us(pr(k))),
        ("small prints, gateway CPU per message delivered (µs) (peer: unlimited)", "1", None, per_got_us(pr(p)), per_got_us(pr(k))),
        ("%d small prints, stream messages received (peer: unlimited)" % PRINTS, "int",
         pr(d).get("received_messages"), pr(p).get("received_messages"), pr(k).get("received_messages")),
        ("%d small prints, bytes received (peer: unlimited)" % PRINTS, "int",
         pr(d).get("received_bytes"), pr(p).get("received_bytes"), pr(k).get("received_bytes")),
        ("%d MB flood, seconds (peer: default rate limits)*" % MB, "s", df.get("seconds"), pd.get("seconds"), kf.get("seconds")),
        ("%d MB flood, bytes received (peer: default rate limits)*" % MB, "int", df.get("received_bytes"), pd.get("received_bytes"), kf.get("received_bytes")),
        ("cold start to first GET /api 200, median (ms)", "1", None, med(p["cold_start_ms"]), med(k["cold_start_ms"])),
        ("idle RSS, no kernels (MB)", "1", None, p.get("rss_idle_mb"), k.get("rss_idle_mb")),
        ("idle RSS, one idle kernel (MB, gateway only)", "1", None, p.get("rss_one_kernel_mb"), k.get("rss_one_kernel_mb")),
    ]
    # kgate with its kernels on tcp, for the rows both kgates ran (None elsewhere)
    tcp = {
        rows[0][0]: _mid(t.get("latency", []), "median_us"),
        rows[1][0]: _mid(t.get("latency", []), "p90_us"),
        rows[2][0]: _mid(t.get("interleaved", []), "gateway_median_us"),
        rows[3][0]: _ratio(t.get("interleaved", [])),
        rows[5][0]: cpu_lat(t.get("latency", [])),
        rows[9][0]: rmed(t, "seconds"),
        rows[10][0]: rmed(t, "gateway_cpu_s", 1e3),
        rows[12][0]: rmed(t, "seconds", rounds=W),
        rows[13][0]: rmed(t, "gateway_cpu_s", 1e3, rounds=W),
        rows[15][0]: pr(t).get("seconds"),
        rows[16][0]: cpu_ms(pr(t)),
        rows[17][0]: per_msg_us(pr(t)),
    }
    out = []
    for name, fmt, dv, pv, kv in rows:
        tv = tcp.get(name)
        out.append({"metric": name, "format": fmt, "direct": dv, "peer": pv, "kgate": kv, "kgate_tcp": tv,
                    "kgate_over_tcp": round(kv / tv, 3) if kv is not None and tv else None,
                    "kgate_over_direct": round(kv / dv, 3) if kv is not None and dv else None,
                    # * the rate-limited peer drops most output, so kgate/peer compares unlike work there
                    "kgate_over_peer": round(kv / pv, 3) if kv is not None and pv and not name.endswith("*") else None})
    return out


def _fmt(v, fmt):
    if v is None:
        return "—"
    if fmt in ("s", "3"):   # seconds, and ratios to three places
        return "%.3f" % v
    if fmt == "1":
        return "%.1f" % v
    return "{:,}".format(int(round(v)))


def print_md(hdr, rows, right_from=1):
    """A Markdown table of strings on stdout: columns from `right_from` on are right-aligned."""
    w = [max(len(x[i]) for x in rows + [hdr]) for i in range(len(hdr))]
    line = lambda cells: "| " + " | ".join(c.ljust(w[i]) if i < right_from else c.rjust(w[i])
                                           for i, c in enumerate(cells)) + " |"
    print(line(hdr))
    print("|" + "|".join(("-" * (w[i] + 1) + ":") if i >= right_from else ("-" * (w[i] + 2))
                         for i in range(len(hdr))) + "|")
    for r in rows:
        print(line(r))


def print_table(R):
    hdr = ["metric", "direct (floor)", "jupyter_server (peer)", "kgate", "kgate, kernels on tcp", "kgate/direct",
           "kgate/peer", "ipc/tcp"]
    rows = [[r["metric"], _fmt(r["direct"], r["format"]), _fmt(r["peer"], r["format"]), _fmt(r["kgate"], r["format"]),
             _fmt(r.get("kgate_tcp"), r["format"]),
             "—" if r["kgate_over_direct"] is None else "%.2f×" % r["kgate_over_direct"],
             "—" if r["kgate_over_peer"] is None else "%.2f×" % r["kgate_over_peer"],
             "—" if r.get("kgate_over_tcp") is None else "%.2f×" % r["kgate_over_tcp"]] for r in R["summary"]]
    m = R["meta"]
    print("\nkgate benchmark  N=%d round trips x %d reps, %d MB flood (%d rounds), %d prints, %s cpus, %s"
          % (m["N"], m["reps"], m["MB"], m.get("rounds", 1), m.get("prints", 0), m["cpus"], m["date"]))
    print_md(hdr, rows)
    print("* jupyter_server's default iopub rate limits drop most of the flood, so no kgate/peer ratio there.")


if __name__ == "__main__":
    sys.exit(main())
