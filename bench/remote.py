#!/usr/bin/python3
"""Remote launchers benchmark (issue 19, docs/dev/remote-launchers.md): kernels as Slurm jobs, next to local ones.

usage: bench/remote.sh [-h]          (run via remote.sh; it calls this file with /usr/bin/python3)

Environment:
  KGATE_BIN     kgate binary (kgate-supervise beside it)   (default <repo>/build/gateway/kgate)
  REMOTE_N      Slurm kernels started at once              (default 20)
  REMOTE_RTT    timed `1+1` round trips per kernel         (default 200, after 20 untimed)
  REMOTE_OUT    raw JSON                                    (default bench/results/remote-latest.json)

Starts a single-node Slurm cluster (tests/integration/engines.py: slurmctld, slurmd and munge, as
root; the node declares REMOTE_N CPUs so that REMOTE_N one-CPU jobs run at once), one kgate with
a Slurm launcher and no warm pool, and one jupyter_server. Then, in one run:

  start    POST /api/kernels -> the first execute_reply of `1+1` over the kernel's websocket, five
           times each: a kgate Slurm kernel, a kgate local kernel (cold: no pool), a
           jupyter_server kernel. The Slurm one's extra is the scheduler (sbatch, the job's start
           on the node, the registration).
  rtt      `1+1` round trips over one websocket (execute_request -> execute_reply and the idle
           status it caused): the Slurm kernel, the local kernel, jupyter_server's kernel, and
           direct ZMQ to the same Slurm kernel (the floor: jupyter_client on kgate's connection
           file, no gateway in between).
  many     REMOTE_N Slurm kernels POSTed at once, each then answering `print(i)`: spawn -> all
           answered.
"""
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "integration"))
import bench  # noqa: E402
import wsclient  # noqa: E402
from engines import SlurmCluster  # noqa: E402

N = max(1, int(os.environ.get("REMOTE_N", "20")))
RTT = max(10, int(os.environ.get("REMOTE_RTT", "200")))
STARTS = 5
OUT = os.environ.get("REMOTE_OUT", os.path.join(bench.HERE, "results", "remote-latest.json"))
bench.BUDGET = float(os.environ.get("REMOTE_BUDGET", "600"))
log = bench.log


class Channel:
    """One kernel's websocket through a gateway."""

    def __init__(self, server, kid):
        self.ws = bench.open_channels(server, kid, timeout=120)

    def run(self, code):
        return bench.ws_run(self.ws, code)

    def close(self):
        self.ws.close()


def post(server, body):
    return server.rest("POST", "/api/kernels", body, timeout=bench.budget(180))["id"]


def start_ms(server, body):
    """POST -> the first execute_reply of `1+1` (the websocket is opened right after the POST)."""
    t = time.perf_counter()
    kid = post(server, body)
    ch = Channel(server, kid)
    try:
        ch.run("1+1")
        ms = (time.perf_counter() - t) * 1e3
    finally:
        ch.close()
    server.rest("DELETE", "/api/kernels/" + kid)
    return ms


def interleaved_rtts(clients):
    """`1+1` round trips on every client in turn, blocks of 20 (after 20 untimed each), so a
    noisy moment costs them all alike.  clients: {name: wsclient kernel}."""
    for k in clients.values():
        k.wait_ready()
        for _ in range(20):
            k.execute("1+1")
    times = {name: [] for name in clients}
    for _ in range(max(1, RTT // 20)):
        for name, k in clients.items():
            for _ in range(20):
                t = time.perf_counter()
                k.execute("1+1")
                times[name].append((time.perf_counter() - t) * 1e6)
    out = {}
    for name, us in times.items():
        us.sort()
        out[name] = {"n": len(us), "median_us": round(statistics.median(us)),
                     "p90_us": round(us[int(len(us) * 0.9)]), "min_us": round(us[0])}
    return out


def slurm_alone(cluster):
    """sbatch -> the job's first instruction on the node, for a job that prints the time: what
    the scheduler itself takes (median of STARTS), the part of a Slurm kernel's start that is
    not kgate's."""
    runs = []
    for i in range(STARTS):
        out = os.path.join(str(cluster.root), "alone-%d.out" % i)
        t = time.time()
        p = cluster.run("sbatch", "--parsable", "-o", out, "--wrap", "date +%s.%N")
        if p.returncode != 0:
            raise bench.StepError("sbatch: %s" % p.stderr.strip())
        deadline = time.monotonic() + 60
        while not (os.path.exists(out) and open(out).read().strip()):
            if time.monotonic() > deadline:
                raise bench.StepError("the job did not start within 60 s")
            time.sleep(0.01)
        runs.append((float(open(out).read()) - t) * 1e3)
        while cluster.jobs() and time.monotonic() < deadline:
            time.sleep(0.05)
    return {"median_ms": round(statistics.median(runs), 1), "runs_ms": [round(x, 1) for x in runs]}


def many(server):
    ids = [None] * N
    errors = []

    def one(i):
        try:
            ids[i] = post(server, {"name": "python3", "kgate_launcher": "slurm"})
            ch = Channel(server, ids[i])
            try:
                if ch.run("print(%d)" % i) != "%d\n" % i:
                    raise bench.StepError("kernel %d answered wrong" % i)
            finally:
                ch.close()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append("%d: %s" % (i, e))
    t = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(N)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    ms = (time.perf_counter() - t) * 1e3
    for kid in ids:
        if kid:
            server.rest("DELETE", "/api/kernels/" + kid)
    if errors:
        raise bench.StepError("%d of %d kernels failed: %s" % (len(errors), N, errors[0]))
    return {"n": N, "all_answered_ms": round(ms, 1)}


def main():
    if len(sys.argv) > 1:
        return bench.print_usage(__doc__, sys.argv[1])
    if os.geteuid() != 0:
        print("remote: needs root (it starts munged, slurmctld and slurmd)", file=sys.stderr)
        return 2
    bench.interrupt_on_stop_signals()
    tmp = tempfile.mkdtemp(prefix="kgate-bench-remote-")
    R = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpus": os.cpu_count(), "N": N, "rtt_n": RTT,
                  "kgate_bin": bench.KGATE_BIN, "versions": bench.versions(),
                  "loadavg_start": open("/proc/loadavg").read().split()[:3]},
         "start": {}, "rtt": {}, "errors": []}
    live = []
    cluster = None
    interrupted = False
    try:
        cluster = SlurmCluster(os.path.join(tmp, "slurm"), cpus=max(N, os.cpu_count() or 1)).start()
        log("slurm cluster up (%d cpus declared)" % cluster.cpus)
        cfg = os.path.join(tmp, "kgate.toml")
        with open(cfg, "w") as f:
            f.write('[pool]\nsize = 0\n\n[launchers.slurm]\nkind = "slurm"\npartition = "debug"\n')
        kg = bench.Server("kgate", tmp, "kgate", ("--config", cfg))
        kg.env["SLURM_CONF"] = str(cluster.conf)
        peer = bench.Server("peer", tmp, "jupyter_server")
        live += [kg, peer]
        kg.start()
        peer.start()
        R["slurm_alone"] = slurm_alone(cluster)
        log("slurm alone: sbatch -> job start median %.0f ms" % R["slurm_alone"]["median_ms"])
        cases = (("kgate slurm", kg, {"name": "python3", "kgate_launcher": "slurm"}),
                 ("kgate local", kg, {"name": "python3"}),
                 ("jupyter_server local", peer, {"name": "python3"}))
        for name, server, body in cases:
            runs = [start_ms(server, body) for _ in range(STARTS)]
            R["start"][name] = {"median_ms": round(statistics.median(runs), 1), "runs_ms": [round(x, 1) for x in runs]}
            log("start %s: median %.0f ms" % (name, R["start"][name]["median_ms"]))
        # Round trips: one kernel each, all open at once, measured in turn.
        slurm_kid = post(kg, cases[0][2])
        local_kid = post(kg, cases[1][2])
        peer_kid = post(peer, cases[2][2])
        conn = os.path.join(kg.env["JUPYTER_RUNTIME_DIR"], "kernel-%s.json" % slurm_kid)
        clients = {"direct ZMQ to the slurm kernel": wsclient.DirectKernel(True, connection_file=conn),
                   "kgate slurm": wsclient.GatewayKernel(kg.url, kg.token, "python3", True, kernel_id=slurm_kid),
                   "kgate local": wsclient.GatewayKernel(kg.url, kg.token, "python3", True, kernel_id=local_kid),
                   "jupyter_server local": wsclient.GatewayKernel(peer.url, peer.token, "python3", True,
                                                                  kernel_id=peer_kid)}
        try:
            R["rtt"] = interleaved_rtts(clients)
        finally:
            for k in clients.values():
                k.close()
        for name, r in R["rtt"].items():
            log("rtt %s: median %d us" % (name, r["median_us"]))
        for server, kid in ((kg, slurm_kid), (kg, local_kid), (peer, peer_kid)):
            server.rest("DELETE", "/api/kernels/" + kid)
        R["many"] = many(kg)
        log("%d slurm kernels at once: all answered in %.0f ms" % (N, R["many"]["all_answered_ms"]))
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted")
    except (bench.StepError, Exception) as e:  # noqa: BLE001 - reported in the results
        log("FAILED: %s" % e)
        R["errors"].append({"step": "run", "error": "%s: %s" % (type(e).__name__, e)})
    finally:
        if cluster:  # first: stop_all sweeps what runs under tmp, slurmctld included
            cluster.stop()
        bench.stop_all(live, tmp, R, False, log)
    R["meta"]["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    R["meta"]["seconds"] = round(time.monotonic() - bench.T_START, 1)

    s, r = R["start"], R["rtt"]
    print("\n## Kernels on a Slurm launcher (single-node cluster, %d cpus, %s)\n" % (os.cpu_count(), R["meta"]["date"]))
    if len(s) == 3:
        extra = s["kgate slurm"]["median_ms"] - s["kgate local"]["median_ms"]
        print("| POST → first execute_reply (median of %d) | ms |" % STARTS)
        print("|---|---:|")
        for name in s:
            print("| %s | %.0f |" % (name, s[name]["median_ms"]))
        print("\nSlurm − local cold start: %+.0f ms (target ≤ +1000 ms: %s)"
              % (extra, "met" if extra <= 1000 else "NOT met"))
        if "slurm_alone" in R:
            alone = R["slurm_alone"]["median_ms"]
            print("of which Slurm itself (sbatch → a `date` job's start, median of %d): %.0f ms; kgate's own part: %+.0f ms"
                  % (STARTS, alone, extra - alone))
    if len(r) == 4:
        print("\n| `1+1` round trip (%d timed) | median µs | p90 µs | × direct ZMQ |" % RTT)
        print("|---|---:|---:|---:|")
        floor = r["direct ZMQ to the slurm kernel"]["median_us"]
        for name in ("direct ZMQ to the slurm kernel", "kgate slurm", "kgate local", "jupyter_server local"):
            print("| %s | %d | %d | %.2f |" % (name, r[name]["median_us"], r[name]["p90_us"], r[name]["median_us"] / floor))
        ratio = r["kgate slurm"]["median_us"] / r["kgate local"]["median_us"]
        print("\nkgate slurm ÷ kgate local: %.3f× (target ≤ 1.05×: %s)" % (ratio, "met" if ratio <= 1.05 else "NOT met"))
    if "many" in R:
        print("\n%d Slurm kernels POSTed at once, each answering `print(i)`: %.0f ms, all answered"
              % (N, R["many"]["all_answered_ms"]))
    return bench.finish(R, OUT, interrupted)


if __name__ == "__main__":
    sys.exit(main())
