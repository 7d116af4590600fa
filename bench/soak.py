#!/usr/bin/python3
"""Soak: kernels created, flooded, used and deleted in a loop for minutes; kgate's RSS, fds and child
processes sampled, and required to return to where they started.

usage: bench/soak.sh [--minutes 10] [--workers 3] [--flood-mb 4] [--cells 5] [--sample 10]
                     [--settle 60] [--records-budget-mb 8] [--records on|off] [--max-unseen-jobs 500]
                     [--rss-pct 20] [--rss-mb 20]
                     [--csv FILE] [--out FILE] [--keep-tmp]

One kgate (token auth, its default warm pool of one kernel), --workers cycles at once (2-4), each:
POST /api/kernels; a websocket client (bench/load.py's Client, which checks every message as the
load bench does); kernel_info; a cell printing --flood-mb MB (1023 'x' + newline per line), every
byte of which must arrive; --cells token cells (print a token, return it); close; DELETE the kernel.

Every --sample seconds: kgate's VmRSS (/proc/PID/status), open fds (/proc/PID/fd), child processes
(/proc/PID/task/*/children: kernels, warm pool, discovery probes) and kernels alive
(GET /api/kernels). The baseline is taken before the loop, once the warm pool is full; after the
loop every kernel is deleted, the pool allowed to refill, and fds and children polled for up to
--settle seconds until they are back at the baseline.

Checks (exit 1 if any fails):
  - fds and children back at the baseline (a diff of the fd targets is printed if not);
  - RSS growth = median RSS of the last minute of the loop - median of the first minute (the
    warm-up reference; from the first sample after a cycle completed) at most max(--rss-pct % of the first-minute median, --rss-mb MB);
    for runs under 3 minutes the windows are the first and last third;
  - every cycle ran: no lost/crossed/duplicated message, every flood byte arrived.
kgate's job records are a designed, bounded cache (docs/dev/records.md): their text is bounded by
budget_bytes (64 MiB by default), and cells run by websocket clients are "unseen foreign" records,
kept past max_jobs up to max_unseen_jobs (10000 by default). With kgate's defaults both fill
throughout a 10-minute run and read as growth (measured: +22 MB over 10 minutes with 5,250 records
kept, bench/README.md "Soak"), so by default the soak runs with [records] budget_bytes =
--records-budget-mb (8) and max_unseen_jobs = --max-unseen-jobs (500), which fill in the first
minutes: growth after that is not the cache. --records-budget-mb 0 --max-unseen-jobs 0 keeps
kgate's defaults; --records off turns recording off.

The samples go to bench/results/soak-<date>.csv and are printed as a table; raw JSON to
bench/results/soak-latest.json. Exit status: 0 all checks held, 1 a check failed or a step
failed, 2 usage, 130 interrupted.
"""
import argparse
import asyncio
import concurrent.futures
import csv
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
import bench  # noqa: E402
import load  # noqa: E402  (Client, Registry, token_cell, start_server, use_pdeathsig, children, ...)

T0 = time.monotonic()


log = bench.logger("soak", T0)


def fds(pid):
    d = "/proc/%d/fd" % pid
    out = {}
    for n in os.listdir(d):
        try:
            out[n] = os.readlink(os.path.join(d, n))
        except OSError:
            pass
    return out


def fd_kinds(targets):
    kinds = {}
    for t in targets:
        k = t.split(":")[0] if ":" in t else ("file " + t if not t.startswith("/dev/") else t)
        if k.startswith("anon_inode"):
            k = t
        kinds[k] = kinds.get(k, 0) + 1
    return kinds


class Sampler:
    def __init__(self, server):
        self.s = server
        self.pid = server.proc.pid
        self.rows = []

    def read(self, phase, t, extra=None):
        kernels = None
        try:
            kernels = len(self.s.rest("GET", "/api/kernels", timeout=10))
        except Exception as e:  # noqa: BLE001 - a sample without it
            log("GET /api/kernels failed in a sample: %s" % e)
        row = {"t_s": round(t, 1), "phase": phase, "rss_mb": bench.rss_mb(self.pid), "fds": len(fds(self.pid)),
               "children": len(load.children(self.pid)), "kernels": kernels}
        row.update(extra or {})
        self.rows.append(row)
        return row


def pool_steady(server):
    p = server.rest("GET", "/api/kgate/pool", timeout=10)
    return all(v.get("ready", 0) >= v.get("size", 0) and not v.get("starting") for v in p["kernels"].values()), p


def wait_pool(server, timeout=120):
    deadline = time.monotonic() + timeout
    while True:
        ok, p = pool_steady(server)
        if ok:
            return p
        if time.monotonic() > deadline:
            raise bench.StepError("the warm pool did not settle within %d s: %s" % (timeout, p))
        time.sleep(0.25)


FLOOD = "import sys\n_s = 'x' * 1023 + '\\n'\nfor _ in range(%d):\n    sys.stdout.write(_s)\nsys.stdout.flush()"


async def worker(wid, server, args, deadline, stats, pool, reg):
    loop = asyncio.get_running_loop()
    cid = wid * 100000
    while time.monotonic() < deadline:
        kid = None
        t_cycle = time.perf_counter()
        try:
            kid = (await loop.run_in_executor(pool, lambda: server.rest(
                "POST", "/api/kernels", {"name": "python3"}, timeout=120)))["id"]
            c = load.Client(cid, server.url, server.token, kid, reg, with_session_id=(stats["cycles"] % 2 == 0))
            cid += 1
            await c.connect(60)
            try:
                await c.kernel_info(120)
                want = args.flood_mb * 1048576
                cell = await c.execute(FLOOD % (args.flood_mb * 1024), 0, None, timeout=300, keep_text=False)
                lost, _, _ = c.verdict(cell)
                if lost or cell.text_bytes != want or (cell.reply or {}).get("status") != "ok":
                    stats["bad"].append("worker %d kernel %s flood: lost %s, %d of %d bytes, reply %s"
                                        % (wid, kid[:8], lost, cell.text_bytes, want, (cell.reply or {}).get("status")))
                stats["flood_bytes"] += cell.text_bytes
                for n in range(1, args.cells + 1):
                    tok, code = load.token_cell(cid % 10000, n)
                    cell = await c.execute(code, n, tok, timeout=120)
                    lost, crossed, dup = c.verdict(cell)
                    if lost or crossed or dup or (cell.reply or {}).get("status") != "ok":
                        stats["bad"].append("worker %d kernel %s cell %d: lost %s crossed %s duplicated %s reply %s"
                                            % (wid, kid[:8], n, lost, crossed, dup, (cell.reply or {}).get("status")))
                    else:
                        stats["cells"] += 1
            finally:
                await c.close()
            if c.closed and not c.closed.startswith("closed by the server (code 1000") and "None" not in c.closed:
                stats["notes"].append("worker %d: websocket %s" % (wid, c.closed))
        except Exception as e:  # noqa: BLE001 - counted; the loop goes on
            stats["bad"].append("worker %d cycle %d: %s: %s" % (wid, stats["cycles"], type(e).__name__, e))
            await asyncio.sleep(1)
        finally:
            if kid:
                try:
                    await loop.run_in_executor(pool, lambda: server.rest("DELETE", "/api/kernels/" + kid, timeout=60))
                except Exception as e:  # noqa: BLE001
                    stats["bad"].append("worker %d: DELETE %s: %s" % (wid, kid, e))
        stats["cycles"] += 1
        stats["cycle_s"].append(time.perf_counter() - t_cycle)


async def soak(server, args, sampler, stats):
    pool = concurrent.futures.ThreadPoolExecutor(2 * args.workers + 2)
    reg = load.Registry()
    loop = asyncio.get_running_loop()
    t0 = time.monotonic()
    deadline = t0 + args.minutes * 60
    tasks = [asyncio.ensure_future(worker(w, server, args, deadline, stats, pool, reg)) for w in range(args.workers)]
    try:
        next_at = t0
        while not all(t.done() for t in tasks):
            if time.monotonic() >= next_at and time.monotonic() < deadline + args.sample:
                row = await loop.run_in_executor(pool, lambda: sampler.read(
                    "loop", time.monotonic() - t0, {"cycles": stats["cycles"]}))
                log("t=%4.0fs RSS %.1f MB, %d fds, %d children, %s kernels, %d cycles, %d bad"
                    % (row["t_s"], row["rss_mb"], row["fds"], row["children"], row["kernels"], stats["cycles"],
                       len(stats["bad"])))
                next_at += args.sample
            await asyncio.sleep(0.2)
        for t in tasks:
            t.result()
    finally:
        for t in tasks:
            t.cancel()
        pool.shutdown(wait=False)
    stats["loop_s"] = time.monotonic() - t0
    for k in ("crossed", "duplicated", "late", "unattributed"):
        stats["registry_" + k] = reg.counts[k]
    stats["registry_details"] = reg.details


def windows(rows, loop_s):
    w = min(60.0, loop_s / 3.0)
    # the first window starts at the first sample after a cycle completed (t=0 is still idle)
    start = min([r["t_s"] for r in rows if r["phase"] == "loop" and r.get("cycles")] or [0.0])
    first = [r["rss_mb"] for r in rows if r["phase"] == "loop" and start <= r["t_s"] < start + w]
    last = [r["rss_mb"] for r in rows if r["phase"] == "loop" and r["t_s"] > loop_s - w]
    return w, first, last


def main(argv=None):
    ap = argparse.ArgumentParser(prog="bench/soak.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=3, help="kernels cycling at once (2-4)")
    ap.add_argument("--flood-mb", type=int, default=4)
    ap.add_argument("--cells", type=int, default=5)
    ap.add_argument("--sample", type=float, default=10.0)
    ap.add_argument("--settle", type=float, default=60.0)
    ap.add_argument("--records-budget-mb", type=int, default=8, help="[records] budget_bytes in MiB; 0 = kgate's")
    ap.add_argument("--records", choices=("on", "off"), default="on", help="off: [records] enabled = false")
    ap.add_argument("--max-unseen-jobs", type=int, default=500, help="[records] max_unseen_jobs; 0 = kgate's (10000)")
    ap.add_argument("--rss-pct", type=float, default=20.0)
    ap.add_argument("--rss-mb", type=float, default=20.0)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    ap.add_argument("--csv", default=os.path.join(HERE, "results", "soak-%s.csv" % stamp))
    ap.add_argument("--out", default=os.path.join(HERE, "results", "soak-latest.json"))
    ap.add_argument("--keep-tmp", action="store_true")
    args = ap.parse_args(argv)
    if not 1 <= args.workers <= 16 or args.minutes <= 0:
        ap.error("--workers 1..16 and --minutes > 0")
    if not os.access(bench.KGATE_BIN, os.X_OK):
        print("soak: no kgate binary at %s" % bench.KGATE_BIN, file=sys.stderr)
        return 2

    bench.interrupt_on_stop_signals()
    load.use_pdeathsig()
    bench.START_TIMEOUT = 60.0
    tmp = tempfile.mkdtemp(prefix="kgate-bench-soak-")
    R = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpus": os.cpu_count(), "minutes": args.minutes,
                  "workers": args.workers, "flood_mb": args.flood_mb, "cells": args.cells, "sample_s": args.sample,
                  "records_budget_mb": args.records_budget_mb, "records": args.records,
                  "max_unseen_jobs": args.max_unseen_jobs or None, "kgate_bin": bench.KGATE_BIN,
                  "versions": bench.versions(), "loadavg_start": load.loadavg()},
         "samples": [], "checks": {}, "errors": []}
    stats = {"cycles": 0, "cells": 0, "flood_bytes": 0, "bad": [], "notes": [], "cycle_s": []}
    live, interrupted, sampler, server = [], False, None, None
    try:
        load.copy_kgate(tmp)
        extra, toml = (), []
        if args.records == "off":
            toml.append("enabled = false")
        if args.records_budget_mb:
            toml.append("budget_bytes = %d" % (args.records_budget_mb * 1048576))
        if args.max_unseen_jobs:
            toml.append("max_unseen_jobs = %d" % args.max_unseen_jobs)
        if toml:
            cfg = os.path.join(tmp, "soak.toml")
            with open(cfg, "w") as f:
                f.write("[records]\n" + "\n".join(toml) + "\n")
            extra = ("--config", cfg)
            log("kgate.toml: [records] " + "; ".join(toml))
        server = load.start_server("kgate", tmp, "kgate", extra, live=live, logf=log)
        wait_pool(server)
        time.sleep(2)
        sampler = Sampler(server)
        base = sampler.read("baseline", 0.0)
        base_fds = fds(server.proc.pid)
        R["baseline"] = dict(base, fd_kinds=fd_kinds(base_fds.values()))
        log("baseline: RSS %.1f MB, %d fds, %d children (the warm pool), %s kernels"
            % (base["rss_mb"], base["fds"], base["children"], base["kernels"]))
        asyncio.run(soak(server, args, sampler, stats))
        log("loop done: %d cycles, %d cells, %.1f MB flooded in %.0f s"
            % (stats["cycles"], stats["cells"], stats["flood_bytes"] / 1048576, stats["loop_s"]))
        # clean up: no kernel of ours may be left; then the pool refills and everything settles
        left = server.rest("GET", "/api/kernels", timeout=30)
        if left:
            R["errors"].append({"step": "cleanup", "error": "%d kernels still listed after the loop: %s"
                                % (len(left), [k["id"] for k in left])})
            load.delete_kernels(server, [k["id"] for k in left])
        wait_pool(server)
        t_end0 = time.monotonic()
        while True:
            time.sleep(2)
            row = sampler.read("settle", stats["loop_s"] + time.monotonic() - t_end0)
            if (row["fds"] == base["fds"] and row["children"] == base["children"]) or \
                    time.monotonic() - t_end0 > args.settle:
                break
        end_fds = fds(server.proc.pid)
        final = sampler.rows[-1]
        R["final"] = dict(final, fd_kinds=fd_kinds(end_fds.values()),
                          settled_after_s=round(time.monotonic() - t_end0, 1))
        ok_fds = final["fds"] == base["fds"]
        ok_kids = final["children"] == base["children"]
        R["checks"]["fds_back_to_baseline"] = ok_fds
        R["checks"]["children_back_to_baseline"] = ok_kids
        if not ok_fds:
            added = sorted(set(end_fds.values()) - set(base_fds.values()))
            gone = sorted(set(base_fds.values()) - set(end_fds.values()))
            kb, ke = fd_kinds(base_fds.values()), fd_kinds(end_fds.values())
            diff = {k: ke.get(k, 0) - kb.get(k, 0) for k in set(kb) | set(ke) if ke.get(k, 0) != kb.get(k, 0)}
            R["errors"].append({"step": "fds", "error": "%d fds at the end vs %d at the baseline; by kind %s; "
                                "new targets %s; gone %s" % (final["fds"], base["fds"], diff, added[:20], gone[:20])})
        if not ok_kids:
            kids = load.children(server.proc.pid)
            R["errors"].append({"step": "children", "error": "%d children at the end vs %d at the baseline: %s"
                                % (final["children"], base["children"],
                                   [(p, open("/proc/%d/cmdline" % p).read().replace("\0", " ")[:100]) for p in kids
                                    if os.path.exists("/proc/%d" % p)])})
        w, first, last = windows(sampler.rows, stats["loop_s"])
        if first and last:
            f_med, l_med = statistics.median(first), statistics.median(last)
            limit = max(args.rss_pct / 100.0 * f_med, args.rss_mb)
            R["checks"]["rss"] = {"window_s": round(w), "first_median_mb": f_med, "last_median_mb": l_med,
                                  "growth_mb": round(l_med - f_med, 1), "limit_mb": round(limit, 1),
                                  "max_mb": max(r["rss_mb"] for r in sampler.rows),
                                  "ok": l_med - f_med <= limit}
            if l_med - f_med > limit:
                R["errors"].append({"step": "rss", "error": "RSS grew %.1f MB (%.1f -> %.1f MB, medians of the first "
                                    "and last %.0f s), over the %.1f MB limit" % (l_med - f_med, f_med, l_med, w, limit)})
        else:
            R["errors"].append({"step": "rss", "error": "too few samples for the RSS windows"})
        if stats["bad"]:
            R["errors"].append({"step": "cycles", "error": "%d bad cycle steps; first: %s"
                                % (len(stats["bad"]), "; ".join(stats["bad"][:5]))})
        for k in ("crossed", "duplicated", "late"):
            if stats.get("registry_" + k):
                R["errors"].append({"step": "messages", "error": "%d %s: %s" % (stats["registry_" + k], k,
                                                                                stats["registry_details"][:5])})
        if stats["cycles"] == 0:
            R["errors"].append({"step": "cycles", "error": "no cycle completed"})
        if server.proc.poll() is not None:
            R["errors"].append({"step": "kgate", "error": "kgate exited with %s" % server.proc.returncode})
        try:
            jobs = server.rest("GET", "/api/kgate/jobs", timeout=30)
            R["meta"]["records_at_end"] = len(jobs.get("jobs", []))
        except Exception as e:  # noqa: BLE001
            log("GET /api/kgate/jobs: %s" % e)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: stopping everything")
    except Exception as e:  # noqa: BLE001
        msg = str(e) if isinstance(e, bench.StepError) else "%s: %s" % (type(e).__name__, e)
        log("FAILED: %s" % msg)
        R["errors"].append({"step": "soak", "error": msg})
    finally:
        bench.stop_all(live, tmp, R, args.keep_tmp, log)
    R["samples"] = sampler.rows if sampler else []
    R["stats"] = {k: v for k, v in stats.items() if k != "cycle_s"}
    if stats["cycle_s"]:
        R["stats"]["cycle_s_median"] = round(statistics.median(stats["cycle_s"]), 2)
    R["meta"]["loadavg_end"] = load.loadavg()
    R["meta"]["seconds"] = round(time.monotonic() - T0, 1)
    if R["samples"]:
        os.makedirs(os.path.dirname(args.csv), exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            wr = csv.writer(f)
            wr.writerow(["t_s", "phase", "rss_mb", "fds", "children", "kernels", "cycles"])
            for r in R["samples"]:
                wr.writerow([r["t_s"], r["phase"], r["rss_mb"], r["fds"], r["children"], r["kernels"],
                             r.get("cycles", "")])
    print_report(R, args)
    if R["samples"]:
        print("samples: %s" % os.path.relpath(args.csv))
    return bench.finish(R, args.out, interrupted)


def print_report(R, args):
    m, st = R["meta"], R.get("stats", {})
    print("\nsoak: %g min, %d kernels cycling at once, each cycle: create, %d MB flood, %d cells, delete; "
          "%s cpus; %s" % (m["minutes"], m["workers"], m["flood_mb"], m["cells"], m["cpus"], m["date"]))
    print("records %s, budget_bytes %s, max_unseen_jobs %s"
          % (m["records"], "%d MiB" % m["records_budget_mb"] if m["records_budget_mb"] else "default (64 MiB)",
             m["max_unseen_jobs"] or "default (10000)"))
    print("\n| time (s) | phase | RSS (MB) | fds | children | kernels | cycles |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r in R["samples"]:
        print("| %.0f | %s | %.1f | %d | %d | %s | %s |" % (r["t_s"], r["phase"], r["rss_mb"], r["fds"], r["children"],
                                                          "—" if r["kernels"] is None else r["kernels"],
                                                          r.get("cycles", "")))
    print("\ncycles %d (median %.1f s), token cells ok %d, flooded %.0f MB, bad steps %d, records at end %s"
          % (st.get("cycles", 0), st.get("cycle_s_median", 0), st.get("cells", 0), st.get("flood_bytes", 0) / 1048576,
             len(st.get("bad", [])), m.get("records_at_end", "—")))
    b, f = R.get("baseline"), R.get("final")
    if b and f:
        print("baseline: %.1f MB, %d fds, %d children;  end (after %.0f s settle): %.1f MB, %d fds, %d children"
              % (b["rss_mb"], b["fds"], b["children"], f["settled_after_s"], f["rss_mb"], f["fds"], f["children"]))
        print("fds back to baseline: %s; children back to baseline: %s"
              % ("yes" if R["checks"].get("fds_back_to_baseline") else "NO",
                 "yes" if R["checks"].get("children_back_to_baseline") else "NO"))
    c = R["checks"].get("rss")
    if c:
        print("RSS: median of the first %d s of cycling %.1f MB, of the last %d s %.1f MB: growth %+.1f MB (limit %.1f MB: "
              "max(%g%%, %g MB)) -> %s; peak %.1f MB"
              % (c["window_s"], c["first_median_mb"], c["window_s"], c["last_median_mb"], c["growth_mb"],
                 c["limit_mb"], args.rss_pct, args.rss_mb, "ok" if c["ok"] else "TOO MUCH", c["max_mb"]))


if __name__ == "__main__":
    sys.exit(main())
