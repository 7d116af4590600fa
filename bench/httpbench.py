#!/usr/bin/python3
"""HTTP throughput: wrk against GET /api/kernels/{id} on kgate and on jupyter_server, side by side.

usage: bench/http.sh [--threads 2] [--connections 32] [--duration 10] [--reps 2] [--warmup 2]
                     [--profile auto|always|never] [--out FILE] [--keep-tmp]

Both servers run at once on 127.0.0.1, each with a token and one kernel (started with POST
/api/kernels, one kernel_info round trip over its websocket, then left idle). Every wrk run sends `Authorization: token T`:
  wrk -t THREADS -c CONNECTIONS -d DURATIONs --latency -H 'Authorization: token T' URL/api/kernels/ID
After a --warmup-second run on each, the measured runs alternate kgate, jupyter_server /
jupyter_server, kgate / ... (--reps of each); the table shows the median over the reps of
requests/s and of wrk's latency percentiles, plus the server's own CPU (utime+stime of all its
threads, /proc/PID/stat) per request. Every run must have 0 non-2xx responses and 0 socket errors.

Target: kgate requests/s >= 10x jupyter_server's. With --profile auto (the default) a miss runs
`perf record -g` on kgate over one more wrk run and prints perf report's top entries
(always: every time; never: not at all).

Exit status: 0 every run was clean (the target is reported, not an exit condition), 1 a run failed
(non-2xx, socket errors, a server died), 2 usage or setup (no wrk: apt-get install -y wrk),
130 interrupted. Raw JSON: bench/results/http-latest.json.
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
import bench  # noqa: E402
import load  # noqa: E402  (start_server, use_pdeathsig, die_with_parent, copy_kgate)

T0 = time.monotonic()


log = bench.logger("http", T0)


def _dur(s):
    m = re.match(r"([\d.]+)(us|ms|s|m)$", s)
    if not m:
        return None
    return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}[m.group(2)]   # -> ms


def parse_wrk(out):
    r = {}
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    r["rps"] = float(m.group(1)) if m else None
    m = re.search(r"(\d+) requests in ([\d.]+\w+), ([\d.]+\w+) read", out)
    if m:
        r["requests"] = int(m.group(1))
    m = re.search(r"Latency\s+(\S+)\s+(\S+)\s+(\S+)", out)
    if m:
        r["avg_ms"], r["stdev_ms"], r["max_ms"] = _dur(m.group(1)), _dur(m.group(2)), _dur(m.group(3))
    for p in ("50", "75", "90", "99"):
        m = re.search(r"^\s+%s%%\s+(\S+)" % p, out, re.M)
        r["p%s_ms" % p] = _dur(m.group(1)) if m else None
    m = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    r["non2xx"] = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    r["socket_errors"] = sum(int(x) for x in m.groups()) if m else 0
    return r


def wrk(server, kid, threads, conns, seconds, label=""):
    url = server.url + "/api/kernels/" + kid
    cmd = ["wrk", "-t%d" % threads, "-c%d" % conns, "-d%ds" % seconds, "--latency",
           "-H", "Authorization: token " + server.token, url]
    cpu0 = bench.cpu_s(server.proc.pid)
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, preexec_fn=load.die_with_parent)
    try:
        out, _ = p.communicate(timeout=seconds + 60)
    except subprocess.TimeoutExpired:
        bench.kill_tree(p, grace=2)
        raise bench.StepError("wrk on %s did not finish within %d s" % (server.label, seconds + 60))
    except BaseException:
        bench.kill_tree(p, grace=2)
        raise
    cpu = bench.cpu_s(server.proc.pid) - cpu0
    r = parse_wrk(out)
    r["server_cpu_s"] = round(cpu, 3)
    if r.get("requests"):
        r["cpu_us_per_request"] = round(cpu / r["requests"] * 1e6, 1)
    r["raw"] = out
    if p.returncode != 0 or r["rps"] is None:
        raise bench.StepError("wrk on %s exited %s:\n%s" % (server.label, p.returncode, out[-2000:]))
    if server.proc.poll() is not None:
        raise bench.StepError("%s exited with status %s during wrk" % (server.label, server.proc.returncode))
    log("%s%s: %.0f req/s, p50 %.3f ms, p99 %.3f ms, server CPU %.1f µs/req%s"
        % (server.label, label, r["rps"], r["p50_ms"] or -1, r["p99_ms"] or -1, r.get("cpu_us_per_request", -1),
           ", %d non-2xx, %d socket errors" % (r["non2xx"], r["socket_errors"]) if r["non2xx"] or r["socket_errors"] else ""))
    return r


def check_auth(server, kid):
    """The token is really required: without it GET /api/kernels/{id} is refused."""
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(server.url + "/api/kernels/" + kid, timeout=10) as r:
            code = r.status
    except urllib.error.HTTPError as e:
        code = e.code
    if code not in (401, 403):
        raise bench.StepError("%s answers GET /api/kernels/{id} without a token with %s" % (server.label, code))
    body = server.rest("GET", "/api/kernels/" + kid, timeout=10)
    return code, len(json.dumps(body))


def profile(server, kid, args, tmp):
    """perf record -g on the server process over one wrk run; returns perf report's top lines."""
    if not shutil.which("perf"):
        return {"error": "perf is not installed"}
    data = os.path.join(tmp, "perf.data")
    p = subprocess.Popen(["perf", "record", "-g", "-F", "999", "-o", data, "-p", str(server.proc.pid)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, preexec_fn=load.die_with_parent)
    time.sleep(0.5)
    try:
        r = wrk(server, kid, args.threads, args.connections, args.duration, " (under perf)")
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
        try:
            perf_out, _ = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            bench.kill_tree(p, grace=2)
            perf_out = ""
    if p.returncode not in (0, None) and not os.path.exists(data):
        return {"error": "perf record failed (%s): %s" % (p.returncode, perf_out[-500:])}
    out = {}
    for key, extra in (("self", ["--no-children"]), ("children", ["--children"])):
        rep = subprocess.run(["perf", "report", "-i", data, "--stdio", "--percent-limit", "1.5", "-g", "none",
                              "--sort", "dso,symbol", *extra], stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, timeout=120)
        # perf pads its columns to the terminal-less width: squeeze each line
        lines = [re.sub(r"(\s+-)+\s*$", "", re.sub(r"\s+", " ", ln)).strip() for ln in rep.stdout.splitlines()]
        out[key] = [ln[:180] for ln in lines if ln and not ln.startswith("#")][:40]
    out["wrk_under_perf"] = {k: v for k, v in r.items() if k != "raw"}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="bench/http.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--profile", choices=("auto", "always", "never"), default="auto")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "http-latest.json"))
    ap.add_argument("--keep-tmp", action="store_true")
    args = ap.parse_args(argv)
    if not shutil.which("wrk"):
        print("http: wrk is not installed (apt-get install -y wrk)", file=sys.stderr)
        return 2
    if not os.access(bench.KGATE_BIN, os.X_OK):
        print("http: no kgate binary at %s" % bench.KGATE_BIN, file=sys.stderr)
        return 2

    bench.interrupt_on_stop_signals()
    load.use_pdeathsig()
    bench.START_TIMEOUT = 60.0
    tmp = tempfile.mkdtemp(prefix="kgate-bench-http-")
    R = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpus": os.cpu_count(), "threads": args.threads,
                  "connections": args.connections, "duration_s": args.duration, "reps": args.reps,
                  "wrk": subprocess.run(["wrk", "--version"], capture_output=True, text=True).stdout.split("\n")[0],
                  "kgate_bin": bench.KGATE_BIN, "versions": bench.versions(), "loadavg_start": load.loadavg()},
         "runs": {"kgate": [], "jupyter_server": []}, "errors": []}
    live, interrupted = [], False
    try:
        load.copy_kgate(tmp)
        servers = {"kgate": load.start_server("kgate", tmp, "kgate", live=live, logf=log),
                   "jupyter_server": load.start_server("peer", tmp, "jupyter_server", live=live, logf=log)}
        kids = {}
        for name, s in servers.items():
            kids[name] = s.rest("POST", "/api/kernels", {"name": "python3"}, timeout=120)["id"]
        for name, s in servers.items():
            load.kernel_info_roundtrip(s, kids[name])
            code, nbytes = check_auth(s, kids[name])
            R["meta"]["%s_no_token_status" % name] = code
            R["meta"]["%s_model_bytes" % name] = nbytes
            R["meta"]["%s_rss_mb" % name] = bench.rss_mb(s.proc.pid)
        time.sleep(2)   # let the kernels' start settle
        for name, s in servers.items():
            wrk(s, kids[name], args.threads, args.connections, args.warmup, " (warm-up)")
        order = ["kgate", "jupyter_server"]
        for rep in range(args.reps):
            for name in (order if rep % 2 == 0 else order[::-1]):
                r = wrk(servers[name], kids[name], args.threads, args.connections, args.duration)
                R["runs"][name].append(r)
                if r["non2xx"] or r["socket_errors"]:
                    R["errors"].append({"step": "%s rep %d" % (name, rep + 1),
                                        "error": "%d non-2xx responses, %d socket errors"
                                        % (r["non2xx"], r["socket_errors"])})
        summary = summarize(R)
        ratio = summary.get("ratio_rps")
        if args.profile == "always" or (args.profile == "auto" and ratio is not None and ratio < 10):
            log("profiling kgate under wrk (ratio %.1f×)" % (ratio or 0))
            R["profile_kgate"] = profile(servers["kgate"], kids["kgate"], args, tmp)
        for name, s in servers.items():
            R["meta"]["%s_rss_end_mb" % name] = bench.rss_mb(s.proc.pid)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: stopping everything")
    except Exception as e:  # noqa: BLE001
        msg = str(e) if isinstance(e, bench.StepError) else "%s: %s" % (type(e).__name__, e)
        log("FAILED: %s" % msg)
        R["errors"].append({"step": "http", "error": msg})
    finally:
        bench.stop_all(live, tmp, R, args.keep_tmp, log)
    R["meta"]["loadavg_end"] = load.loadavg()
    R["meta"]["seconds"] = round(time.monotonic() - T0, 1)
    R["summary"] = summarize(R)
    print_table(R)
    return bench.finish(R, args.out, interrupted)


def summarize(R):
    out = {}
    for name, runs in R["runs"].items():
        if not runs:
            continue
        s = {}
        for key in ("rps", "p50_ms", "p75_ms", "p90_ms", "p99_ms", "avg_ms", "max_ms", "cpu_us_per_request"):
            vals = [r[key] for r in runs if r.get(key) is not None]
            s[key] = statistics.median(vals) if vals else None
        s["rps_each"] = [r["rps"] for r in runs]
        s["non2xx"] = sum(r["non2xx"] for r in runs)
        s["socket_errors"] = sum(r["socket_errors"] for r in runs)
        out[name] = s
    k, p = out.get("kgate"), out.get("jupyter_server")
    if k and p and k["rps"] and p["rps"]:
        out["ratio_rps"] = round(k["rps"] / p["rps"], 2)
    return out


def print_table(R):
    S = R.get("summary") or {}
    k, p = S.get("kgate") or {}, S.get("jupyter_server") or {}
    m = R["meta"]

    def f(v, fmt):
        return "—" if v is None else fmt % v

    rows = [("requests/s (median of reps)", "rps", "{:,.0f}", True),
            ("requests/s, each rep", "rps_each", None, False),
            ("latency p50 (ms)", "p50_ms", "%.3f", True), ("latency p90 (ms)", "p90_ms", "%.3f", True),
            ("latency p99 (ms)", "p99_ms", "%.3f", True), ("latency max (ms)", "max_ms", "%.2f", True),
            ("server CPU per request (µs, all its threads)", "cpu_us_per_request", "%.1f", True),
            ("non-2xx responses (all reps)", "non2xx", "%d", False),
            ("socket errors (all reps)", "socket_errors", "%d", False)]
    hdr = ["metric", "kgate", "jupyter_server", "kgate/jupyter_server"]
    table = []
    for name, key, fmt, ratio in rows:
        kv, pv = k.get(key), p.get(key)
        if key == "rps_each":
            cells = [", ".join("{:,.0f}".format(x) for x in (kv or [])) or "—",
                     ", ".join("{:,.0f}".format(x) for x in (pv or [])) or "—"]
        elif fmt.startswith("{"):
            cells = ["—" if kv is None else fmt.format(kv), "—" if pv is None else fmt.format(pv)]
        else:
            cells = [f(kv, fmt), f(pv, fmt)]
        r = "%.2f×" % (kv / pv) if ratio and isinstance(kv, (int, float)) and pv else "—"
        table.append([name] + cells + [r])
    w = [max(len(r[i]) for r in table + [hdr]) for i in range(4)]
    line = lambda c: "| " + " | ".join(x.ljust(w[i]) if i == 0 else x.rjust(w[i]) for i, x in enumerate(c)) + " |"  # noqa: E731
    print("\nwrk -t%d -c%d -d%ds --latency, GET /api/kernels/{id} with Authorization: token; 1 kernel each; "
          "%d reps interleaved; %s cpus; %s" % (m["threads"], m["connections"], m["duration_s"], m["reps"], m["cpus"],
                                                m["date"]))
    print(line(hdr))
    print("|" + "|".join(("-" * (w[i] + 1) + ":") if i else ("-" * (w[i] + 2)) for i in range(4)) + "|")
    for r in table:
        print(line(r))
    ratio = S.get("ratio_rps")
    if ratio is not None:
        print("\ntarget: kgate requests/s >= 10x jupyter_server: %s (%.1f×)" % ("met" if ratio >= 10 else "NOT met", ratio))
    prof = R.get("profile_kgate")
    if prof:
        print("\nperf profile of kgate under wrk:")
        if "error" in prof:
            print("  " + prof["error"])
        else:
            print("  self time (dso, symbol):")
            for ln in prof["self"][:25]:
                print("   " + ln)
            print("  with children (dso, symbol):")
            for ln in prof["children"][:25]:
                print("   " + ln)


if __name__ == "__main__":
    sys.exit(main())
