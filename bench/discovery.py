#!/usr/bin/python3
"""Kernel-discovery benchmark: what listing kernelspecs costs on kgate, warm and cold.

usage: bench/discovery.sh [-h]      (runs this file with /usr/bin/python3)

Part "cold": DISC_COLD rounds, each running once, one after another: `kgate kernelspecs`, `kgate
kernelspecs --json`, `jupyter kernelspec list` and `jupyter kernelspec list --json` (Debian's
jupyter_client: /usr/bin/jupyter-kernelspec if it exists, else `/usr/bin/python3 -m
jupyter_client.kernelspecapp`). Wall time is spawn to exit; CPU is user+sys of the command and
the children it waited for (kgate's interpreter probes). The two do different work: kgate probes
every Python interpreter it finds, jupyter only reads kernel.json files. Counts of entries and
interpreters come from the --json outputs.

Part "start": DISC_STARTS kgate daemons (`kgate serve --port 0`, the port from the `listening on`
stderr line), each timed from spawn to the first `GET /api/kgate/kernelspecs` that answers with
"probed": true (the request waits for the first full discovery, at most request_wait_ms, then
is repeated). Beside them DISC_PEER_STARTS jupyter_servers, timed from spawn to the first 200 on
`GET /api/kernelspecs` (polled every 5 ms). Starts alternate kgate/jupyter_server.

Part "warm": one kgate (after its first full discovery), one jupyter_server and, with
DISC_GATEWAY=1, one jupyter_server with --gateway-url pointing at that kgate. Each gets one
keep-alive connection (Python http.client). 50 warm-up requests per series, then DISC_N timed
requests of each series: GET /api/kernelspecs on all three, GET /api on kgate and jupyter_server
(the floor: client + HTTP), GET /api/kgate/kernelspecs on kgate. The series are interleaved in
blocks of 100 requests, so all of them see the same machine load. Server CPU per request is the
server process's on-CPU time over its blocks (the sum of its threads' /proc/PID/task/*/schedstat).
Target: kgate's GET /api/kernelspecs median <= 1 ms; reported, it does not set the exit status.

Every server runs with private Jupyter runtime/config/data dirs (bench.py's private_env), so
kgate, jupyter_server and both command-line tools see the same kernelspec directories.

Environment:
  KGATE_BIN         kgate binary (default <repo>/build/gateway/kgate; copied into the temp dir first)
  DISC_PARTS        cold,start,warm (default all three, run in that order)
  DISC_N            timed requests per warm series (default 1000)
  DISC_COLD         cold rounds (default 5)
  DISC_STARTS       kgate daemon starts (default 5)
  DISC_PEER_STARTS  jupyter_server starts (default 3)
  DISC_GATEWAY      1 (default): also jupyter_server --gateway-url kgate in the warm part; 0: not
  DISC_BUDGET       total time budget, seconds (default 110; a part out of time stops early, noted)
  DISC_OUT          results JSON (default bench/results/discovery-latest.json)
  DISC_KEEP_TMP=1   keep the temp dir (server logs, configs)

Exit status: 0 every step ran, 1 a step failed (listed under "errors"), 2 usage/setup,
130 interrupted (no JSON written).
"""
import http.client
import json
import math
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True   # no bench/__pycache__ left behind
import bench  # noqa: E402  (Server, kill_tree, stop_all, free_port, private_env, rss_mb, cpu_s, _fmt)

_REPO = os.path.dirname(HERE)
KGATE_BIN = os.path.abspath(os.environ.get("KGATE_BIN", os.path.join(_REPO, "build", "gateway", "kgate")))
PARTS = [p.strip() for p in os.environ.get("DISC_PARTS", "cold,start,warm").split(",") if p.strip()]
N = max(10, int(os.environ.get("DISC_N", "1000")))
COLD = max(1, int(os.environ.get("DISC_COLD", "5")))
STARTS = max(1, int(os.environ.get("DISC_STARTS", "5")))
PEER_STARTS = max(1, int(os.environ.get("DISC_PEER_STARTS", "3")))
GATEWAY = os.environ.get("DISC_GATEWAY", "1") != "0"
BUDGET = float(os.environ.get("DISC_BUDGET", "110"))
OUT = os.environ.get("DISC_OUT", os.path.join(HERE, "results", "discovery-latest.json"))
KEEP_TMP = os.environ.get("DISC_KEEP_TMP") == "1"

WARMUP = 50
BLOCK = 100
POLL = 0.005
TARGET_US = 1000.0
T0 = time.monotonic()
LISTEN_RE = re.compile(r"listening on (http://[^/\s]+)/")
TABLE_RE = re.compile(r"(\d+) kernelspecs, (\d+) launchable; (\d+) interpreters checked in (\d+) ms")

StepError = bench.StepError


log = bench.logger("discovery", T0)


def remaining():
    return BUDGET - (time.monotonic() - T0)


def jupyter_kernelspec_cmd():
    if os.access("/usr/bin/jupyter-kernelspec", os.X_OK):
        return ["/usr/bin/jupyter-kernelspec"]
    return [bench.PY, "-m", "jupyter_client.kernelspecapp"]


# ---------------------------------------------------------------- stats and tables

def pct(xs, p):
    """Nearest-rank percentile."""
    s = sorted(xs)
    return s[max(0, math.ceil(p / 100.0 * len(s)) - 1)] if s else None


def stats(xs):
    if not xs:
        return {}
    return {"n": len(xs), "median": statistics.median(xs), "p90": pct(xs, 90), "p99": pct(xs, 99),
            "max": max(xs), "min": min(xs), "mean": statistics.fmean(xs)}


def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def _r(x):
    return "—" if x is None else "%.3f×" % x


def _f(v, fmt="int"):
    if isinstance(v, str):
        return v
    return bench._fmt(v, fmt)


print_md = bench.print_md


# ---------------------------------------------------------------- servers

class Kgate(bench.Server):
    """kgate serve --port 0 --config FILE, token in $KGATE_TOKEN, URL from the stderr log line."""

    def __init__(self, binary, tmp, label):
        super().__init__("kgate", tmp, label)
        self.config = os.path.join(self.root, "kgate.toml")
        with open(self.config, "w") as f:
            f.write("# written by bench/discovery.py: kgate's defaults\n")
        self.argv = [binary, "serve", "--ip", "127.0.0.1", "--port", "0", "--config", self.config]
        self.env["KGATE_TOKEN"] = self.token
        self.port = self.url = None

    def start(self, timeout=30.0):
        """Spawn; returns (t0, ms to the 'listening on' line)."""
        t0 = spawn(self)
        while True:
            with open(self.log_path, errors="replace") as f:
                m = LISTEN_RE.search(f.read())
            if m:
                self.url = m.group(1)
                self.port = int(self.url.rsplit(":", 1)[1])
                return t0, (time.perf_counter() - t0) * 1e3
            if self.proc.poll() is not None:
                raise StepError("%s exited with status %s before logging 'listening on'; log tail:\n%s"
                                % (self.label, self.proc.returncode, bench.tail(self.log_path)))
            if time.perf_counter() - t0 > timeout:
                raise StepError("%s: no 'listening on' line within %gs; log tail:\n%s"
                                % (self.label, timeout, bench.tail(self.log_path)))
            time.sleep(POLL)


def spawn(s):
    logf = open(s.log_path, "wb")
    t0 = time.perf_counter()
    try:
        s.proc = subprocess.Popen(s.argv, cwd=s.root, env=s.env, stdin=subprocess.DEVNULL,
                                  stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as e:
        raise StepError("%s: cannot spawn %s: %s" % (s.label, s.argv[0], e))
    finally:
        logf.close()
    return t0


def get_json(s, path, timeout=10):
    req = urllib.request.Request(s.url + path, headers={"Authorization": "token " + s.token})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, json.loads(r.read() or b"null")


def poll_until(s, path, ok, t0, timeout=30.0):
    """GET path (a fresh connection each time) until ok(body); returns (ms since t0, body, tries)."""
    last, tries = None, 0
    while True:
        tries += 1
        try:
            status, body = get_json(s, path, timeout=max(1.0, timeout - (time.perf_counter() - t0)))
            if status == 200 and ok(body):
                return (time.perf_counter() - t0) * 1e3, body, tries
            last = "HTTP %d, not there yet" % status
        except urllib.error.HTTPError as e:
            last = "HTTP %d" % e.code
        except (urllib.error.URLError, OSError, ValueError) as e:
            last = str(getattr(e, "reason", e))
        if s.proc.poll() is not None:
            raise StepError("%s exited with status %s before GET %s was ok (last: %s); log tail:\n%s"
                            % (s.label, s.proc.returncode, path, last, bench.tail(s.log_path)))
        if time.perf_counter() - t0 > timeout:
            raise StepError("%s: GET %s not ok within %gs (last: %s); log tail:\n%s"
                            % (s.label, path, timeout, last, bench.tail(s.log_path)))
        time.sleep(POLL)


def full_catalog(body):
    return isinstance(body, dict) and body.get("probed") is True


def any_kernelspecs(body):
    return isinstance(body, dict) and isinstance(body.get("kernelspecs"), dict)


def cpu_ns(pid):
    """On-CPU time of every thread of pid, ns (/proc/PID/task/*/schedstat; exact, unlike the 10 ms ticks
    of utime+stime). Threads that exited meanwhile drop out: fine for servers whose threads live on."""
    total = 0
    for t in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, t)) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def stop(live, s):
    try:
        s.stop()
    except Exception as e:
        log("stopping %s: %s" % (s.label, e))
    if s in live:
        live.remove(s)


# ---------------------------------------------------------------- part 1: cold

def run_cmd(argv, env, cwd, timeout=60):
    """(wall ms, cpu ms of it and its waited-for children, rc, stdout, stderr)."""
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise StepError("%s: no exit within %gs" % (" ".join(argv), timeout))
    finally:
        if p.poll() is None:
            bench.kill_tree(p, grace=1)
    wall = (time.perf_counter() - t0) * 1e3
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime) * 1e3
    return wall, cpu, p.returncode, out, err


def part_cold(R, tmp, binary, live, errors):
    P = R["cold"] = {"runs": [], "jupyter_cmd": jupyter_kernelspec_cmd()}
    root = tempfile.mkdtemp(prefix="cold-", dir=tmp)
    env = bench.private_env(root)
    jk = jupyter_kernelspec_cmd()
    cmds = [("kgate", [binary, "kernelspecs"]), ("kgate_json", [binary, "kernelspecs", "--json"]),
            ("jupyter", jk + ["list"]), ("jupyter_json", jk + ["list", "--json"])]
    for rnd in range(COLD):
        if remaining() < 15:
            errors.append({"step": "cold", "error": "out of time after %d of %d rounds (DISC_BUDGET=%gs)"
                           % (rnd, COLD, BUDGET)})
            break
        for key, argv in cmds:
            wall, cpu, rc, out, err = run_cmd(argv, env, root)
            run = {"round": rnd, "cmd": key, "wall_ms": round(wall, 2), "cpu_ms": round(cpu, 1), "rc": rc}
            if key == "kgate":
                m = TABLE_RE.search(out)
                if m:
                    run.update(entries=int(m.group(1)), launchable=int(m.group(2)),
                               interpreters=int(m.group(3)), took_ms=int(m.group(4)))
            elif key == "kgate_json":
                try:
                    j = json.loads(out)
                    run.update(entries=len(j["entries"]), launchable=sum(1 for e in j["entries"] if e["launchable"]),
                               interpreters=len(j["interpreters"]), took_ms=j["took_ms"], probed=j["probed"],
                               interpreters_ok=sum(1 for i in j["interpreters"] if i.get("ok")),
                               with_ipykernel=sum(1 for i in j["interpreters"] if i.get("has_ipykernel")))
                    if rnd == 0:
                        P["kgate_catalog"] = [{"name": e["name"], "kind": e["kind"], "launchable": e["launchable"],
                                               "reason": e["reason"]} for e in j["entries"]]
                        P["kgate_interpreters"] = [i["path"] for i in j["interpreters"]]
                except (ValueError, KeyError) as e:
                    run["parse_error"] = str(e)
            elif key == "jupyter":
                run["entries"] = sum(1 for ln in out.splitlines()[1:] if ln.strip())
            else:
                try:
                    run["entries"] = len(json.loads(out)["kernelspecs"])
                    if rnd == 0:
                        P["jupyter_catalog"] = sorted(json.loads(out)["kernelspecs"])
                except (ValueError, KeyError) as e:
                    run["parse_error"] = str(e)
            # kgate kernelspecs exits 1 when nothing is launchable; that is a finding, not a failure here
            if rc not in (0, 1) or (rc == 1 and not key.startswith("kgate")) or "parse_error" in run \
                    or ("entries" not in run):
                errors.append({"step": "cold %s round %d" % (key, rnd),
                               "error": "exit %s; stderr tail:\n%s" % (rc, "\n".join(err.strip().splitlines()[-8:]))})
            P["runs"].append(run)
            log("cold %-12s round %d: %7.1f ms wall, %6.1f ms cpu%s" % (
                key, rnd, wall, cpu, (", took_ms %s" % run["took_ms"]) if "took_ms" in run else ""))


def cold_summary(P):
    def vals(cmd, k):
        return [r[k] for r in P["runs"] if r["cmd"] == cmd and k in r]
    S = {}
    for cmd in ("kgate", "kgate_json", "jupyter", "jupyter_json"):
        S[cmd] = {"wall_ms": stats(vals(cmd, "wall_ms")), "cpu_ms": stats(vals(cmd, "cpu_ms")),
                  "took_ms": stats(vals(cmd, "took_ms")),
                  "entries": (vals(cmd, "entries") or [None])[-1],
                  "launchable": (vals(cmd, "launchable") or [None])[-1],
                  "interpreters": (vals(cmd, "interpreters") or [None])[-1],
                  "interpreters_ok": (vals(cmd, "interpreters_ok") or [None])[-1],
                  "with_ipykernel": (vals(cmd, "with_ipykernel") or [None])[-1]}
    return S


def print_cold(R):
    P = R["cold"]
    S = P["summary"] = cold_summary(P)
    n = len([r for r in P["runs"] if r["cmd"] == "kgate"])
    print("\ncold discovery: one command per run, %d rounds (kgate, kgate --json, jupyter, jupyter --json in turn); "
          "%s cpus, %s" % (n, R["meta"]["cpus"], R["meta"]["date"]))
    k, kj, j, jj = S["kgate"], S["kgate_json"], S["jupyter"], S["jupyter_json"]
    med = lambda s, key: s[key].get("median")
    rng = lambda s: ("%.0f–%.0f" % (s["wall_ms"]["min"], s["wall_ms"]["max"])) if s["wall_ms"] else "—"
    hdr = ["metric", "jupyter kernelspec list", "kgate kernelspecs", "kgate/jupyter"]
    rows = [
        ["wall ms, median (table output)", _f(med(j, "wall_ms")), _f(med(k, "wall_ms")),
         _r(ratio(med(k, "wall_ms"), med(j, "wall_ms")))],
        ["wall ms, min–max (table output)", rng(j), rng(k), "—"],
        ["wall ms, median (--json)", _f(med(jj, "wall_ms")), _f(med(kj, "wall_ms")),
         _r(ratio(med(kj, "wall_ms"), med(jj, "wall_ms")))],
        ["CPU ms, median (user+sys, with the probes)", _f(med(j, "cpu_ms")), _f(med(k, "cpu_ms")),
         _r(ratio(med(k, "cpu_ms"), med(j, "cpu_ms")))],
        ["catalog took_ms, median (--json; min–max)", "—",
         ("%s (%.0f–%.0f)" % (_f(med(kj, "took_ms")), kj["took_ms"]["min"], kj["took_ms"]["max"]))
         if kj["took_ms"] else "—", "—"],
        ["kernelspecs listed", _f(jj["entries"]), _f(kj["entries"]), "—"],
        ["… of them launchable", "not checked", _f(kj["launchable"]), "—"],
        ["interpreters probed (ran; with ipykernel)", "0 (reads kernel.json only)",
         "%s (%s; %s)" % (_f(kj["interpreters"]), _f(kj["interpreters_ok"]), _f(kj["with_ipykernel"])), "—"],
    ]
    print_md(hdr, rows)
    print("jupyter = %s (Debian's jupyter_client %s)" % (" ".join(P["jupyter_cmd"]), R["meta"]["versions"].get(
        "jupyter_client")))


# ---------------------------------------------------------------- part 2: start

def part_start(R, tmp, binary, live, errors):
    P = R["start"] = {"kgate": [], "peer": []}
    order = []
    for i in range(max(STARTS, PEER_STARTS)):
        if i < STARTS:
            order.append("kgate")
        if i < PEER_STARTS:
            order.append("peer")
    for i, kind in enumerate(order):
        if remaining() < 15:
            errors.append({"step": "start", "error": "out of time after %d of %d starts (DISC_BUDGET=%gs)"
                           % (i, len(order), BUDGET)})
            break
        if kind == "kgate":
            s = Kgate(binary, tmp, "kgate-start")
            live.append(s)
            try:
                t0, listen_ms = s.start()
                full_ms, body, tries = poll_until(s, "/api/kgate/kernelspecs", full_catalog, t0)
                rec = {"listen_ms": round(listen_ms, 2), "full_ms": round(full_ms, 2), "requests": tries,
                       "took_ms": body.get("took_ms"), "entries": len(body.get("entries") or []),
                       "interpreters": len(body.get("interpreters") or []), "generation": body.get("generation"),
                       "rss_mb": bench.rss_mb(s.proc.pid)}
                P["kgate"].append(rec)
                log("start kgate: listening %.1f ms, full catalog %.1f ms (took_ms %s, %d request(s))"
                    % (listen_ms, full_ms, rec["took_ms"], tries))
            finally:
                stop(live, s)
        else:
            s = bench.Server("peer", tmp, "peer-start")
            live.append(s)
            try:
                t0 = spawn(s)
                ms, body, tries = poll_until(s, "/api/kernelspecs", any_kernelspecs, t0)
                rec = {"listing_ms": round(ms, 2), "requests": tries, "entries": len(body["kernelspecs"]),
                       "rss_mb": bench.rss_mb(s.proc.pid)}
                P["peer"].append(rec)
                log("start jupyter_server: first /api/kernelspecs %.1f ms (%d polls)" % (ms, tries))
            finally:
                stop(live, s)


def print_start(R):
    P = R["start"]
    k, p = P["kgate"], P["peer"]
    ks = {key: stats([r[key] for r in k if r.get(key) is not None]) for key in ("listen_ms", "full_ms", "took_ms", "rss_mb")}
    ps = {key: stats([r[key] for r in p if r.get(key) is not None]) for key in ("listing_ms", "rss_mb")}
    P["summary"] = {"kgate": ks, "peer": ps}
    med = lambda d, key: d[key].get("median")
    rng = lambda d, key: ("%.0f–%.0f" % (d[key]["min"], d[key]["max"])) if d[key] else "—"
    print("\ndaemon start to the first full kernelspec listing: %d kgate starts, %d jupyter_server starts, alternating"
          % (len(k), len(p)))
    hdr = ["metric", "jupyter_server", "kgate", "kgate/jupyter_server"]
    rows = [
        ["spawn → 'listening on' log line, median ms", "—", _f(med(ks, "listen_ms"), "1"), "—"],
        ["spawn → first full listing, median ms", _f(med(ps, "listing_ms")), _f(med(ks, "full_ms")),
         _r(ratio(med(ks, "full_ms"), med(ps, "listing_ms")))],
        ["spawn → first full listing, min–max ms", rng(ps, "listing_ms"), rng(ks, "full_ms"), "—"],
        ["the daemon's own discovery took_ms, median", "—", _f(med(ks, "took_ms")), "—"],
        ["kernelspecs in that listing", _f(p[-1]["entries"]) if p else "—",
         _f(k[-1]["entries"]) if k else "—", "—"],
        ["RSS at that moment, median MB", _f(med(ps, "rss_mb"), "1"), _f(med(ks, "rss_mb"), "1"),
         _r(ratio(med(ks, "rss_mb"), med(ps, "rss_mb")))],
    ]
    print_md(hdr, rows)
    print("kgate: GET /api/kgate/kernelspecs answering with \"probed\": true (the first request waits for the first full "
          "discovery); jupyter_server: the first 200 on GET /api/kernelspecs, polled every 5 ms.")


# ---------------------------------------------------------------- part 3: warm

class KeepAlive:
    """One keep-alive HTTP/1.1 connection with the server's token."""

    def __init__(self, s):
        self.s = s
        self.headers = {"Authorization": "token " + s.token}
        self.conn = None
        self.reconnects = -1

    def get(self, path):
        if self.conn is None:
            host, port = self.s.url.split("//", 1)[1].rsplit(":", 1)
            self.conn = http.client.HTTPConnection(host, int(port), timeout=30)
            self.reconnects += 1
        t0 = time.perf_counter()
        try:
            self.conn.request("GET", path, headers=self.headers)
            r = self.conn.getresponse()
            body = r.read()
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise StepError("%s: GET %s failed: %s" % (self.s.label, path, e))
        dt = (time.perf_counter() - t0) * 1e6
        if r.will_close:
            self.close()
        if r.status != 200:
            raise StepError("%s: GET %s answered HTTP %d: %s" % (self.s.label, path, r.status, body[:200]))
        return dt, body

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def part_warm(R, tmp, binary, live, errors):
    P = R["warm"] = {"n": N, "block": BLOCK, "warmup": WARMUP}
    kg = Kgate(binary, tmp, "kgate")
    live.append(kg)
    t0, _ = kg.start()
    ready_ms, cat, _ = poll_until(kg, "/api/kgate/kernelspecs", full_catalog, t0)
    P["kgate_full_catalog_ms"] = round(ready_ms, 1)
    P["kgate_catalog_took_ms"] = cat.get("took_ms")
    log("warm: kgate up, full catalog after %.0f ms" % ready_ms)
    peer = bench.Server("peer", tmp, "peer")
    live.append(peer)
    peer.start()
    log("warm: jupyter_server up after %.0f ms" % peer.cold_start_ms)
    gw = None
    if GATEWAY:
        gw = bench.Server("peer", tmp, "jsgw", extra_args=["--gateway-url=" + kg.url])
        gw.env["JUPYTER_GATEWAY_AUTH_TOKEN"] = kg.token   # GatewayClient.auth_token, kept out of argv
        live.append(gw)
        gw.start()
        log("warm: jupyter_server --gateway-url up after %.0f ms" % gw.cold_start_ms)

    clients = {"kgate": KeepAlive(kg), "peer": KeepAlive(peer)}
    servers = {"kgate": kg, "peer": peer}
    series = [("kgate", "/api/kernelspecs"), ("peer", "/api/kernelspecs"), ("kgate", "/api"), ("peer", "/api"),
              ("kgate", "/api/kgate/kernelspecs")]
    if gw:
        clients["gw"], servers["gw"] = KeepAlive(gw), gw
        series.insert(2, ("gw", "/api/kernelspecs"))
    S = {"%s %s" % k: {"server": k[0], "path": k[1], "us": [], "cpu_s": 0.0, "kgate_cpu_s": 0.0} for k in series}
    for key, path in series:   # one look at each answer, then the warm-up
        _, body = clients[key].get(path)
        j = json.loads(body)
        e = S["%s %s" % (key, path)]
        e["bytes"] = len(body)
        if path == "/api/kernelspecs":
            e["kernelspecs"] = len(j.get("kernelspecs") or {})
            e["default"] = j.get("default")
        elif path == "/api/kgate/kernelspecs":
            e["kernelspecs"] = len(j.get("entries") or [])
        for _ in range(WARMUP):
            clients[key].get(path)
    rounds = (N + BLOCK - 1) // BLOCK
    for rnd in range(rounds):
        if remaining() < 10:
            errors.append({"step": "warm", "error": "out of time after %d of %d rounds of %d requests (DISC_BUDGET=%gs)"
                           % (rnd, rounds, BLOCK, BUDGET)})
            break
        k = rnd % len(series)
        for key, path in series[k:] + series[:k]:   # a rotating order: no series always runs first
            e = S["%s %s" % (key, path)]
            s, c = servers[key], clients[key]
            n = min(BLOCK, N - len(e["us"]))
            cpu0 = cpu_ns(s.proc.pid)
            kcpu0 = cpu_ns(kg.proc.pid) if key == "gw" else 0
            for _ in range(n):
                e["us"].append(round(c.get(path)[0], 1))
            e["cpu_s"] += (cpu_ns(s.proc.pid) - cpu0) / 1e9
            if key == "gw":
                e["kgate_cpu_s"] += (cpu_ns(kg.proc.pid) - kcpu0) / 1e9
        log("warm: round %d/%d done" % (rnd + 1, rounds))
    for key, path in series:
        e = S["%s %s" % (key, path)]
        e["stats"] = stats(e["us"])
        e["cpu_us_per_request"] = e["cpu_s"] * 1e6 / len(e["us"]) if e["us"] else None
        e["kgate_cpu_us_per_request"] = e["kgate_cpu_s"] * 1e6 / len(e["us"]) if (e["us"] and key == "gw") else None
        e["reconnects"] = clients[key].reconnects
    for c in clients.values():
        c.close()
    P["series"] = S
    P["rss_mb"] = {k: bench.rss_mb(s.proc.pid) for k, s in servers.items()}
    log("warm: kgate GET /api/kernelspecs median %.0f µs, jupyter_server %.0f µs"
        % (S["kgate /api/kernelspecs"]["stats"]["median"], S["peer /api/kernelspecs"]["stats"]["median"]))


def print_warm(R):
    P = R["warm"]
    S = P["series"]
    gw = S.get("gw /api/kernelspecs")
    K, J = S["kgate /api/kernelspecs"], S["peer /api/kernelspecs"]
    print("\nwarm GET /api/kernelspecs: %d timed requests per column on one keep-alive connection per server "
          "(Python http.client, %d warm-up), interleaved in blocks of %d; µs; %s cpus, %s"
          % (N, WARMUP, BLOCK, R["meta"]["cpus"], R["meta"]["date"]))
    hdr = ["metric", "jupyter_server (peer)", "kgate", "kgate/peer"]
    if gw:
        hdr.append("jupyter_server --gateway-url kgate")
    rows = []

    def row(name, a, b, fmt="int", with_ratio=True, g=None):
        r = [name, _f(a, fmt), _f(b, fmt), _r(ratio(b, a)) if with_ratio else "—"]
        if gw:
            r.append(_f(g, fmt))
        rows.append(r)
    st = lambda e, k: e["stats"].get(k) if e and e.get("stats") else None
    for k, label in (("median", "median"), ("p90", "p90"), ("p99", "p99"), ("max", "max")):
        row("GET /api/kernelspecs %s µs" % label, st(J, k), st(K, k), g=st(gw, k))
    row("server CPU per request µs (its threads' on-CPU time / requests)", J["cpu_us_per_request"],
        K["cpu_us_per_request"], g=gw and gw["cpu_us_per_request"])
    if gw:
        row("… kgate's CPU per proxied request µs", None, None, with_ratio=False, g=gw["kgate_cpu_us_per_request"])
    row("response bytes", J["bytes"], K["bytes"], g=gw and gw["bytes"])
    row("kernelspecs listed", J["kernelspecs"], K["kernelspecs"], with_ratio=False, g=gw and gw["kernelspecs"])
    A, B = S["peer /api"], S["kgate /api"]
    row("GET /api median µs (client + HTTP + a small reply)", st(A, "median"), st(B, "median"))
    row("GET /api p90 µs", st(A, "p90"), st(B, "p90"))
    row("GET /api/kernelspecs median − GET /api median µs", st(J, "median") - st(A, "median"),
        st(K, "median") - st(B, "median"), with_ratio=False)
    C = S["kgate /api/kgate/kernelspecs"]
    rows.append(["GET /api/kgate/kernelspecs median / p90 µs (%d entries, %s bytes)" % (C["kernelspecs"], _f(C["bytes"])),
                 "—", "%s / %s" % (_f(st(C, "median")), _f(st(C, "p90"))), "—"] + (["—"] if gw else []))
    row("server RSS after the runs MB", P["rss_mb"]["peer"], P["rss_mb"]["kgate"], fmt="1",
        g=P["rss_mb"].get("gw"))
    print_md(hdr, rows)
    med = st(K, "median")
    P["target"] = {"kgate_median_us": med, "target_us": TARGET_US, "met": med is not None and med <= TARGET_US}
    print("target: kgate GET /api/kernelspecs median ≤ %.0f µs: %s (%s µs)"
          % (TARGET_US, "met" if P["target"]["met"] else "NOT met", _f(med)))
    rec = {k: v["reconnects"] for k, v in S.items() if v["reconnects"]}
    if rec:
        print("reconnects (server closed the keep-alive connection): %s" % rec)


# ---------------------------------------------------------------- main

def main():
    if len(sys.argv) > 1:
        return bench.print_usage(__doc__, sys.argv[1])
    bench.interrupt_on_stop_signals()

    bad = [p for p in PARTS if p not in ("cold", "start", "warm")]
    if bad or not PARTS:
        print("discovery: DISC_PARTS must name cold, start and/or warm, not %r" % ",".join(bad), file=sys.stderr)
        return 2
    if not os.path.exists(bench.PY):
        print("discovery: missing %s" % bench.PY, file=sys.stderr)
        return 2
    if not os.access(KGATE_BIN, os.X_OK):
        print("discovery: %s is missing or not executable (build it: cmake --build build --target kgate)" % KGATE_BIN,
              file=sys.stderr)
        return 2

    tmp = tempfile.mkdtemp(prefix="kgate-discovery-")
    binary = os.path.join(tmp, "kgate")
    for _ in range(20):   # the build may be relinking it right now
        try:
            shutil.copy2(KGATE_BIN, binary)
            if subprocess.run([binary, "--version"], capture_output=True, timeout=10).returncode == 0:
                break
        except (OSError, subprocess.SubprocessError):
            pass
        time.sleep(3)
    else:
        print("discovery: could not copy a working %s" % KGATE_BIN, file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
        return 2
    R = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(), "cpus": os.cpu_count(),
                  "kernel": platform.release(), "loadavg_start": open("/proc/loadavg").read().split()[:3],
                  "kgate_bin": KGATE_BIN,
                  "kgate_mtime": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(os.path.getmtime(KGATE_BIN))),
                  "kgate_version": subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip(),
                  "parts": PARTS, "n": N, "cold_rounds": COLD, "starts": STARTS, "peer_starts": PEER_STARTS,
                  "gateway": GATEWAY, "versions": bench.versions()},
         "errors": []}
    live, interrupted = [], False
    try:
        for part, fn in (("cold", part_cold), ("start", part_start), ("warm", part_warm)):
            if part not in PARTS:
                continue
            try:
                bench.run_step(part, R["errors"], log, fn, R, tmp, binary, live, R["errors"])
            finally:
                for s in list(reversed(live)):   # the --gateway-url server before the kgate behind it
                    stop(live, s)
    except KeyboardInterrupt as e:
        interrupted = True
        log("interrupted (%s): stopping everything" % (str(e) or "Ctrl-C"))
    finally:
        live.reverse()   # the --gateway-url server before the kgate behind it
        bench.stop_all(live, tmp, R, KEEP_TMP, log)

    R["meta"]["seconds"] = round(time.monotonic() - T0, 1)
    R["meta"]["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    for key, fn in (("cold", print_cold), ("start", print_start), ("warm", print_warm)):
        try:
            if key == "cold" and R.get("cold", {}).get("runs"):
                fn(R)
            elif key == "start" and (R.get("start", {}).get("kgate") or R.get("start", {}).get("peer")):
                fn(R)
            elif key == "warm" and R.get("warm", {}).get("series"):
                fn(R)
        except Exception as e:   # a partial run: print what can be printed
            R["errors"].append({"step": "table " + key, "error": "%s: %s" % (type(e).__name__, e)})
    return bench.finish(R, OUT, interrupted)


if __name__ == "__main__":
    sys.exit(main())
