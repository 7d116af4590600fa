"""bench/run.sh works from a fresh clone: the benchmark's clients are part of the project, its
default paths are relative to the checkout, and nothing outside the clone is needed.

The test clones the repository (its committed files only) into a temporary folder outside it,
where no sibling `shared/` folder exists, runs that clone's bench/run.sh with tiny settings
against the kgate binary under test, and reads the comparison table it prints."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import die_with_parent

REPO = Path(__file__).resolve().parents[2]


def _row(table, metric):
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == metric:
            return cells
    raise AssertionError(f"no row {metric!r} in:\n{table}")


def test_bench_runs_from_a_clone_in_another_folder(kgate_bin, tmp_path):
    if shutil.which("git") is None or subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--git-dir"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout: there is nothing to clone")
    clone = tmp_path / "elsewhere" / "kgate"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(clone)],
                   check=True, capture_output=True, timeout=60)
    assert not (clone.parent.parent / "shared").exists()
    assert not (clone / "build").exists()

    env = {k: v for k, v in os.environ.items() if not k.startswith(("BENCH_", "WSBENCH", "JUPYTER_"))}
    env.update(KGATE_BIN=kgate_bin, BENCH_N="5", BENCH_MB="1", BENCH_REPS="1", BENCH_PAIRS="2", BENCH_COLD="1",
               BENCH_PEER_COLD="2", BENCH_ROUNDS="2", BENCH_PRINTS="300",
               BENCH_BUDGET="120", HOME=str(tmp_path / "home"))
    os.makedirs(env["HOME"])
    proc = subprocess.run([str(clone / "bench" / "run.sh")], cwd=str(tmp_path), env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=170,
                          preexec_fn=die_with_parent)
    report = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr tail:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, report

    out = proc.stdout
    header = _row(out, "metric")
    assert header[1:4] == ["direct (floor)", "jupyter_server (peer)", "kgate"], report
    number = re.compile(r"^[0-9][0-9,]*(\.[0-9]+)?$")
    for metric in ("execute round trip, median (µs)", "execute round trip, p90 (µs)"):
        direct, peer, kgate = _row(out, metric)[1:4]
        assert all(number.match(v) for v in (direct, peer, kgate)), (metric, report)
    interleaved = _row(out, "execute round trip, interleaved with direct ZMQ, median (µs)")[1:4]
    assert all(number.match(v) for v in interleaved), report
    ratios = _row(out, "the same, gateway / direct ZMQ in one interleaved run (×)")[2:4]
    assert all(number.match(v) and float(v) > 0 for v in ratios), report
    relay = _row(out, "the same, a relay that does nothing (libzmq's zmq_proxy) / direct ZMQ (×)")[1]
    assert number.match(relay) and float(relay) > 0, report
    received = _row(out, "1 MB flood, bytes received (peer: unlimited)")[1:4]
    assert received == ["1,048,576"] * 3, report
    fast = _row(out, "1 MB flood, bytes, client UTF-8 check off, fewest of the rounds (peer: unlimited)")[1:4]
    assert fast == ["1,048,576"] * 3, report
    prints = _row(out, "300 small prints, bytes received (peer: unlimited)")[1:4]
    assert prints == ["{:,}".format(sum(len(str(i)) + 1 for i in range(300)))] * 3, report
    for metric in ("1 MB flood, seconds, client UTF-8 check off, median of 2 rounds (peer: unlimited)",
                   "300 small prints, one message each, seconds (peer: unlimited)"):
        assert all(number.match(v) for v in _row(out, metric)[1:4]), (metric, report)
    assert number.match(_row(out, "cold start to first GET /api 200, median (ms)")[3]), report
    assert (clone / "bench" / "results" / "latest.json").is_file()
