#!/usr/bin/python3
"""kgate-mcp benchmark: the MCP execute round trip against the ZMQ floor,
kgate-mcp's idle RSS, and its start to answering `initialize`.

usage: bench/mcp.sh [-h]            (runs this file with /usr/bin/python3)

One kgate and one jupyter_server (stock settings) run for the whole run. Both binaries
(kgate, kgate-mcp) are copied into the run's temp dir first, so a rebuild meanwhile cannot
swap them. kgate-mcp gets KGATE_URL/KGATE_TOKEN of that kgate and an empty XDG_CONFIG_HOME
(no gateways.toml, startup.py or inspectors.py).

1. Start: MCP_STARTS times, spawn kgate-mcp, write `initialize` at once, time until its reply
   line (median and max). Each one is then closed (stdin EOF) and must exit.
2. Round trip, MCP_REPS repetitions. Each runs, in this order (reversed on even reps):
   the direct client (bench/wsclient.py direct N: the raw ZMQ floor, store_history=False), the same
   raw ZMQ client with store_history=True (what kgate's agent path asks the kernel for), the MCP run, kgate's agent
   path over plain HTTP (POST .../execute with wait and "digest": true, as kgate-mcp does),
   the websocket client (wsclient.py gateway) on kgate, and on jupyter_server. Every kernel of the run gets a
   private IPYTHONDIR, so the cells that store history write a fresh history.sqlite, not
   ~/.ipython's. The MCP run is one fresh kgate-mcp: initialize (VmRSS read right after the
   reply, and again 0.5 s later), notifications/initialized, tools/call connect (a fresh kernel),
   20 warm-up tools/call execute('1+1'), then N timed ones, each from writing the request line
   to reading its reply line, the reply's text checked to be "2". kgate-mcp's and kgate's own
   CPU (utime + stime) is read across the N timed calls, and VmRSS after them. Then stdin is
   closed, kgate-mcp must exit, and the kernel connect made is deleted over REST.

Environment:
  KGATE_BIN       kgate binary (default <repo>/build/gateway/kgate)
  KGATE_MCP_BIN   kgate-mcp binary (default <repo>/build/translator/kgate-mcp)
  MCP_N           timed round trips per run (default 200; 20 warm-ups come first)
  MCP_REPS        repetitions of the round-trip set (default 3)
  MCP_STARTS      spawn-to-initialize-reply samples (default 20)
  MCP_BUDGET      total time budget, seconds (default 170); steps past it are skipped as errors
  MCP_KERNEL_HISTORY  disk (default): the kernels keep IPython's history in the private
                  IPYTHONDIR's history.sqlite, as a user's kernel does; memory: that IPYTHONDIR's
                  ipython_kernel_config.py sets HistoryManager.hist_file = ':memory:', which takes
                  the per-cell sqlite writes (store_history=True) out of every figure
  MCP_OUT         results JSON (default bench/results/mcp-latest.json)
  MCP_KEEP_TMP=1  keep the temp dir (server and kgate-mcp logs)

Exit status: 0 every step ran, 1 a step failed (listed under "errors"; missing a target is
reported, not a failure), 2 usage/setup, 130 interrupted (no JSON written).
"""
import http.client
import json
import os
import platform
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True   # no bench/__pycache__ left behind
import bench  # noqa: E402  (Server, run_client, kill_tree, sweep, rss_mb, cpu_s, private_env)

_REPO = os.path.dirname(HERE)
KGATE_BIN = os.path.abspath(os.environ.get("KGATE_BIN", os.path.join(_REPO, "build", "gateway", "kgate")))
MCP_BIN = os.path.abspath(os.environ.get("KGATE_MCP_BIN", os.path.join(_REPO, "build", "translator", "kgate-mcp")))
N = max(1, int(os.environ.get("MCP_N", "200")))
WARMUP = 20
REPS = max(1, int(os.environ.get("MCP_REPS", "3")))
STARTS = max(1, int(os.environ.get("MCP_STARTS", "20")))
BUDGET = float(os.environ.get("MCP_BUDGET", "170"))
OUT = os.environ.get("MCP_OUT", os.path.join(HERE, "results", "mcp-latest.json"))
KEEP_TMP = os.environ.get("MCP_KEEP_TMP") == "1"
KERNEL_HISTORY = os.environ.get("MCP_KERNEL_HISTORY", "disk")
PROTOCOL = "2025-11-25"

# the targets the MCP figures are held to
TARGET_RATIO = 1.10      # MCP execute median <= direct ZMQ median x 1.10
TARGET_RSS_MB = 10.0     # idle RSS
TARGET_START_MS = 20.0   # start to answering initialize

# the round-trip columns, in run order (reversed on even reps)
COLUMNS = {"direct": "direct ZMQ (floor)", "direct_history": "direct ZMQ, store_history=True",
           "mcp": "MCP → kgate-mcp → kgate", "mcp_http": "MCP → kgate /mcp (HTTP)", "agent_rest": "kgate agent REST",
           "kgate_ws": "kgate ws", "peer": "jupyter_server ws (peer)"}
SHORT = {"direct": "direct", "direct_history": "direct (history)", "mcp": "MCP", "mcp_http": "MCP /mcp",
         "agent_rest": "agent REST",
         "kgate_ws": "kgate ws", "peer": "peer"}

T0 = time.monotonic()


log = bench.logger("mcp", T0)


StepError = bench.StepError


# ---------------------------------------------------------------- a minimal stdio MCP client

class Mcp:
    """One kgate-mcp process, spoken to over newline-delimited JSON-RPC on its stdin/stdout."""

    def __init__(self, binary, env, cwd, log_path):
        self.log_path = log_path
        self.buf = b""
        self.next_id = 1
        self.notifications = 0
        logf = open(log_path, "ab")
        try:
            self.t_spawn = time.perf_counter()
            self.proc = subprocess.Popen([binary], cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=logf, bufsize=0, start_new_session=True)
        except OSError as e:
            raise StepError("cannot spawn %s: %s" % (binary, e))
        finally:
            logf.close()
        self.out = self.proc.stdout.fileno()

    def write(self, msg):
        self.proc.stdin.write((json.dumps(msg, separators=(",", ":")) + "\n").encode())

    def read_line(self, timeout):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StepError("kgate-mcp: no reply line within %gs; stderr tail:\n%s"
                                % (timeout, bench.tail(self.log_path)))
            r, _, _ = select.select([self.out], [], [], left)
            if r:
                chunk = os.read(self.out, 65536)
                if not chunk:
                    raise StepError("kgate-mcp closed stdout (exit status %s); stderr tail:\n%s"
                                    % (self.proc.poll(), bench.tail(self.log_path)))
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def request(self, method, params, timeout=60):
        """Send one request; return (reply, seconds from writing the line to reading the reply line)."""
        rid = self.next_id
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        t = time.perf_counter()
        self.write(msg)
        while True:
            line = self.read_line(timeout)
            dt = time.perf_counter() - t
            try:
                m = json.loads(line)
            except ValueError:
                raise StepError("kgate-mcp wrote a line that is not JSON: %r" % line[:200])
            if m.get("id") == rid and "method" not in m:
                if "error" in m:
                    raise StepError("%s: JSON-RPC error %s" % (method, json.dumps(m["error"])[:300]))
                return m, dt
            self.notifications += 1   # a notification (or a request to us): not this reply

    def initialize(self, timeout=30):
        return self.request("initialize", {"protocolVersion": PROTOCOL, "capabilities": {},
                                           "clientInfo": {"name": "kgate-bench", "version": "1"}}, timeout)

    def notify(self, method, params=None):
        msg = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self.write(msg)

    def call(self, tool, args, timeout=60):
        m, dt = self.request("tools/call", {"name": tool, "arguments": args}, timeout)
        res = m.get("result") or {}
        content = res.get("content") or [{}]
        return res, (content[0].get("text") if content else None), dt

    def close(self, timeout=10.0):
        """stdin EOF; returns (exit status, seconds to exit) or raises after killing it."""
        t = time.perf_counter()
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            bench.kill_tree(self.proc, grace=1)
            raise StepError("kgate-mcp did not exit within %gs of stdin EOF" % timeout)
        finally:
            self.proc.stdout.close()
        return rc, time.perf_counter() - t

    def kill(self):
        if self.proc.poll() is None:
            bench.kill_tree(self.proc, grace=1)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


def pct(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))]


# ---------------------------------------------------------------- the parts

def part_starts(R, mcp_bin, env, cwd, logdir, live):
    S = R["start"] = {"ms": [], "exit_ms": []}
    for i in range(STARTS):
        if bench.remaining() < 20:
            raise bench.OutOfTime("start %d: skipped, time budget used up" % (i + 1))
        c = Mcp(mcp_bin, env, cwd, os.path.join(logdir, "start-%02d.log" % i))
        live.append(c)
        try:
            # initialize is written the moment the process exists; the clock started before spawn
            c.write({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                     "params": {"protocolVersion": PROTOCOL, "capabilities": {},
                                "clientInfo": {"name": "kgate-bench", "version": "1"}}})
            line = c.read_line(10)
            ms = (time.perf_counter() - c.t_spawn) * 1e3
            m = json.loads(line)
            if m.get("id") != 1 or (m.get("result") or {}).get("protocolVersion") != PROTOCOL:
                raise StepError("start %d: unexpected initialize reply %s" % (i + 1, line[:300]))
            S["ms"].append(round(ms, 2))
            rc, dt = c.close()
            S["exit_ms"].append(round(dt * 1e3, 2))
            if rc != 0:
                raise StepError("start %d: kgate-mcp exited with status %s on stdin EOF" % (i + 1, rc))
        finally:
            c.kill()
            live.remove(c)
    log("start to initialize reply: median %.1f ms, max %.1f ms (%d starts)"
        % (statistics.median(S["ms"]), max(S["ms"]), len(S["ms"])))


def delete_new_kernels(kg, before, who):
    """connect's kernel is never stopped implicitly: delete every kernel not in `before`."""
    try:
        for k in kg.rest("GET", "/api/kernels", timeout=10):
            if k["id"] not in before:
                kg.rest("DELETE", "/api/kernels/" + k["id"], timeout=30)
    except Exception as e:
        log("deleting %s's kernel failed: %s" % (who, e))


def mcp_run(rep, mcp_bin, env, cwd, logdir, kg, live):
    """One kgate-mcp: initialize, connect, WARMUP + N executes of 1+1."""
    r = {"rep": rep}
    before = {k["id"] for k in kg.rest("GET", "/api/kernels", timeout=10)}
    c = Mcp(mcp_bin, env, cwd, os.path.join(logdir, "mcp-rep%d.log" % rep))
    live.append(c)
    try:
        m, dt = c.initialize()
        r["rss_after_initialize_mb"] = bench.rss_mb(c.proc.pid)
        r["initialize_ms"] = round(dt * 1e3, 2)
        time.sleep(0.5)
        r["rss_after_initialize_0_5s_mb"] = bench.rss_mb(c.proc.pid)
        r["threads_after_initialize"] = threads(c.proc.pid)
        c.notify("notifications/initialized")
        res, text, dt = c.call("connect", {}, timeout=bench.budget(90))
        r["connect_ms"] = round(dt * 1e3, 1)
        if res.get("isError"):
            raise StepError("connect failed: %s" % (text or "")[:500])
        r["connect_text"] = (text or "")[:300]
        lat = []
        bad = None
        for i in range(WARMUP + N):
            if i == WARMUP:
                cpu_m0, cpu_k0 = bench.cpu_s(c.proc.pid), bench.cpu_s(kg.proc.pid)
                w0 = time.perf_counter()
            res, text, dt = c.call("execute", {"code": "1+1"}, timeout=60)
            if text != "2" or res.get("isError"):
                bad = bad or "execute %d replied %r (isError %s)" % (i + 1, (text or "")[:300], res.get("isError"))
            if i >= WARMUP:
                lat.append(dt)
        wall = time.perf_counter() - w0
        r["mcp_cpu_s"] = round(bench.cpu_s(c.proc.pid) - cpu_m0, 3)
        r["kgate_cpu_s"] = round(bench.cpu_s(kg.proc.pid) - cpu_k0, 3)
        r["wall_s"] = round(wall, 3)
        r["rss_after_executes_mb"] = bench.rss_mb(c.proc.pid)
        r["threads_after_executes"] = threads(c.proc.pid)
        r["median_us"] = round(statistics.median(lat) * 1e6)
        r["p90_us"] = round(pct(lat, 0.9) * 1e6)
        r["min_us"] = round(min(lat) * 1e6)
        r["max_us"] = round(max(lat) * 1e6)
        r["notifications_seen"] = c.notifications
        if bad:
            raise StepError(bad)
        rc, dt = c.close()
        r["exit_status"], r["exit_ms"] = rc, round(dt * 1e3, 1)
        if rc != 0:
            raise StepError("kgate-mcp exited with status %s on stdin EOF" % rc)
    finally:
        c.kill()
        live.remove(c)
        delete_new_kernels(kg, before, "the MCP run")
    return r


def threads(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return None


def run_direct_history(env, cwd):
    """The raw ZMQ client (bench/wsclient.py direct) with store_history=True in every
    execute_request, as kgate's agent path asks for (src/records/jobs.cpp): 20 warm-ups, then N timed."""
    return bench.run_client(env, cwd, ["direct", N, "--store-history"], 120)


def mcp_http_run(kg):
    """kgate's own /mcp over HTTP/1.1 keep-alive (Python http.client): initialize (a session),
    notifications/initialized, connect (a fresh kernel), WARMUP + N tools/call execute('1+1'), each
    timed from sending the POST to reading its JSON reply; then DELETE /mcp ends the session,
    and the kernel connect made is deleted."""
    H = {"Authorization": "Bearer " + kg.token, "Content-Type": "application/json",
         "Accept": "application/json, text/event-stream"}
    conn = http.client.HTTPConnection("127.0.0.1", kg.port, timeout=60)
    sid = None
    ids = iter(range(1, 1 << 30))

    def post(msg):
        h = dict(H)
        if sid:
            h["Mcp-Session-Id"] = sid
        conn.request("POST", "/mcp", body=json.dumps(msg, separators=(",", ":")), headers=h)
        r = conn.getresponse()
        raw = r.read()
        return r, (json.loads(raw) if raw else None)

    def call(tool, args):
        r, m = post({"jsonrpc": "2.0", "id": next(ids), "method": "tools/call",
                     "params": {"name": tool, "arguments": args}})
        if r.status != 200 or "result" not in (m or {}):
            raise StepError("/mcp tools/call %s: HTTP %s %s" % (tool, r.status, json.dumps(m)[:300]))
        res = m["result"]
        return res, (res.get("content") or [{}])[0].get("text")

    before = {k["id"] for k in kg.rest("GET", "/api/kernels", timeout=10)}
    try:
        r, m = post({"jsonrpc": "2.0", "id": next(ids), "method": "initialize",
                     "params": {"protocolVersion": PROTOCOL, "capabilities": {},
                                "clientInfo": {"name": "kgate-bench", "version": "1"}}})
        sid = r.getheader("Mcp-Session-Id")
        if r.status != 200 or not sid:
            raise StepError("/mcp initialize: HTTP %s, no session (%s)" % (r.status, json.dumps(m)[:300]))
        post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        res, text = call("connect", {})
        if res.get("isError"):
            raise StepError("/mcp connect failed: %s" % (text or "")[:500])
        lat = []
        for i in range(WARMUP + N):
            if i == WARMUP:
                cpu0 = bench.cpu_s(kg.proc.pid)
            t = time.perf_counter()
            res, text = call("execute", {"code": "1+1"})
            dt = time.perf_counter() - t
            if text != "2" or res.get("isError"):
                raise StepError("/mcp execute %d replied %r" % (i + 1, (text or "")[:300]))
            if i >= WARMUP:
                lat.append(dt)
        cpu = bench.cpu_s(kg.proc.pid) - cpu0
        conn.request("DELETE", "/mcp", headers={"Authorization": H["Authorization"], "Mcp-Session-Id": sid})
        conn.getresponse().read()
    finally:
        conn.close()
        delete_new_kernels(kg, before, "the /mcp run")
    return {"median_us": round(statistics.median(lat) * 1e6), "p90_us": round(pct(lat, 0.9) * 1e6),
            "min_us": round(min(lat) * 1e6), "max_us": round(max(lat) * 1e6), "kgate_cpu_s": round(cpu, 3)}


def agent_rest_run(kg):
    """kgate's agent path over plain HTTP/1.1 keep-alive, what kgate-mcp does per execute: POST
    /api/kgate/kernels/{id}/execute {code, agent, wait, digest: true} (the finished record carries
    the kernel's digest, so no second request), on a kernel of its own (so no claim is shared with
    the MCP run)."""
    H = {"Authorization": "token " + kg.token, "Content-Type": "application/json"}
    conn = http.client.HTTPConnection("127.0.0.1", kg.port, timeout=60)

    def call(method, path, body=None):
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=H)
        r = conn.getresponse()
        raw = r.read()
        return r.status, (json.loads(raw) if raw else None)

    cpu0 = None
    st, k = call("POST", "/api/kernels", {"name": "python3"})
    if st not in (200, 201):
        raise StepError("POST /api/kernels: HTTP %s %s" % (st, k))
    kid = k["id"]
    try:
        ex, both = [], []
        for i in range(WARMUP + N):
            if i == WARMUP:
                cpu0 = bench.cpu_s(kg.proc.pid)
            t = time.perf_counter()
            st, j = call("POST", "/api/kgate/kernels/%s/execute" % kid,
                         {"code": "1+1", "agent": "kgate-bench-rest", "wait": 60 if i == 0 else 30, "digest": True})
            t1 = t2 = time.perf_counter()
            if st != 200 or (j or {}).get("status") != "ok":
                raise StepError("agent execute %d: HTTP %s %s" % (i + 1, st, json.dumps(j)[:300]))
            if not isinstance((j or {}).get("digest"), dict):
                raise StepError("agent execute %d: the record carries no digest: %s" % (i + 1, json.dumps(j)[:300]))
            if i >= WARMUP:
                ex.append(t1 - t)
                both.append(t2 - t)
        cpu = bench.cpu_s(kg.proc.pid) - cpu0
    finally:
        try:
            call("DELETE", "/api/kernels/" + kid)
        except Exception as e:
            log("deleting the agent REST run's kernel failed: %s" % e)
        conn.close()
    return {"median_us": round(statistics.median(both) * 1e6), "p90_us": round(pct(both, 0.9) * 1e6),
            "execute_only_median_us": round(statistics.median(ex) * 1e6),
            "execute_only_p90_us": round(pct(ex, 0.9) * 1e6), "kgate_cpu_s": round(cpu, 3)}


# ---------------------------------------------------------------- summary

def summarize(R):
    lat = R["latency"]
    med = lambda xs: statistics.median(xs) if xs else None
    g = lambda who, key: med([x[key] for x in lat[who] if x and key in x])
    ratio = lambda a, b: round(a / b, 3) if a is not None and b else None
    rt = []
    for q in ("median", "p90"):
        row = {"metric": "execute('1+1') round trip, %s (µs)" % q}
        for who in COLUMNS:
            row[who] = g(who, q + "_us")
        row["mcp_over_direct"] = ratio(row["mcp"], row["direct"])
        row["mcp_over_direct_history"] = ratio(row["mcp"], row["direct_history"])
        row["mcp_over_agent_rest"] = ratio(row["mcp"], row["agent_rest"])
        row["mcp_http_over_direct_history"] = ratio(row["mcp_http"], row["direct_history"])
        rt.append(row)
    runs = lat["mcp"]
    st = R.get("start") or {}
    S = {"round_trip": rt,
        "per_rep_mcp_over_direct": [ratio(a.get("median_us"), b.get("median_us"))
                                    for a, b in zip(runs, lat["direct"]) if a and b],
        "mcp_over_direct": rt[0]["mcp_over_direct"],
        "mcp_over_direct_history": rt[0]["mcp_over_direct_history"],
        "mcp_over_agent_rest": rt[0]["mcp_over_agent_rest"],
        "mcp_http_over_direct_history": rt[0]["mcp_http_over_direct_history"],
        "kgate_mcp_http_cpu_ms": med([x["kgate_cpu_s"] * 1e3 for x in lat["mcp_http"] if x and "kgate_cpu_s" in x]),
        "agent_rest_execute_only_median_us": g("agent_rest", "execute_only_median_us"),
        "rss_after_initialize_mb": med([x["rss_after_initialize_mb"] for x in runs if "rss_after_initialize_mb" in x]),
        "rss_after_initialize_0_5s_mb": med([x["rss_after_initialize_0_5s_mb"] for x in runs
                                             if "rss_after_initialize_0_5s_mb" in x]),
        "rss_after_executes_mb": med([x["rss_after_executes_mb"] for x in runs if "rss_after_executes_mb" in x]),
        "mcp_cpu_ms": med([x["mcp_cpu_s"] * 1e3 for x in runs if "mcp_cpu_s" in x]),
        "kgate_cpu_ms": med([x["kgate_cpu_s"] * 1e3 for x in runs if "kgate_cpu_s" in x]),
        "kgate_rest_cpu_ms": med([x["kgate_cpu_s"] * 1e3 for x in lat["agent_rest"] if x and "kgate_cpu_s" in x]),
        "kgate_ws_cpu_ms": med([x["gateway_cpu_s"] * 1e3 for x in lat["kgate_ws"] if x and "gateway_cpu_s" in x]),
        "start_median_ms": med(st.get("ms") or []),
        "start_max_ms": max(st["ms"]) if st.get("ms") else None,
        "start_min_ms": min(st["ms"]) if st.get("ms") else None,
        "exit_median_ms": med(st.get("exit_ms") or [])}
    return S


def _f(v, fmt="int"):
    if v is None:
        return "—"
    if fmt == "1":
        return "%.1f" % v
    if fmt == "2":
        return "%.2f" % v
    return "{:,}".format(int(round(v)))


def _ok(v, target):
    return "—" if v is None else ("yes" if v <= target else "NO")


def print_tables(R):
    S = R["summary"]
    m = R["meta"]
    print_md = bench.print_md
    print("\nkgate-mcp round trip  N=%d timed (after %d warm-ups) x %d reps, median of reps (mean of two); "
          "kernel history %s; %s cpus, load %s, %s" % (N, WARMUP, REPS, KERNEL_HISTORY, m["cpus"],
                                                      " ".join(m["loadavg_start"]), m["date"]))
    rx = lambda x: "—" if x is None else "%.3f×" % x
    rows = [[r["metric"]] + [_f(r[who]) for who in COLUMNS] +
            [rx(r["mcp_over_direct"]), rx(r["mcp_over_direct_history"]), rx(r["mcp_over_agent_rest"])]
            for r in S["round_trip"]]
    print_md(["metric"] + [COLUMNS[w] for w in COLUMNS] + ["MCP/direct", "MCP/direct (history)", "MCP/agent REST"],
             rows)
    print("agent REST = POST /api/kgate/kernels/{id}/execute {wait, digest: true} from Python http.client "
          "(median %s µs)." % _f(S["agent_rest_execute_only_median_us"]))
    per = []
    for i in range(REPS):
        one = lambda who: (R["latency"][who][i] or {}) if i < len(R["latency"][who]) else {}
        dm, mm = one("direct"), one("mcp")
        per.append([str(i + 1), "as listed" if i % 2 == 0 else "reversed"] +
                   [_f(one(who).get("median_us")) for who in COLUMNS] +
                   ["—" if not (dm.get("median_us") and mm.get("median_us")) else "%.3f×" % (mm["median_us"] / dm["median_us"])])
    print("\nper rep (medians, µs; order as the columns, reversed on even reps):")
    print_md(["rep", "order"] + [SHORT[w] for w in COLUMNS] + ["MCP/direct"], per, right_from=2)

    print("\nkgate-mcp figures against their targets")
    ratio = S["mcp_over_direct"]
    ratio_h = S["mcp_over_direct_history"]
    rows = [
        # The same request is the fair floor: kgate's agent path asks for store_history=True, whose
        # cost (IPython's history.sqlite commit) is the kernel's; see bench/README.md.
        ["MCP execute median / direct ZMQ median, same request (store_history=True)",
         "—" if ratio_h is None else "%.3f×" % ratio_h, "≤ %.2f×" % TARGET_RATIO, _ok(ratio_h, TARGET_RATIO)],
        ["kgate /mcp (HTTP) execute median / direct ZMQ median, same request (store_history=True)",
         "—" if S["mcp_http_over_direct_history"] is None else "%.3f×" % S["mcp_http_over_direct_history"],
         "≤ %.2f×" % TARGET_RATIO, _ok(S["mcp_http_over_direct_history"], TARGET_RATIO)],
        ["kgate CPU over the /mcp run's %d timed executes (ms; kgate-mcp's work is in kgate here)" % N,
         _f(S["kgate_mcp_http_cpu_ms"]), "—", "—"],
        ["MCP execute median / direct ZMQ median (store_history=False)",
         "—" if ratio is None else "%.3f×" % ratio, "—", "—"],
        ["idle RSS right after initialize (MB)", _f(S["rss_after_initialize_mb"], "1"), "≤ %.0f" % TARGET_RSS_MB,
         _ok(S["rss_after_initialize_mb"], TARGET_RSS_MB)],
        ["idle RSS 0.5 s after initialize (MB)", _f(S["rss_after_initialize_0_5s_mb"], "1"), "—", "—"],
        ["RSS after connect + %d executes (MB)" % (WARMUP + N), _f(S["rss_after_executes_mb"], "1"), "—", "—"],
        ["start to initialize reply, median (ms; %d starts)" % len((R.get("start") or {}).get("ms") or []),
         _f(S["start_median_ms"], "1"), "≤ %.0f" % TARGET_START_MS, _ok(S["start_median_ms"], TARGET_START_MS)],
        ["start to initialize reply, max (ms)", _f(S["start_max_ms"], "1"), "≤ %.0f" % TARGET_START_MS,
         _ok(S["start_max_ms"], TARGET_START_MS)],
        ["stdin EOF to exit, median (ms; after initialize only)", _f(S["exit_median_ms"], "1"), "—", "—"],
        ["kgate-mcp CPU over the %d timed executes (ms)" % N, _f(S["mcp_cpu_ms"]), "—", "—"],
        ["kgate-mcp CPU per execute (µs)", _f(None if S["mcp_cpu_ms"] is None else S["mcp_cpu_ms"] * 1e3 / N), "—", "—"],
        ["kgate CPU over the same %d executes (ms)" % N, _f(S["kgate_cpu_ms"]), "—", "—"],
        ["kgate CPU over the agent REST run's %d timed executes (ms)" % N, _f(S["kgate_rest_cpu_ms"]), "—", "—"],
        ["kgate CPU over one websocket client run, %d+%d ws round trips + kernel start/stop (ms)" % (WARMUP, N),
         _f(S["kgate_ws_cpu_ms"]), "—", "—"],
    ]
    print_md(["metric", "value", "target", "met"], rows)
    print("CPU is utime + stime from /proc/PID/stat, in clock ticks (10 ms), so small figures are coarse.")


# ---------------------------------------------------------------- main

def main():
    if len(sys.argv) > 1:
        return bench.print_usage(__doc__, sys.argv[1])
    bench.interrupt_on_stop_signals()

    for f in (bench.CLIENT, bench.PY):
        if not os.path.exists(f):
            print("mcp: missing %s" % f, file=sys.stderr)
            return 2
    for b, target in ((KGATE_BIN, "kgate"), (MCP_BIN, "kgate-mcp")):
        if not os.access(b, os.X_OK):
            print("mcp: %s is missing or not executable (build it: cmake --build build --target %s)" % (b, target),
                  file=sys.stderr)
            return 2

    if KERNEL_HISTORY not in ("disk", "memory"):
        print("mcp: MCP_KERNEL_HISTORY must be disk or memory, not %r" % KERNEL_HISTORY, file=sys.stderr)
        return 2
    bench.BUDGET, bench.T_START = BUDGET, T0   # bench.budget()/remaining() cap every step
    tmp = tempfile.mkdtemp(prefix="kgate-mcp-bench-")
    kgate_bin, mcp_bin = os.path.join(tmp, "kgate"), os.path.join(tmp, "kgate-mcp")
    shutil.copy2(KGATE_BIN, kgate_bin)   # the run uses these copies, whatever a build does meanwhile
    sup = os.path.join(os.path.dirname(KGATE_BIN), "kgate-supervise")
    if os.path.exists(sup):  # kgate runs its kernels under the supervisor beside it (docs/dev/readoption.md)
        shutil.copy2(sup, os.path.join(os.path.dirname(kgate_bin), "kgate-supervise"))
    shutil.copy2(MCP_BIN, mcp_bin)
    bench.KGATE_BIN = kgate_bin          # bench.Server("kgate", ...) spawns this
    R = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(), "cpus": os.cpu_count(),
                  "kernel": platform.release(), "loadavg_start": open("/proc/loadavg").read().split()[:3],
                  "N": N, "warmup": WARMUP, "kernel_history": KERNEL_HISTORY, "reps": REPS, "starts": STARTS, "protocol": PROTOCOL,
                  "kgate_bin": KGATE_BIN, "kgate_mcp_bin": MCP_BIN,
                  "kgate_mtime": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(os.path.getmtime(KGATE_BIN))),
                  "kgate_mcp_mtime": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(os.path.getmtime(MCP_BIN))),
                  "kgate_version": subprocess.run([kgate_bin, "--version"], capture_output=True, text=True).stdout.strip(),
                  "kgate_mcp_version": subprocess.run([mcp_bin, "--version"], capture_output=True,
                                                      text=True).stdout.strip(),
                  "client": os.path.relpath(bench.CLIENT, _REPO), "versions": bench.versions()},
         "latency": {w: [] for w in COLUMNS}, "errors": []}
    live, clients, interrupted = [], [], False
    errors = R["errors"]

    def step(name, fn, *a):
        return bench.run_step(name, errors, log, fn, *a)

    try:
        cl_env = bench.private_env(os.path.join(tmp, "client"))
        ipython_dir = os.path.join(tmp, "ipython")   # every kernel's history.sqlite, fresh for the run
        os.makedirs(os.path.join(ipython_dir, "profile_default"))
        if KERNEL_HISTORY == "memory":
            with open(os.path.join(ipython_dir, "profile_default", "ipython_kernel_config.py"), "w") as f:
                f.write("# written by bench/mcp.py (MCP_KERNEL_HISTORY=memory)\nc.HistoryManager.hist_file = ':memory:'\n")
        cl_env["IPYTHONDIR"] = ipython_dir
        kg = bench.Server("kgate", tmp, "kgate")
        kg.env["IPYTHONDIR"] = ipython_dir
        live.append(kg)
        log("starting kgate on %s" % kg.url)
        kg.start()
        R["meta"]["kgate_cold_start_ms"] = round(kg.cold_start_ms, 1)
        peer = bench.Server("peer", tmp, "peer")
        peer.env["IPYTHONDIR"] = ipython_dir
        live.append(peer)
        log("starting jupyter_server on %s" % peer.url)
        if step("peer start", peer.start) is None:
            live.remove(peer)
            peer = None

        mcp_root = os.path.join(tmp, "mcp")
        xdg = os.path.join(mcp_root, "xdg-config")      # empty: no gateways.toml, startup.py, inspectors.py
        cwd = os.path.join(mcp_root, "cwd")
        for d in (xdg, cwd):
            os.makedirs(d, exist_ok=True)
        env = dict(cl_env)
        env.update({"KGATE_URL": kg.url, "KGATE_TOKEN": kg.token, "XDG_CONFIG_HOME": xdg})

        log("start to initialize: %d spawns" % STARTS)
        step("start", part_starts, R, mcp_bin, env, cwd, mcp_root, clients)

        def run(who, rep):
            if who == "direct":
                log("rep %d/%d: direct ZMQ N=%d" % (rep + 1, REPS, N))
                x = step("direct latency rep %d" % (rep + 1), bench.run_client, cl_env, tmp, ["direct", N], 120)
            elif who == "direct_history":
                log("rep %d/%d: direct ZMQ, store_history=True, N=%d" % (rep + 1, REPS, N))
                x = step("direct (store_history) latency rep %d" % (rep + 1), run_direct_history, cl_env, tmp)
            elif who == "mcp_http":
                log("rep %d/%d: kgate /mcp execute N=%d" % (rep + 1, REPS, N))
                x = step("mcp http latency rep %d" % (rep + 1), mcp_http_run, kg)
            elif who == "agent_rest":
                log("rep %d/%d: kgate agent REST N=%d" % (rep + 1, REPS, N))
                x = step("agent REST latency rep %d" % (rep + 1), agent_rest_run, kg)
            elif who == "mcp":
                log("rep %d/%d: MCP execute N=%d" % (rep + 1, REPS, N))
                x = step("mcp latency rep %d" % (rep + 1), mcp_run, rep, mcp_bin, env, cwd, mcp_root, kg, clients)
                if x:
                    log("rep %d/%d: MCP median %d µs, p90 %d µs, RSS %.1f → %.1f MB, CPU %.0f ms"
                        % (rep + 1, REPS, x["median_us"], x["p90_us"], x["rss_after_initialize_mb"],
                           x["rss_after_executes_mb"], x["mcp_cpu_s"] * 1e3))
            elif who == "kgate_ws":
                log("rep %d/%d: kgate websocket N=%d" % (rep + 1, REPS, N))
                x = step("kgate ws latency rep %d" % (rep + 1), bench.run_client, cl_env, tmp,
                         ["gateway", kg.url, kg.token, N], 120, kg)
            else:
                if peer is None:
                    return
                log("rep %d/%d: jupyter_server websocket N=%d" % (rep + 1, REPS, N))
                x = step("peer latency rep %d" % (rep + 1), bench.run_client, cl_env, tmp,
                         ["gateway", peer.url, peer.token, N], 120, peer)
            R["latency"][who].append(x)

        order = list(COLUMNS)
        for rep in range(REPS):
            for who in (order if rep % 2 == 0 else order[::-1]):
                run(who, rep)
        if kg.proc.poll() is not None:
            errors.append({"step": "kgate", "error": "kgate exited with status %s during the run; log tail:\n%s"
                           % (kg.proc.returncode, bench.tail(kg.log_path))})
    except KeyboardInterrupt as e:
        interrupted = True
        log("interrupted (%s): stopping everything" % (str(e) or "Ctrl-C"))
    except Exception as e:
        msg = bench.error_text(e)
        log("FAILED: %s" % msg)
        errors.append({"step": "setup", "error": msg})
    finally:
        for c in list(clients):
            c.kill()
        bench.stop_all(live, tmp, R, KEEP_TMP, log)

    R["meta"]["seconds"] = round(time.monotonic() - T0, 1)
    R["meta"]["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    if interrupted:
        return 130
    R["summary"] = summarize(R)
    print_tables(R)
    return bench.finish(R, OUT, False)


if __name__ == "__main__":
    sys.exit(main())
