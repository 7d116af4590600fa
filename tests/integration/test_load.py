"""CI-sized load check (bench/load.sh is the full one): 8 kernels at once, 40 websocket clients
spread round-robin over them, 10 cells each, all running concurrently; not one reply may be
lost, crossed (delivered to the wrong client, or with another cell's token) or duplicated.

The client and its checks are bench/load.py's (Client, run_load): every reply must be for the
client's own request and session, every stdout stream and execute_result must carry exactly its
own cell's token, and the iopub broadcast of the other clients' cells on the same kernel is
checked against the cell that sent it. Half the clients connect without ?session_id=.
"""

import concurrent.futures
import os
import secrets
import sys

import pytest

_BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")
_saved_path = list(sys.path)
try:
    sys.path.insert(0, _BENCH)
    import load  # noqa: E402  (bench/load.py; it imports bench/bench.py)
finally:
    sys.path[:] = _saved_path

KERNELS = 8
CLIENTS = 40
CELLS = 10


@pytest.fixture
def ipython_dir(tmp_path, monkeypatch):
    """kgate (and so its kernels) get a private IPYTHONDIR with IPython's history off: kernels
    sharing one history.sqlite block each other for sqlite's 5 s lock timeout."""
    d = tmp_path / "ipython"
    (d / "profile_default").mkdir(parents=True)
    (d / "profile_default" / "ipython_kernel_config.py").write_text("c.HistoryManager.enabled = False\n")
    monkeypatch.setenv("IPYTHONDIR", str(d))
    return d


def test_many_clients_many_kernels_nothing_lost_crossed_or_duplicated(kgate_factory, ipython_dir):
    token = secrets.token_hex(16)
    kg = kgate_factory(token=token)
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        ids = [m["id"] for m in ex.map(lambda _: kg.start_kernel(timeout=120), range(KERNELS))]
    assert len(set(ids)) == KERNELS

    res = load.run_load(kg.url, token, ids, CLIENTS, CELLS, cell_timeout=60.0, connect_timeout=120.0)

    summary = {k: res.get(k) for k in ("total_cells", "ok_cells", "wall_s", "cells_per_s", "p50_ms", "p99_ms",
                                       "lost", "lost_parts", "crossed", "duplicated", "failed", "late",
                                       "broadcast_iopub", "unattributed", "kernel_stderr", "errors")}
    detail = "\n".join(res.get("details", [])[:30])
    assert not res["errors"], f"{summary}\n{detail}\n{kg.log_tail()}"
    assert res["lost"] == 0, f"lost cells: {summary}\n{detail}\n{kg.log_tail()}"
    assert res["crossed"] == 0, f"crossed replies: {summary}\n{detail}"
    assert res["duplicated"] == 0, f"duplicated replies: {summary}\n{detail}"
    assert res["failed"] == 0, f"cells that did not reply ok: {summary}\n{detail}"
    assert res["late"] == 0, f"{summary}\n{detail}"
    assert res["ok_cells"] == CLIENTS * CELLS, summary
    # every client of a kernel sees the others' iopub: with 5 clients a kernel, 4 others' cells
    assert res["broadcast_iopub"] > 0, summary
    assert kg.proc.poll() is None, kg.log_tail()

    for kid in ids:
        kg.delete_kernel(kid)
