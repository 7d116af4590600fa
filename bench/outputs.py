#!/usr/bin/python3
"""Keeping every output (issue 61): kgate's CPU for OUT_N display_data of an OUT_KB image each,
against OUT_N prints of the same size, in alternating rounds (plots, prints, prints, plots, ...)
on one kgate and one kernel, through POST /api/kgate/kernels/{id}/execute. Each round's cost is
kgate's utime + stime over the cell (/proc/<pid>/stat); the medians and their ratio are printed.
The issue's bar: plots cost no more than 2x the prints."""
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import Server, cpu_s, log  # noqa: E402

N = int(os.environ.get("OUT_N", "200"))
KB = int(os.environ.get("OUT_KB", "50"))
ROUNDS = max(2, int(os.environ.get("OUT_ROUNDS", "4")))

# The same bytes each time would be one file (content-addressed): each plot differs in its last bytes.
PLOTS = f"""
import base64, os
from IPython.display import display
blob = os.urandom({KB * 1024 * 3 // 4})
for i in range({N}):
    display({{'image/png': base64.b64encode(blob + i.to_bytes(4, 'big')).decode()}}, raw=True)
"""
PRINTS = f"""
import base64, os
blob = os.urandom({KB * 1024 * 3 // 4})
for i in range({N}):
    print(base64.b64encode(blob + i.to_bytes(4, 'big')).decode(), flush=True)
"""


def main():
    tmp = tempfile.mkdtemp(prefix="kgate-outputs-bench-")
    kg = Server("kgate", tmp, "kgate")
    kg.start()
    try:
        kid = kg.rest("POST", "/api/kernels", {"name": "python3"})["id"]
        costs = {"plots": [], "prints": []}
        order = ["plots", "prints"]
        for r in range(ROUNDS):
            for what in (order if r % 2 == 0 else order[::-1]):
                before = cpu_s(kg.proc.pid)
                t0 = time.monotonic()
                res = kg.rest("POST", f"/api/kgate/kernels/{kid}/execute",
                              {"code": PLOTS if what == "plots" else PRINTS, "agent": "bench", "wait": 120}, timeout=150)
                assert res["status"] == "ok", res
                time.sleep(0.3)  # the last outputs' files and records
                costs[what].append(cpu_s(kg.proc.pid) - before)
                log("round %d %s: %.0f ms of kgate's CPU, %.2f s" % (r + 1, what, costs[what][-1] * 1e3, time.monotonic() - t0))
        plots, prints = statistics.median(costs["plots"]), statistics.median(costs["prints"])
        print("| %d cells' outputs of %d KB | kgate CPU, median of %d (ms) |" % (N, KB, ROUNDS))
        print("|---|---:|")
        print("| %d plots (display_data image/png) | %.0f |" % (N, plots * 1e3))
        print("| %d prints of the same size | %.0f |" % (N, prints * 1e3))
        print("| plots / prints | %.2fx |" % (plots / prints if prints else float("nan")))
    finally:
        kg.stop()


if __name__ == "__main__":
    sys.exit(main())
