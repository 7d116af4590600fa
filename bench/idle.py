#!/usr/bin/python3
"""The cost of idle kernels: the gateway's own CPU while it holds N idle kernels, for kgate and
jupyter_server (the peer) in one run, and the execute round trip with N idle kernels beside the
one it uses, against the round trip with that one alone.

usage: bench/idle.sh [-h]          (run via idle.sh; it calls this file with /usr/bin/python3)

Environment:
  KGATE_BIN        kgate binary                        (default <repo>/build/gateway/kgate)
  IDLE_N           idle kernels                        (default 60)
  IDLE_SECONDS     the CPU window, seconds             (default 60)
  IDLE_SETTLE      seconds after the last kernel is idle, before the window (default 10)
  IDLE_RT          round trips per latency run         (default 200; the client adds 20 warm-up runs)
  IDLE_BUDGET      total time budget, seconds          (default 900)
  IDLE_OUT         raw JSON                            (default bench/results/idle-latest.json)
  IDLE_KEEP_TMP=1  keep the temp dir (server logs)

Per server, one after the other (kgate first): start it; the round trip of '1+1' over a
websocket with no other kernel (bench/wsclient.py gateway, which starts its own kernel); N
kernels started (six at a time), each then running `pass` over its channels to its reply and
idle; IDLE_SETTLE seconds; the server process's own CPU (utime + stime of /proc/PID/stat, not
its kernels') over IDLE_SECONDS; the round trip again, with the N idle kernels held; then the
server is stopped with its kernels.
Both servers use Debian's /usr/bin/python3 ipykernel and their defaults (kgate: a heartbeat per
kernel per second, and its warm pool's one spare kernel, which is held too; jupyter_server: its
restarter's liveness poll every 3 s)."""
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the shared Server, the client runner, sweeping and finish)

N = max(1, int(os.environ.get("IDLE_N", "60")))
SECONDS = max(5.0, float(os.environ.get("IDLE_SECONDS", "60")))
SETTLE = max(0.0, float(os.environ.get("IDLE_SETTLE", "10")))
RT = max(10, int(os.environ.get("IDLE_RT", "200")))
bench.BUDGET = float(os.environ.get("IDLE_BUDGET", "900"))
OUT = os.environ.get("IDLE_OUT", os.path.join(bench.HERE, "results", "idle-latest.json"))
KEEP_TMP = os.environ.get("IDLE_KEEP_TMP") == "1"
log = bench.log


def start_kernels(server, n):
    """n kernels, six POSTs at a time; their ids once each has run a cell and is idle."""
    ids, errors = [], []
    lock = threading.Lock()

    def one():
        try:
            k = server.rest("POST", "/api/kernels", {"name": "python3"}, timeout=bench.budget(120))
            with lock:
                ids.append(k["id"])
        except Exception as e:  # noqa: BLE001 - reported below
            with lock:
                errors.append(str(e))

    for first in range(0, n, 6):
        threads = [threading.Thread(target=one) for _ in range(min(6, n - first))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise bench.StepError("%d of %d kernel starts failed: %s" % (len(errors), n, errors[0]))
    # Each one answers a cell (`pass`, over its channels, to its reply and idle): jupyter_server
    # says "starting" until a kernel's first request, and a POST to it answers before the kernel
    # is up.
    # jupyter_server, busy starting 60 kernels on 2 cores, has reset a channels connection now
    # and then (ConnectionResetError): such a kernel is tried again, up to 3 times in all.
    for kid in ids:
        for attempt in range(3):
            try:
                ws = bench.open_channels(server, kid, timeout=bench.budget(120))
                try:
                    bench.ws_run(ws, "pass", "%s kernel %s" % (server.label, kid))
                finally:
                    ws.close()
                break
            except ConnectionError as e:
                if attempt == 2:
                    raise
                log("%s: kernel %s: %s; trying again" % (server.label, kid, e))
                time.sleep(1)
    return ids


def idle_cpu(server, seconds):
    """% of one core the server process used over `seconds`, holding its kernels."""
    c0, t0 = bench.cpu_s(server.proc.pid), time.monotonic()
    time.sleep(bench.budget(seconds))
    c1, t1 = bench.cpu_s(server.proc.pid), time.monotonic()
    return round(100.0 * (c1 - c0) / (t1 - t0), 2)


def measure(server, env, tmp):
    r = {}
    one = bench.run_client(env, tmp, ["gateway", server.url, server.token, RT], 120)
    r["rt_alone_us"] = one["median_us"]
    log("%s: round trip alone %d µs" % (server.label, one["median_us"]))
    t0 = time.monotonic()
    start_kernels(server, N)
    r["start_all_s"] = round(time.monotonic() - t0, 1)
    log("%s: %d kernels idle after %.0f s" % (server.label, N, r["start_all_s"]))
    time.sleep(bench.budget(SETTLE))
    r["idle_cpu_pct"] = idle_cpu(server, SECONDS)
    log("%s: %.2f %% of a core over %.0f s with %d idle kernels" % (server.label, r["idle_cpu_pct"], SECONDS, N))
    held = bench.run_client(env, tmp, ["gateway", server.url, server.token, RT], 120)
    r["rt_with_idle_us"] = held["median_us"]
    log("%s: round trip beside %d idle kernels %d µs" % (server.label, N, held["median_us"]))
    return r


def main():
    if len(sys.argv) > 1:
        return bench.print_usage(__doc__, sys.argv[1])
    bench.interrupt_on_stop_signals()
    if not os.access(bench.KGATE_BIN, os.X_OK):
        print("idle: no kgate binary at %s" % bench.KGATE_BIN, file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="kgate-bench-idle-")
    env = bench.private_env(os.path.join(tmp, "client"))
    R = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpus": os.cpu_count(), "N": N, "window_seconds": SECONDS,
                  "settle": SETTLE, "round_trips": RT, "kgate_bin": bench.KGATE_BIN, "versions": bench.versions(),
                  "loadavg_start": open("/proc/loadavg").read().split()[:3]},
         "servers": {}, "errors": []}
    live = []
    interrupted = False
    try:
        for kind, label in (("kgate", "kgate"), ("peer", "jupyter_server")):
            s = bench.Server(kind, tmp, label)
            live.append(s)
            try:
                s.start()
                R["servers"][label] = measure(s, env, tmp)
            except KeyboardInterrupt:
                raise
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                msg = str(e) if isinstance(e, bench.StepError) else "%s: %s" % (type(e).__name__, e)
                log("FAILED %s: %s" % (label, msg))
                R["errors"].append({"step": label, "error": msg})
            finally:
                s.stop()
                live.remove(s)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted")
    finally:
        bench.stop_all(live, tmp, R, KEEP_TMP, log)
    R["meta"]["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    R["meta"]["seconds"] = round(time.monotonic() - bench.T_START, 1)

    k, p = R["servers"].get("kgate"), R["servers"].get("jupyter_server")
    print("\n## %d idle kernels: the gateway's own CPU over %.0f s, and the '1+1' round trip (median of %d)\n"
          % (N, SECONDS, RT))
    print("| | kgate | jupyter_server | kgate / peer |")
    print("|---|---:|---:|---:|")

    def row(name, key, fmt):
        kv, pv = (k or {}).get(key), (p or {}).get(key)
        ratio = "%.2f×" % (kv / pv) if kv is not None and pv else "—"
        print("| %s | %s | %s | %s |" % (name, "—" if kv is None else fmt % kv, "—" if pv is None else fmt % pv, ratio))
    row("idle CPU, % of one core", "idle_cpu_pct", "%.2f")
    row("round trip, that kernel alone (µs)", "rt_alone_us", "%d")
    row("round trip, beside %d idle kernels (µs)" % N, "rt_with_idle_us", "%d")
    row("%d kernels started and idle (s)" % N, "start_all_s", "%.1f")
    for label, r in R["servers"].items():
        if r.get("rt_alone_us") and r.get("rt_with_idle_us"):
            print("\n%s: round trip beside %d idle kernels / alone: %.2f×"
                  % (label, N, r["rt_with_idle_us"] / r["rt_alone_us"]), end="")
    print()
    return bench.finish(R, OUT, interrupted)


if __name__ == "__main__":
    sys.exit(main())
