#!/usr/bin/python3
"""Many MCP sessions at once on kgate's own /mcp (issue 20): each its own conversation and its
own kernel, every reply checked.

usage: bench/mcp_sessions.sh [-h]      (runs this file with /usr/bin/python3)

One kgate (no warm pool, max_kernels above SESSIONS) runs for the run. SESSIONS threads each open
a session over its own keep-alive HTTP connection (initialize, notifications/initialized), run
`mine = I` (which makes the session's auto kernel), then CELLS cells `print(mine, n)`, checking
that each reply is the one to that request id and shows that session's own I and n, then
DELETE /mcp. A reply that never comes, or one with another session's value or another request's
id, is counted, never hidden.

Environment:
  KGATE_BIN          kgate binary (default <repo>/build/gateway/kgate)
  SESSIONS           sessions at once (default 50)
  CELLS              timed cells per session after its first (default 10)
  SESSIONS_OUT       results JSON (default bench/results/mcp-sessions-latest.json)

Exit status: 0 all replies right, 1 a reply was lost or crossed or a step failed, 2 setup.
"""
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
import bench  # noqa: E402

SESSIONS = max(1, int(os.environ.get("SESSIONS", "50")))
CELLS = max(1, int(os.environ.get("CELLS", "10")))
OUT = os.environ.get("SESSIONS_OUT", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "mcp-sessions-latest.json"))


def one_session(kg, i, R, lock):
    conn = http.client.HTTPConnection("127.0.0.1", kg.port, timeout=300)
    H = {"Authorization": "Bearer " + kg.token, "Content-Type": "application/json",
         "Accept": "application/json, text/event-stream"}
    sid = None
    rids = iter(range(1, 1 << 30))
    mine = {"lost": 0, "crossed": 0, "lat": [], "errors": []}

    def post(msg):
        h = dict(H)
        if sid:
            h["Mcp-Session-Id"] = sid
        conn.request("POST", "/mcp", body=json.dumps(msg), headers=h)
        r = conn.getresponse()
        raw = r.read()
        return r, (json.loads(raw) if raw else None)

    def execute(code, want):
        rid = next(rids)
        t = time.perf_counter()
        r, m = post({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                     "params": {"name": "execute", "arguments": {"code": code, "timeout": 240}}})
        dt = time.perf_counter() - t
        if r.status != 200 or not m or "result" not in m:
            mine["lost"] += 1
            mine["errors"].append("session %d: HTTP %s %s" % (i, r.status, json.dumps(m)[:200]))
            return None
        text = "\n".join(b.get("text", "") for b in m["result"].get("content", []) if b.get("type") == "text")
        if m.get("id") != rid or (want is not None and not text.strip().endswith(want)):
            mine["crossed"] += 1
            mine["errors"].append("session %d: request %d got id %s, text %r (wanted %r)"
                                  % (i, rid, m.get("id"), text[-200:], want))
        return dt

    try:
        r, m = post({"jsonrpc": "2.0", "id": next(rids), "method": "initialize",
                     "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                "clientInfo": {"name": "bench-%d" % i, "version": "1"}}})
        sid = r.getheader("Mcp-Session-Id")
        if r.status != 200 or not sid:
            raise bench.StepError("session %d: initialize HTTP %s" % (i, r.status))
        post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        t0 = time.perf_counter()
        execute("mine = %d" % i, None)
        first = time.perf_counter() - t0
        for n in range(CELLS):
            dt = execute("print(mine, %d)" % n, "%d %d" % (i, n))
            if dt is not None:
                mine["lat"].append(dt)
        conn.request("DELETE", "/mcp", headers={"Authorization": H["Authorization"], "Mcp-Session-Id": sid})
        conn.getresponse().read()
        mine["first_s"] = first
    except Exception as e:  # noqa: BLE001 (counted as lost, reported)
        mine["lost"] += 1
        mine["errors"].append("session %d: %s: %s" % (i, type(e).__name__, e))
    finally:
        conn.close()
    with lock:
        R["sessions"].append(mine)


def main():
    if len(sys.argv) > 1:
        return bench.print_usage(__doc__, sys.argv[1])
    if not os.access(bench.KGATE_BIN, os.X_OK):
        print("mcp_sessions: %s is missing (build kgate)" % bench.KGATE_BIN, file=sys.stderr)
        return 2
    T0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="kgate-mcp-sessions-")
    cfg = os.path.join(tmp, "kgate.toml")
    with open(cfg, "w") as f:
        f.write("[limits]\nmax_kernels = %d\n\n[pool]\nsize = 0\n" % (SESSIONS + 10))
    R = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpus": os.cpu_count(), "sessions": SESSIONS,
                  "cells": CELLS, "loadavg_start": open("/proc/loadavg").read().split()[:3]},
         "sessions": [], "errors": []}
    kg = bench.Server("kgate", tmp, "kgate", extra_args=["--config", cfg])
    try:
        kg.start()
        lock = threading.Lock()
        threads = [threading.Thread(target=one_session, args=(kg, i, R, lock)) for i in range(SESSIONS)]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join(900)
        R["wall_s"] = round(time.perf_counter() - t, 2)
        R["kgate_rss_mb"] = bench.rss_mb(kg.proc.pid)
        left = kg.rest("GET", "/api/kernels", timeout=30)
        time.sleep(2)
        R["kernels_left_after_delete"] = len(kg.rest("GET", "/api/kernels", timeout=30) or [])
        R["kernels_at_end_first_look"] = len(left or [])
    except bench.StepError as e:
        R["errors"].append({"step": "setup", "error": str(e)})
    finally:
        bench.stop_all([kg], tmp, R, False, bench.log)
    S = R["sessions"]
    lat = [x for s in S for x in s["lat"]]
    R["summary"] = {
        "sessions_done": len(S), "lost": sum(s["lost"] for s in S), "crossed": sum(s["crossed"] for s in S),
        "cells": len(lat), "median_ms": round(statistics.median(lat) * 1e3, 1) if lat else None,
        "p90_ms": round(sorted(lat)[int(len(lat) * 0.9)] * 1e3, 1) if lat else None,
        "first_cell_median_s": round(statistics.median([s["first_s"] for s in S if "first_s" in s]), 2)
        if any("first_s" in s for s in S) else None}
    for s in S:
        for e in s["errors"][:3]:
            R["errors"].append({"step": "session", "error": e})
    R["meta"]["seconds"] = round(time.monotonic() - T0, 1)
    R["meta"]["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    sm = R["summary"]
    print("\n%d MCP sessions at once on kgate /mcp, each its own kernel, %d checked cells each (%s cpus)"
          % (SESSIONS, CELLS, os.cpu_count()))
    print("| figure | value |\n|---|---:|")
    for k, v in (("sessions that finished", sm["sessions_done"]), ("replies lost", sm["lost"]),
                 ("replies crossed (another session's or request's)", sm["crossed"]),
                 ("cells checked", sm["cells"]), ("all sessions, wall (s)", R.get("wall_s")),
                 ("first cell (kernel start included), median (s)", sm["first_cell_median_s"]),
                 ("cell round trip under that load, median (ms)", sm["median_ms"]),
                 ("cell round trip, p90 (ms)", sm["p90_ms"]), ("kgate RSS at the end (MB)", R.get("kgate_rss_mb")),
                 ("kernels left 2 s after every DELETE /mcp", R.get("kernels_left_after_delete"))):
        print("| %s | %s |" % (k, v))
    rc = bench.finish(R, OUT, False)
    return 1 if rc or sm["lost"] or sm["crossed"] else 0


if __name__ == "__main__":
    sys.exit(main())
