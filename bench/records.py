#!/usr/bin/python3
"""Session-records benchmark: what recording every cell as a job costs (latency, flood time, kgate's
CPU, recording on vs off), and whether kgate's memory stays bounded under many large cells.

usage: bench/records.sh [-h]        (runs this file with /usr/bin/python3)

Part "overhead": one kgate binary, two servers side by side, one with `[records] enabled = true`
and one with `enabled = false` (each from its own kgate.toml, started with --port 0, the port read
from the `listening on http://HOST:PORT/` stderr line, the token in $KGATE_TOKEN). REC_REPS
repetitions, alternating on/off in ABBA order (on,off / off,on / ...), each of: the latency client
(N round trips), the flood client (MB megabytes), and the same flood with the client's UTF-8 check off.
The direct ZMQ floor and jupyter_server (iopub rate limits lifted) run once each with the same
settings, beside them. Reuses bench.py's Server, client runner (bench/wsclient.py) and process cleanup.

Part "memory": one kgate (recording on, default limits) and one kernel; REC_CELLS cells that each
print REC_CELL_BYTES bytes, through POST /api/kgate/kernels/{id}/execute (agent "bench", wait 60),
one after another. kgate's VmRSS is sampled every second. At the end GET /api/kgate/jobs must
answer with at most max_jobs records.

Environment:
  KGATE_BIN       kgate binary (default <repo>/build/gateway/kgate; copied into the temp dir
                  first, so both servers run the very same file even if the build changes)
  REC_PARTS       overhead,memory (default both)
  REC_COMPARE     records: "on" is `enabled = true`, "off" `enabled = false` (default);
                  persist: both record, "on" keeps the records on disk (`persist = true`, the
                  default), "off" in memory only (`persist = false`): issue 18's cost of persistence
  REC_N           execute round trips per latency run (default 200; the client adds 20 warm-up runs)
  REC_MB          flood size, megabytes (default 20)
  REC_REPS        on/off repetitions (default 5)
  REC_CELLS       cells in the memory part (default 10000)
  REC_CELL_BYTES  bytes each memory cell prints (default 1000000)
  REC_BUDGET      time budget of the overhead part, seconds (default 420)
  REC_OUT         results JSON (default bench/results/records-latest.json)
  REC_KEEP_TMP=1  keep the temp dir (server logs, configs)

Exit status: 0 every step ran and every check held, 1 a step failed or a check did not hold
(listed under "errors"), 2 usage/setup, 130 interrupted (no JSON written).
"""
import http.client
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True   # no bench/__pycache__ left behind
import bench  # noqa: E402  (the side-by-side harness: Server, run_client, kill_tree, sweep, rss_mb, cpu_s)

_REPO = os.path.dirname(HERE)
KGATE_BIN = os.path.abspath(os.environ.get("KGATE_BIN", os.path.join(_REPO, "build", "gateway", "kgate")))
PARTS = [p.strip() for p in os.environ.get("REC_PARTS", "overhead,memory").split(",") if p.strip()]
COMPARE = os.environ.get("REC_COMPARE", "records")
N = int(os.environ.get("REC_N", "200"))
MB = int(os.environ.get("REC_MB", "20"))
REPS = max(1, int(os.environ.get("REC_REPS", "5")))
CELLS = max(1, int(os.environ.get("REC_CELLS", "10000")))
CELL_BYTES = max(1, int(os.environ.get("REC_CELL_BYTES", "1000000")))
BUDGET = float(os.environ.get("REC_BUDGET", "420"))
OUT = os.environ.get("REC_OUT", os.path.join(HERE, "results", "records-latest.json"))
KEEP_TMP = os.environ.get("REC_KEEP_TMP") == "1"

# kgate's [records] defaults (config/kgate.toml); the memory part runs with these
MAX_JOBS = 1000
BUDGET_BYTES = 64 * 1024 * 1024
JOB_OUTPUT_BYTES = 262144

T0 = time.monotonic()
LISTEN_RE = re.compile(r"listening on (http://[^/\s]+)/")


log = bench.logger("records", T0)


StepError = bench.StepError


# ---------------------------------------------------------------- kgate with --port 0 and a config

class Kgate(bench.Server):
    """kgate serve --port 0 --config FILE, token in $KGATE_TOKEN, URL from the stderr log line."""

    def __init__(self, binary, tmp, label, config_text):
        super().__init__("kgate", tmp, label)
        self.config = os.path.join(self.root, "kgate.toml")
        with open(self.config, "w") as f:
            f.write(config_text)
        self.argv = [binary, "serve", "--ip", "127.0.0.1", "--port", "0", "--config", self.config]
        self.env["KGATE_TOKEN"] = self.token
        self.port = self.url = None

    def start(self, timeout=30.0):
        logf = open(self.log_path, "wb")
        t0 = time.perf_counter()
        try:
            self.proc = subprocess.Popen(self.argv, cwd=self.root, env=self.env, stdin=subprocess.DEVNULL,
                                         stdout=logf, stderr=logf, start_new_session=True)
        except OSError as e:
            raise StepError("%s: cannot spawn %s: %s" % (self.label, self.argv[0], e))
        finally:
            logf.close()
        while self.url is None:   # the port is only known from kgate's stderr
            with open(self.log_path, errors="replace") as f:
                m = LISTEN_RE.search(f.read())
            if m:
                self.url = m.group(1)
                self.port = int(self.url.rsplit(":", 1)[1])
                break
            if self.proc.poll() is not None:
                raise StepError("%s exited with status %s before logging 'listening on'; log tail:\n%s"
                                % (self.label, self.proc.returncode, bench.tail(self.log_path)))
            if time.perf_counter() - t0 > timeout:
                raise StepError("%s: no 'listening on' line within %gs; log tail:\n%s"
                                % (self.label, timeout, bench.tail(self.log_path)))
            time.sleep(0.005)
        info = self.rest("GET", "/api", timeout=10)
        ext = ((info or {}).get("extensions") or {}).get("kgate") or {}
        self.records_advertised = ext.get("records")
        self.cold_start_ms = (time.perf_counter() - t0) * 1e3
        return self.cold_start_ms


def records_config(on):
    if COMPARE == "persist":
        return "# written by bench/records.py\n[records]\nenabled = true\npersist = %s\n" % ("true" if on else "false")
    return "# written by bench/records.py\n[records]\nenabled = %s\n" % ("true" if on else "false")


def agent_latency(s, n):
    """n agent executes of `1+1` (POST /api/kgate/kernels/{id}/execute, wait 30) on a fresh kernel,
    one after another on one keep-alive connection, after 20 warm-up runs: median and p90 in µs."""
    rest = Rest(s.url, s.token)
    try:
        status, k = rest.call("POST", "/api/kernels", {})
        if status != 201:
            raise StepError("%s: POST /api/kernels -> %s %r" % (s.label, status, k))
        kid, times = k["id"], []
        for i in range(20 + n):
            t0 = time.perf_counter()
            status, r = rest.call("POST", "/api/kgate/kernels/%s/execute" % kid,
                                  {"code": "1+1", "agent": "bench", "wait": 30})
            dt = time.perf_counter() - t0
            if status != 200 or (r or {}).get("status") != "ok":
                raise StepError("%s: agent execute -> %s %r" % (s.label, status, r))
            if i >= 20:
                times.append(dt * 1e6)
        rest.call("DELETE", "/api/kernels/" + kid)
        times.sort()
        return {"median_us": statistics.median(times), "p90_us": times[int(0.9 * (len(times) - 1))], "n": n}
    finally:
        rest.close()


# ---------------------------------------------------------------- part 1: overhead

def part_overhead(R, tmp, binary, live, errors):
    bench.BUDGET, bench.T_START = BUDGET, time.monotonic()   # bench.budget() caps each client run
    t_part = time.monotonic()
    cl_env = bench.private_env(os.path.join(tmp, "client"))
    P = R["overhead"] = {"settings": {"N": N, "MB": MB, "reps": REPS, "order": "ABBA: rep 1 on,off; rep 2 off,on; ..."},
                         "direct": {}, "peer": {}, "on": [], "off": []}

    def step(name, fn, *a):
        return bench.run_step(name, errors, log, fn, *a)

    servers = {}
    for on in (True, False):
        key = "on" if on else "off"
        s = Kgate(binary, tmp, "kgate-records-" + key, records_config(on))
        live.append(s)
        log("starting kgate (records %s)" % key)
        s.start()
        log("kgate records %s: %s, GET /api says records=%s" % (key, s.url, s.records_advertised))
        if s.records_advertised is not (on or COMPARE == "persist"):
            raise StepError("kgate with enabled = %s advertises records=%r in GET /api"
                            % (str(on).lower(), s.records_advertised))
        servers[key] = s
        P["rss_start_mb_" + key] = bench.rss_mb(s.proc.pid)

    def one_rep(key, rep):
        s = servers[key]
        r = {"rep": rep}
        log("rep %d/%d records %s: agent execute N=%d" % (rep + 1, REPS, key, N))
        if COMPARE == "persist":
            r["agent"] = step("kgate %s agent latency rep %d" % (key, rep + 1), agent_latency, s, N)
        log("rep %d/%d records %s: latency N=%d" % (rep + 1, REPS, key, N))
        r["latency"] = step("kgate %s latency rep %d" % (key, rep + 1), bench.run_client, cl_env, tmp,
                            ["gateway", s.url, s.token, N], 120, s)
        log("rep %d/%d records %s: flood %d MB" % (rep + 1, REPS, key, MB))
        r["flood"] = step("kgate %s flood rep %d" % (key, rep + 1), bench.run_client, cl_env, tmp,
                          ["flood", s.url, s.token, MB], 150, s)
        r["flood_fast"] = step("kgate %s flood (fast client) rep %d" % (key, rep + 1), bench.run_client, cl_env, tmp,
                               ["flood", s.url, s.token, MB, "--no-utf8-check"], 150, s)
        if s.proc.poll() is not None:
            raise StepError("kgate records %s exited with status %s; log tail:\n%s"
                            % (key, s.proc.returncode, bench.tail(s.log_path)))
        r["rss_mb"] = bench.rss_mb(s.proc.pid)
        if key == "on":  # records pile up over the reps (websocket cells are unseen foreign jobs)
            r["jobs_retained"] = len((s.rest("GET", "/api/kgate/jobs", timeout=30) or {}).get("jobs", []))
        r["first"] = (rep % 2 == 0) == (key == "on")
        P[key].append(r)

    for rep in range(REPS):
        order = ("on", "off") if rep % 2 == 0 else ("off", "on")
        for key in order:
            try:
                one_rep(key, rep)
            except bench.OutOfTime as e:
                errors.append({"step": "overhead rep %d %s" % (rep + 1, key), "error": str(e)})
                break

    for key, s in servers.items():
        P["rss_end_mb_" + key] = bench.rss_mb(s.proc.pid)
        try:
            P["jobs_retained_" + key] = len((s.rest("GET", "/api/kgate/jobs", timeout=30) or {}).get("jobs", []))
        except urllib.error.HTTPError as e:
            P["jobs_retained_" + key] = "HTTP %d" % e.code
        s.stop()
        live.remove(s)

    log("direct: latency N=%d" % N)
    P["direct"]["latency"] = step("direct latency", bench.run_client, cl_env, tmp, ["direct", N], 120)
    log("direct: flood %d MB" % MB)
    P["direct"]["flood"] = step("direct flood", bench.run_client, cl_env, tmp, ["direct-flood", MB], 150)

    unlimited = ("--ServerApp.iopub_data_rate_limit=0", "--ServerApp.iopub_msg_rate_limit=0")
    peer = bench.Server("peer", tmp, "peer-unlimited", unlimited)
    live.append(peer)
    log("starting jupyter_server (iopub rate limits lifted) on %s" % peer.url)
    if step("peer start", peer.start) is not None:
        log("jupyter_server: latency N=%d" % N)
        P["peer"]["latency"] = step("peer latency", bench.run_client, cl_env, tmp, ["gateway", peer.url, peer.token, N], 120, peer)
        log("jupyter_server: flood %d MB" % MB)
        P["peer"]["flood"] = step("peer flood", bench.run_client, cl_env, tmp, ["flood", peer.url, peer.token, MB], 150, peer)
        P["peer"]["flood_fast"] = step("peer flood (fast client)", bench.run_client, cl_env, tmp,
                                       ["flood", peer.url, peer.token, MB, "--no-utf8-check"], 150, peer)
    peer.stop()
    live.remove(peer)
    P["seconds"] = round(time.monotonic() - t_part, 1)


def _vals(runs, part, key):
    return [r[part][key] for r in runs if r.get(part) and key in r[part]]


def _med(xs):
    return statistics.median(xs) if xs else None


def overhead_rows(P):
    """(metric, fmt, direct, peer, off, on, [paired on/off ratios])"""
    on, off = P["on"], P["off"]
    d, p = P["direct"], P["peer"]
    g = lambda r, k: (r or {}).get(k)
    cpu = lambda r: round(r["gateway_cpu_s"] * 1e3) if r and "gateway_cpu_s" in r else None
    specs = [  # metric, fmt, part, key, scale, direct value, peer value
        ("agent execute `1+1` over REST, median (µs)", "int", "agent", "median_us", 1, None, None),
        ("agent execute `1+1` over REST, p90 (µs)", "int", "agent", "p90_us", 1, None, None),
        ("execute round trip, median (µs)", "int", "latency", "median_us", 1, g(d.get("latency"), "median_us"), g(p.get("latency"), "median_us")),
        ("execute round trip, p90 (µs)", "int", "latency", "p90_us", 1, g(d.get("latency"), "p90_us"), g(p.get("latency"), "p90_us")),
        ("gateway CPU over one latency run (ms)", "int", "latency", "gateway_cpu_s", 1e3, None, cpu(p.get("latency"))),
        ("%d MB flood, seconds (client UTF-8 check on)" % MB, "s", "flood", "seconds", 1, g(d.get("flood"), "seconds"), g(p.get("flood"), "seconds")),
        ("%d MB flood, bytes received" % MB, "int", "flood", "received_bytes", 1, g(d.get("flood"), "received_bytes"), g(p.get("flood"), "received_bytes")),
        ("%d MB flood, gateway CPU (ms)" % MB, "int", "flood", "gateway_cpu_s", 1e3, None, cpu(p.get("flood"))),
        ("%d MB flood, seconds, client UTF-8 check off" % MB, "s", "flood_fast", "seconds", 1, g(d.get("flood"), "seconds"), g(p.get("flood_fast"), "seconds")),
        ("%d MB flood, gateway CPU (ms), client UTF-8 check off" % MB, "int", "flood_fast", "gateway_cpu_s", 1e3, None, cpu(p.get("flood_fast"))),
    ]
    rows = []
    for name, fmt, part, key, scale, dv, pv in specs:
        von = [v * scale for v in _vals(on, part, key)]
        voff = [v * scale for v in _vals(off, part, key)]
        pairs = []  # rep by rep: on/off of the same repetition
        for a, b in zip(on, off):
            if a.get(part) and b.get(part) and key in a[part] and key in b[part] and b[part][key]:
                pairs.append(a[part][key] / b[part][key])
        rows.append({"metric": name, "format": fmt, "direct": dv, "peer": pv,
                     "off": _med(voff), "on": _med(von), "on_runs": von, "off_runs": voff,
                     "on_over_off": (_med(von) / _med(voff)) if von and voff and _med(voff) else None,
                     "pair_ratios": [round(x, 4) for x in pairs],
                     "on_over_direct": (_med(von) / dv) if von and dv else None,
                     "on_over_peer": (_med(von) / pv) if von and pv else None})
    return rows


_fmt = bench._fmt


def _ratio(x):
    return "—" if x is None else "%.3f×" % x


print_md = bench.print_md


def print_overhead(R):
    P = R["overhead"]
    rows = P["summary"]
    print("\n%s  N=%d round trips, %d MB flood, %d reps on/off interleaved (ABBA), medians over reps; "
          "%s cpus, %s" % ("persisting records (on: persist = true, off: persist = false; both record)"
                        if COMPARE == "persist" else "recording overhead", N, MB, REPS, R["meta"]["cpus"], R["meta"]["date"]))
    hdr = ["metric", "direct (floor)", "jupyter_server (peer)", "kgate records off", "kgate records on",
           "on/off", "on/off per rep (min–max)", "on/direct", "on/peer"]
    out = []
    for r in rows:
        pr = r["pair_ratios"]
        out.append([r["metric"], _fmt(r["direct"], r["format"]), _fmt(r["peer"], r["format"]),
                    _fmt(r["off"], r["format"]), _fmt(r["on"], r["format"]), _ratio(r["on_over_off"]),
                    ("%.3f–%.3f" % (min(pr), max(pr))) if pr else "—",
                    _ratio(r["on_over_direct"]), _ratio(r["on_over_peer"])])
    out.append(["kgate RSS after the runs (MB)", "—", "—", _fmt(P.get("rss_end_mb_off"), "1"),
                _fmt(P.get("rss_end_mb_on"), "1"), "—", "—", "—", "—"])
    out.append(["job records retained after the runs", "—", "—", str(P.get("jobs_retained_off", "—")),
                str(P.get("jobs_retained_on", "—")), "—", "—", "—", "—"])
    print_md(hdr, out)
    per = []
    for a, b in zip(P["on"], P["off"]):
        la, lb = a.get("latency") or {}, b.get("latency") or {}
        fa, fb = a.get("flood_fast") or {}, b.get("flood_fast") or {}
        cpu = lambda x: _fmt(x["gateway_cpu_s"] * 1e3, "int") if "gateway_cpu_s" in x else "—"
        per.append([str(a["rep"] + 1), "on, off" if a.get("first") else "off, on",
                    _fmt(la.get("median_us"), "int"), _fmt(lb.get("median_us"), "int"), cpu(la), cpu(lb),
                    _fmt(fa.get("seconds"), "s"), _fmt(fb.get("seconds"), "s"), cpu(fa), cpu(fb),
                    str(a.get("jobs_retained", "—")), _fmt(a.get("rss_mb"), "1"), _fmt(b.get("rss_mb"), "1")])
    if per:
        print("\nper rep (on | off):")
        print_md(["rep", "order", "round trip median µs on", "off", "latency-run CPU ms on", "off",
                  "flood s (UTF-8 check off) on", "off", "its CPU ms on", "off", "records retained on",
                  "RSS MB on", "off"], per, right_from=2)
    print("peer = jupyter_server with iopub rate limits lifted (once). direct and peer ran once each, after the kgate reps.")
    print("overhead part: %.0f s" % P.get("seconds", 0))


# ---------------------------------------------------------------- part 2: memory

class Rest:
    """A keep-alive HTTP client for kgate's API (one connection, reopened on error)."""

    def __init__(self, url, token):
        host, port = url.split("//", 1)[1].rsplit(":", 1)
        self.host, self.port, self.token = host, int(port), token
        self.conn = None

    def call(self, method, path, body=None, timeout=90):
        data = None if body is None else json.dumps(body).encode()
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            try:
                self.conn.request(method, path, body=data, headers={"Authorization": "token " + self.token,
                                                                    "Content-Type": "application/json"})
                r = self.conn.getresponse()
                raw = r.read()
                if r.getheader("Connection", "").lower() == "close":
                    self.conn.close()
                    self.conn = None
                return r.status, (json.loads(raw) if raw else None)
            except (http.client.HTTPException, ConnectionError, OSError):
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
                if attempt:
                    raise

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class Sampler(threading.Thread):
    """VmRSS of one pid every `every` seconds: [(t, cells_done, rss_kb)]."""

    def __init__(self, pid, progress, every=1.0):
        super().__init__(daemon=True)
        self.pid, self.progress, self.every = pid, progress, every
        self.samples, self.stop_evt = [], threading.Event()
        self.t0 = time.monotonic()

    def read(self):
        with open("/proc/%d/status" % self.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return None

    def run(self):
        while not self.stop_evt.is_set():
            try:
                self.samples.append((round(time.monotonic() - self.t0, 2), self.progress[0], self.read()))
            except OSError:
                return
            self.stop_evt.wait(self.every)


def part_memory(R, tmp, binary, live, errors):
    t_part = time.monotonic()
    M = R["memory"] = {"settings": {"cells": CELLS, "cell_bytes": CELL_BYTES, "max_jobs": MAX_JOBS,
                                    "budget_bytes": BUDGET_BYTES, "job_output_bytes": JOB_OUTPUT_BYTES,
                                    "via": "POST /api/kgate/kernels/{id}/execute, agent bench, wait 60"}}
    s = Kgate(binary, tmp, "kgate-memory", records_config(True))
    live.append(s)
    log("memory: starting kgate (records on, default limits)")
    s.start()
    time.sleep(0.5)
    M["rss_no_kernel_kb"] = Sampler(s.proc.pid, [0]).read()
    api = Rest(s.url, s.token)
    st, k = api.call("POST", "/api/kernels", {"name": "python3"}, timeout=90)
    if st != 201 and st != 200:
        raise StepError("POST /api/kernels answered %s: %s" % (st, k))
    kid = k["id"]
    log("memory: kernel %s" % kid)
    # one tiny cell proves the kernel is up (the agent path waits for it), then the baseline
    st, j = api.call("POST", "/api/kgate/kernels/%s/execute" % kid, {"code": "1+1", "agent": "bench", "wait": 60})
    if st != 200 or (j or {}).get("status") != "ok":
        raise StepError("warm-up cell: HTTP %s %s" % (st, json.dumps(j)[:400]))
    time.sleep(1.0)
    progress = [0]
    samp = Sampler(s.proc.pid, progress)
    M["rss_baseline_kb"] = samp.read()
    log("memory: baseline RSS %.1f MB (one kernel, one tiny cell run); running %d cells of %d bytes"
        % (M["rss_baseline_kb"] / 1024, CELLS, CELL_BYTES))
    samp.start()
    code = "print('x' * %d)" % (CELL_BYTES - 1)   # prints CELL_BYTES bytes with the newline
    statuses, busy_retries, per_cell, curve = {}, 0, [], [(0, M["rss_baseline_kb"])]
    every = max(1, CELLS // 10)
    early = {50, 100, 200, 300, 500}   # the ramp: records fill budget_bytes within the first few hundred cells
    last_job = None
    t_cells = time.monotonic()
    try:
        for i in range(CELLS):
            t = time.perf_counter()
            give_up = time.monotonic() + 30
            while True:
                st, j = api.call("POST", "/api/kgate/kernels/%s/execute" % kid,
                                 {"code": code, "agent": "bench", "wait": 60})
                if st == 409 and (j or {}).get("refusal") == "busy" and time.monotonic() < give_up:
                    busy_retries += 1   # the previous cell's reply/idle not both in yet
                    time.sleep(0.002)
                    continue
                break
            if st != 200:
                raise StepError("cell %d: HTTP %s %s" % (i + 1, st, json.dumps(j)[:400]))
            if j.get("status") == "running":
                raise StepError("cell %d (%s) still running after wait=60" % (i + 1, j.get("job")))
            per_cell.append(time.perf_counter() - t)
            statuses[j["status"]] = statuses.get(j["status"], 0) + 1
            last_job = j
            progress[0] = i + 1
            if (i + 1) in early and (i + 1) % every:
                curve.append((i + 1, samp.read()))
            if (i + 1) % every == 0 or i + 1 == CELLS:
                rss = samp.read()
                curve.append((i + 1, rss))
                el = time.monotonic() - t_cells
                log("memory: %d/%d cells, %.0f s, RSS %.1f MB, %s" % (i + 1, CELLS, el, rss / 1024, last_job["job"]))
            if s.proc.poll() is not None:
                raise StepError("kgate exited with status %s after %d cells; log tail:\n%s"
                                % (s.proc.returncode, i + 1, bench.tail(s.log_path)))
    finally:
        M["cells_done"] = progress[0]
        M["cells_seconds"] = round(time.monotonic() - t_cells, 1)
        samp.stop_evt.set()
        samp.join(timeout=5)
        M["samples"] = samp.samples
        M["curve"] = curve
        M["statuses"] = statuses
        M["busy_retries"] = busy_retries
        if per_cell:
            ps = sorted(per_cell)
            M["cell_ms_median"] = round(statistics.median(ps) * 1e3, 2)
            M["cell_ms_p90"] = round(ps[len(ps) * 9 // 10] * 1e3, 2)
            M["cell_ms_max"] = round(ps[-1] * 1e3, 2)
    time.sleep(1.0)
    M["rss_final_kb"] = samp.read()
    rss_all = [x[2] for x in samp.samples if x[2]] + [x[1] for x in curve] + [M["rss_final_kb"]]
    M["rss_max_kb"] = max(rss_all)
    # last cell's record: the output tail is capped and says how much was cut
    if last_job:
        M["last_job"] = {"job": last_job["job"], "status": last_job["status"],
                         "output_len": len(last_job.get("output") or ""), "output_cut": last_job.get("output_cut")}
        if M["last_job"]["output_len"] + (last_job.get("output_cut") or 0) != CELL_BYTES:
            errors.append({"step": "memory: last record", "error": "output kept %d + cut %s != %d bytes printed"
                           % (M["last_job"]["output_len"], last_job.get("output_cut"), CELL_BYTES)})
    # the records still answer, and hold no more than max_jobs
    t = time.perf_counter()
    st, jobs = api.call("GET", "/api/kgate/jobs", timeout=60)
    M["jobs_list_ms"] = round((time.perf_counter() - t) * 1e3, 1)
    if st != 200 or not isinstance(jobs, dict) or "jobs" not in jobs:
        errors.append({"step": "memory: GET /api/kgate/jobs", "error": "HTTP %s %s" % (st, str(jobs)[:300])})
    else:
        js = jobs["jobs"]
        M["jobs_retained"] = len(js)
        M["jobs_oldest"], M["jobs_newest"] = (js[0]["job"], js[-1]["job"]) if js else (None, None)
        if len(js) > MAX_JOBS:
            errors.append({"step": "memory: retained records",
                           "error": "%d records retained > max_jobs %d" % (len(js), MAX_JOBS)})
    st, one = api.call("GET", "/api/kgate/jobs/%s" % M.get("jobs_oldest"), timeout=30)
    M["oldest_record_http"] = st
    api.close()
    if s.proc.poll() is not None:
        errors.append({"step": "memory", "error": "kgate exited with status %s" % s.proc.returncode})
    s.stop()
    live.remove(s)
    M["seconds"] = round(time.monotonic() - t_part, 1)


def print_memory(R):
    M = R["memory"]
    mb = lambda kb: "—" if kb is None else "%.1f" % (kb / 1024.0)
    # docs/dev/records.md: RSS stays under 16 MiB + budget_bytes + 48 MiB of working memory (the messages
    # in flight, the parser's buffers, allocator slack), whatever the kernels print.
    cap = (16 << 10) + BUDGET_BYTES / 1024 + (48 << 10)
    print("\nmemory: one kgate (records on, default limits), one kernel, %s cells printing %s bytes each, "
          "via the agent path" % ("{:,}".format(M["cells_done"]), "{:,}".format(CELL_BYTES)))
    rows = [
        ["cells run (of %s)" % "{:,}".format(CELLS), "{:,}".format(M["cells_done"])],
        ["wall time for the cells (s)", "%.1f" % M["cells_seconds"]],
        ["per cell, median / p90 / max (ms)", "%s / %s / %s" % (M.get("cell_ms_median"), M.get("cell_ms_p90"), M.get("cell_ms_max"))],
        ["cell statuses", ", ".join("%s %s" % (k, "{:,}".format(v)) for k, v in sorted(M["statuses"].items()))],
        ["409 busy refusals retried", "{:,}".format(M["busy_retries"])],
        ["kgate RSS, no kernel (MB)", mb(M["rss_no_kernel_kb"])],
        ["kgate RSS baseline, one kernel, before the cells (MB)", mb(M["rss_baseline_kb"])],
        ["kgate RSS max (MB; sampled every 1 s)", mb(M["rss_max_kb"])],
        ["kgate RSS final, 1 s after the last cell (MB)", mb(M["rss_final_kb"])],
        ["max − baseline (MB)", mb(M["rss_max_kb"] - M["rss_baseline_kb"])],
        ["budget_bytes (MB)", mb(BUDGET_BYTES / 1024)],
        ["documented cap (docs/dev/records.md: 16 MiB + budget_bytes + 48 MiB working memory; no client here)", mb(cap)],
        ["max RSS within the documented cap", "yes" if M["rss_max_kb"] <= cap else "NO (by %s MB)" % mb(M["rss_max_kb"] - cap)],
        ["GET /api/kgate/jobs: records retained (max_jobs %d)" % MAX_JOBS,
         "%s (%s … %s), answered in %s ms" % (M.get("jobs_retained"), M.get("jobs_oldest"), M.get("jobs_newest"), M.get("jobs_list_ms"))],
    ]
    if M.get("last_job"):
        lj = M["last_job"]
        rows.append(["last record: output kept / cut (bytes)", "%s / %s (%s, %s)" % (
            "{:,}".format(lj["output_len"]), "{:,}".format(lj["output_cut"] or 0), lj["job"], lj["status"])])
    print_md(["metric", "value"], rows, right_from=2)
    print("\nRSS curve (MB):")
    print_md(["cells done", "kgate RSS (MB)"], [["{:,}".format(c), mb(r)] for c, r in M["curve"]])
    print("memory part: %.0f s" % M["seconds"])


# ---------------------------------------------------------------- main

def main():
    if len(sys.argv) > 1:
        return bench.print_usage(__doc__, sys.argv[1])
    bench.interrupt_on_stop_signals()

    if COMPARE not in ("records", "persist"):
        print("records: REC_COMPARE must be records or persist, not %r" % COMPARE, file=sys.stderr)
        return 2
    bad = [p for p in PARTS if p not in ("overhead", "memory")]
    if bad or not PARTS:
        print("records: REC_PARTS must name overhead and/or memory, not %r" % ",".join(bad), file=sys.stderr)
        return 2
    for f in (bench.CLIENT, bench.PY):
        if not os.path.exists(f):
            print("records: missing %s" % f, file=sys.stderr)
            return 2
    if not os.access(KGATE_BIN, os.X_OK):
        print("records: %s is missing or not executable (build it: cmake --build build --target kgate)" % KGATE_BIN,
              file=sys.stderr)
        return 2

    tmp = tempfile.mkdtemp(prefix="kgate-records-")
    binary = os.path.join(tmp, "kgate")
    shutil.copy2(KGATE_BIN, binary)   # one file for every server of the run, whatever the build does meanwhile
    R = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(), "cpus": os.cpu_count(),
                  "kernel": platform.release(), "loadavg_start": open("/proc/loadavg").read().split()[:3],
                  "kgate_bin": KGATE_BIN,
                  "kgate_mtime": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(os.path.getmtime(KGATE_BIN))),
                  "kgate_version": subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip(),
                  "client": os.path.relpath(bench.CLIENT, _REPO), "parts": PARTS, "versions": bench.versions()},
         "errors": []}
    live, interrupted = [], False
    try:
        for part, fn in (("overhead", part_overhead), ("memory", part_memory)):
            if part not in PARTS:
                continue
            try:
                bench.run_step(part, R["errors"], log, fn, R, tmp, binary, live, R["errors"])
            finally:
                for s in list(live):
                    try:
                        s.stop()
                    except Exception as e:
                        log("stopping %s: %s" % (s.label, e))
                    live.remove(s)
    except KeyboardInterrupt as e:
        interrupted = True
        log("interrupted (%s): stopping everything" % (str(e) or "Ctrl-C"))
    finally:
        bench.stop_all(live, tmp, R, KEEP_TMP, log)

    R["meta"]["seconds"] = round(time.monotonic() - T0, 1)
    R["meta"]["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    if "overhead" in R:
        R["overhead"]["summary"] = overhead_rows(R["overhead"])
        print_overhead(R)
    if "memory" in R and "cells_done" in R["memory"] and "rss_max_kb" in R["memory"]:
        print_memory(R)
    return bench.finish(R, OUT, interrupted)


if __name__ == "__main__":
    sys.exit(main())
