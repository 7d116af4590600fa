#!/usr/bin/python3
"""Re-adoption benchmark (issue 18, docs/dev/readoption.md): how long a new kgate takes to give back N
kernels that outlived the old one, each answering an execute with its state.

usage: bench/readopt.sh [-h]          (run via readopt.sh; it calls this file with /usr/bin/python3)

Environment:
  KGATE_BIN        kgate binary (kgate-supervise beside it)   (default <repo>/build/gateway/kgate)
  READOPT_N        kernels                                     (default 20)
  READOPT_BUDGET   total time budget, seconds                  (default 280)
  READOPT_OUT      raw JSON                                    (default bench/results/readopt-latest.json)
  READOPT_KEEP_TMP=1  keep the temp dir (server logs)

One kgate (pool size 0) starts N kernels, all at once, and sets `x = i` in kernel i. Then, twice:
the kgate is stopped (first SIGTERM, then kill -9), a new kgate is spawned on the same state
directory and port, and the time is taken from the spawn to its first GET /api 200, and to the
moment every one of the N kernels has answered `print(x)` with its own i over a websocket (all N
asked at once, as soon as GET /api answers). jupyter_server has no counterpart: its kernels end
with it (and Enterprise Gateway's session persistence covers remote kernels only).
"""
import os
import signal
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the shared Server, process sweeping and finish)

N = max(1, int(os.environ.get("READOPT_N", "20")))
bench.BUDGET = float(os.environ.get("READOPT_BUDGET", "280"))
OUT = os.environ.get("READOPT_OUT", os.path.join(bench.HERE, "results", "readopt-latest.json"))
KEEP_TMP = os.environ.get("READOPT_KEEP_TMP") == "1"
log = bench.log


def run_code(server, kid, code, timeout=60):
    """stdout of `code` run in kernel kid over a websocket (kgate answers a starting kernel's
    channel once it is ready)."""
    ws = bench.open_channels(server, kid, timeout)
    try:
        return bench.ws_run(ws, code, "kernel " + kid)
    finally:
        ws.close()


def on_all(server, ids, fn):
    """fn(i, kid) on every kernel at once; raises the first failure."""
    errors = []

    def worker(i, kid):
        try:
            fn(i, kid)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append("%s: %s" % (kid, e))
    threads = [threading.Thread(target=worker, args=(i, kid)) for i, kid in enumerate(ids)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise bench.StepError("%d of %d kernels failed: %s" % (len(errors), len(ids), errors[0]))


def start_kernels(server):
    ids = [None] * N

    def one(i, _):
        ids[i] = server.rest("POST", "/api/kernels", {"name": "python3"}, timeout=bench.budget(120))["id"]
        if run_code(server, ids[i], "x = %d\nprint('set')" % i) != "set\n":
            raise bench.StepError("cannot set x in kernel %d" % i)
    on_all(server, list(range(N)), one)
    return ids


def readopt(server, ids, how):
    """Stops the server `how` (SIGTERM or SIGKILL), spawns it again; (stop ms, spawn->GET /api ms,
    spawn->all answered ms)."""
    t0 = time.perf_counter()
    os.kill(server.proc.pid, signal.SIGTERM if how == "SIGTERM" else signal.SIGKILL)
    server.proc.wait(60)
    stop_ms = (time.perf_counter() - t0) * 1e3
    t1 = time.perf_counter()
    api_ms = server.start()

    def check(i, kid):
        got = run_code(server, kid, "print(x)")
        if got != "%d\n" % i:
            raise bench.StepError("kernel %d answered %r, not %d: its state was lost" % (i, got, i))
    on_all(server, ids, check)
    all_ms = (time.perf_counter() - t1) * 1e3
    listed = {k["id"] for k in server.rest("GET", "/api/kernels")}
    if not set(ids) <= listed:
        raise bench.StepError("%d kernels not listed after re-adoption" % len(set(ids) - listed))
    log("%s: stop %.0f ms, spawn -> GET /api %.0f ms, spawn -> %d kernels answered %.0f ms"
        % (how, stop_ms, api_ms, N, all_ms))
    return {"stop_ms": round(stop_ms, 1), "api_ms": round(api_ms, 1), "all_answered_ms": round(all_ms, 1)}


def main():
    if len(sys.argv) > 1:
        return bench.print_usage(__doc__, sys.argv[1])
    bench.interrupt_on_stop_signals()
    sup = os.path.join(os.path.dirname(bench.KGATE_BIN), "kgate-supervise")
    if not os.access(bench.KGATE_BIN, os.X_OK) or not os.access(sup, os.X_OK):
        print("readopt: no kgate and kgate-supervise at %s" % os.path.dirname(bench.KGATE_BIN), file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="kgate-bench-readopt-")
    R = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpus": os.cpu_count(), "N": N,
                  "kgate_bin": bench.KGATE_BIN, "versions": bench.versions(),
                  "loadavg_start": open("/proc/loadavg").read().split()[:3]},
         "runs": {}, "errors": []}
    live = []
    interrupted = False
    try:
        cfg = os.path.join(tmp, "kgate.toml")
        with open(cfg, "w") as f:
            f.write("[pool]\nsize = 0\n")
        kg = bench.Server("kgate", tmp, "kgate", ("--config", cfg))
        live.append(kg)
        kg.start()
        t = time.perf_counter()
        ids = start_kernels(kg)
        R["meta"]["start_kernels_ms"] = round((time.perf_counter() - t) * 1e3, 1)
        log("%d kernels started and set in %.0f ms" % (N, R["meta"]["start_kernels_ms"]))
        for how in ("SIGTERM", "SIGKILL"):
            try:
                R["runs"][how] = readopt(kg, ids, how)
            except bench.StepError as e:
                log("FAILED %s: %s" % (how, e))
                R["errors"].append({"step": how, "error": str(e)})
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted")
    except bench.StepError as e:
        log("FAILED: %s" % e)
        R["errors"].append({"step": "setup", "error": str(e)})
    finally:
        bench.stop_all(live, tmp, R, KEEP_TMP, log)
    R["meta"]["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    R["meta"]["seconds"] = round(time.monotonic() - bench.T_START, 1)

    print("\n## A new kgate re-adopting %d kernels that outlived the old one (%d cpus, %s)\n"
          % (N, os.cpu_count(), R["meta"]["date"]))
    print("| old kgate stopped by | its exit | new kgate: spawn → GET /api 200 | spawn → all %d kernels answered `print(x)` | target | met |" % N)
    print("|---|---:|---:|---:|---:|---|")
    for how, r in R["runs"].items():
        print("| %s | %.0f ms | %.0f ms | %.0f ms | ≤ 1000 ms | %s |"
              % (how, r["stop_ms"], r["api_ms"], r["all_answered_ms"], "yes" if r["all_answered_ms"] <= 1000 else "NO"))
    print("\njupyter_server: no counterpart (its kernels end with it).")
    return bench.finish(R, OUT, interrupted)


if __name__ == "__main__":
    sys.exit(main())
