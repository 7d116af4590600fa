#!/usr/bin/python3
"""Kernel start benchmark: POST /api/kernels to the first execute_reply, with
kgate's warm pool, kgate cold (pool size 0) and jupyter_server (the peer, always cold); and N
concurrent cold creates against one.

usage: bench/pool.sh [-h]          (run via pool.sh; it calls this file with /usr/bin/python3)

Environment:
  KGATE_BIN        kgate binary                        (default <repo>/build/gateway/kgate)
  POOL_N           samples per series                  (default 10; cold series use POOL_N_COLD)
  POOL_N_COLD      cold samples per server             (default 5)
  POOL_CONCURRENT  concurrent cold creates             (default 20)
  POOL_BUDGET      total time budget, seconds          (default 280)
  POOL_OUT         raw JSON                            (default bench/results/pool-latest.json)
  POOL_KEEP_TMP=1  keep the temp dir (server logs)

One sample: POST /api/kernels, open its websocket, execute '1+1', wait for the execute_reply;
the time is from the POST to that reply. Before each warm sample the pool is given time to
refill (GET /api/kgate/pool says ready), which is not timed; every kernel is deleted after its
sample. The concurrent part starts POOL_CONCURRENT kernels at once on kgate (pool 0) and on
jupyter_server, each to its first execute_reply, timed until the last one, beside one cold
start on the same server.
"""
import json
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the shared Server, process sweeping and finish)

N = max(1, int(os.environ.get("POOL_N", "10")))
N_COLD = max(1, int(os.environ.get("POOL_N_COLD", "5")))
CONCURRENT = max(2, int(os.environ.get("POOL_CONCURRENT", "20")))
bench.BUDGET = float(os.environ.get("POOL_BUDGET", "280"))
OUT = os.environ.get("POOL_OUT", os.path.join(bench.HERE, "results", "pool-latest.json"))
KEEP_TMP = os.environ.get("POOL_KEEP_TMP") == "1"
log = bench.log


def first_execute(server):
    """ms from POST /api/kernels to the first execute_reply of '1+1'; the kernel id."""
    import websocket
    t0 = time.perf_counter()
    k = server.rest("POST", "/api/kernels", {"name": "python3"}, timeout=bench.budget(60))
    ws = websocket.create_connection(
        server.url.replace("http", "ws", 1) + "/api/kernels/%s/channels" % k["id"],
        header=["Authorization: token " + server.token], timeout=bench.budget(120))
    try:
        msg_id, request = bench.execute_request("1+1")
        ws.send(request)
        while True:
            m = json.loads(ws.recv())
            if m.get("msg_type") == "execute_reply" and m.get("parent_header", {}).get("msg_id") == msg_id:
                ms = (time.perf_counter() - t0) * 1e3
                if m["content"]["status"] != "ok":
                    raise bench.StepError("execute_reply: %s" % m["content"])
                return ms, k["id"]
    finally:
        ws.close()


def wait_pool_ready(server, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = server.rest("GET", "/api/kgate/pool", timeout=5)
        if any(v.get("ready", 0) >= 1 for v in p["kernels"].values()):
            return
        time.sleep(0.05)
    raise bench.StepError("the pool did not refill within %d s: %s" % (timeout, p))


def series(server, n, warm):
    out = []
    for _ in range(n):
        bench.budget(90)
        if warm:
            wait_pool_ready(server)
            time.sleep(0.3)  # let the refill's spawn start, as it would in real use
        ms, kid = first_execute(server)
        out.append(round(ms, 1))
        log("%s%s: %.1f ms" % (server.label, " (warm)" if warm else "", ms))
        server.rest("DELETE", "/api/kernels/" + kid, timeout=30)
    return out


def concurrent_creates(server, n):
    """(one cold create ms, n concurrent creates ms until the last first execute_reply).  Each
    create is POST + websocket + execute '1+1': jupyter_server answers the POST while its kernel
    is still starting, so the POST alone would not compare."""
    def create():
        return first_execute(server)

    one, kid = create()
    server.rest("DELETE", "/api/kernels/" + kid, timeout=30)
    time.sleep(1)
    ids, errors = [], []

    def worker():
        try:
            ids.append(create()[1])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(str(e))

    threads = [threading.Thread(target=worker) for _ in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = (time.perf_counter() - t0) * 1e3
    for kid in ids:
        try:
            server.rest("DELETE", "/api/kernels/" + kid, timeout=60)
        except Exception as e:  # noqa: BLE001
            log("DELETE %s: %s" % (kid, e))
    if errors:
        raise bench.StepError("%d of %d concurrent creates failed: %s" % (len(errors), n, errors[0]))
    log("%s: one cold create %.0f ms, %d concurrent %.0f ms" % (server.label, one, n, total))
    return round(one, 1), round(total, 1)


def med(xs):
    return statistics.median(xs) if xs else None


def fmt(x, unit=" ms"):
    return "—" if x is None else ("%.1f%s" % (x, unit) if x < 100 else "%.0f%s" % (x, unit))


def main():
    if len(sys.argv) > 1:
        return bench.print_usage(__doc__, sys.argv[1])
    bench.interrupt_on_stop_signals()
    if not os.access(bench.KGATE_BIN, os.X_OK):
        print("pool: no kgate binary at %s" % bench.KGATE_BIN, file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="kgate-bench-pool-")
    R = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpus": os.cpu_count(), "N": N, "N_cold": N_COLD,
                  "concurrent": CONCURRENT, "kgate_bin": bench.KGATE_BIN, "versions": bench.versions(),
                  "loadavg_start": open("/proc/loadavg").read().split()[:3]},
         "series": {}, "concurrent": {}, "errors": []}
    live = []
    interrupted = False

    def step(name, fn, *a):
        try:
            return fn(*a)
        except KeyboardInterrupt:
            raise
        except Exception as e:  # noqa: BLE001 - recorded, the run goes on
            msg = str(e) if isinstance(e, bench.StepError) else "%s: %s" % (type(e).__name__, e)
            log("FAILED %s: %s" % (name, msg))
            R["errors"].append({"step": name, "error": msg})
            return None

    def start(kind, label, extra=()):
        s = bench.Server(kind, tmp, label, extra)
        live.append(s)
        s.start()
        return s

    try:
        cold_cfg = os.path.join(tmp, "cold.toml")
        with open(cold_cfg, "w") as f:
            f.write("[pool]\nsize = 0\n")
        warm = step("start kgate (pool)", start, "kgate", "kgate-pool")
        if warm:
            step("pool ready", wait_pool_ready, warm)
            R["series"]["kgate warm pool"] = step("kgate warm", series, warm, N, True)
            warm.stop()
            live.remove(warm)
        cold = step("start kgate (no pool)", start, "kgate", "kgate-cold", ("--config", cold_cfg))
        peer = step("start jupyter_server", start, "peer", "jupyter_server")
        for s, name in ((cold, "kgate cold"), (peer, "jupyter_server (cold)")):
            if s:
                R["series"][name] = step(name, series, s, N_COLD, False)
        for s, name in ((cold, "kgate"), (peer, "jupyter_server")):
            if s:
                r = step("%s concurrent" % name, concurrent_creates, s, CONCURRENT)
                if r:
                    R["concurrent"][name] = {"one_ms": r[0], "all_ms": r[1], "ratio": round(r[1] / r[0], 2)}
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted")
    finally:
        bench.stop_all(live, tmp, R, KEEP_TMP, log)
    R["meta"]["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    R["meta"]["seconds"] = round(time.monotonic() - bench.T_START, 1)

    print("\n## POST /api/kernels → first execute_reply ('1+1'), median of the samples\n")
    print("| series | samples | median | min | max |")
    print("|---|---:|---:|---:|---:|")
    for name, xs in R["series"].items():
        if xs:
            print("| %s | %d | %s | %s | %s |" % (name, len(xs), fmt(med(xs)), fmt(min(xs)), fmt(max(xs))))
    w, c, p = (med(R["series"].get(k) or []) for k in ("kgate warm pool", "kgate cold", "jupyter_server (cold)"))
    if w and c and p:
        print("\nwarm pool / jupyter_server: %.3f×; warm pool / kgate cold: %.3f×; kgate cold / jupyter_server: %.2f×"
              % (w / p, w / c, c / p))
    if R["concurrent"]:
        print("\n## %d concurrent cold starts (POST → first execute_reply, until the last) vs one, on %d cores\n" % (CONCURRENT, os.cpu_count()))
        print("| server | one create | %d at once | ratio |" % CONCURRENT)
        print("|---|---:|---:|---:|")
        for name, r in R["concurrent"].items():
            print("| %s | %s | %s | %.2f× |" % (name, fmt(r["one_ms"]), fmt(r["all_ms"]), r["ratio"]))
    return bench.finish(R, OUT, interrupted)


if __name__ == "__main__":
    sys.exit(main())
