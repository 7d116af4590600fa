"""The end of a conversation, however Claude Code ends it (issue 43, point 1): Claude Code ends
an MCP server with SIGINT, then SIGTERM, not by closing stdin. Each of SIGINT, SIGTERM and
SIGHUP runs the same end as stdin's EOF: the calls in flight are cancelled, the auto kernel is
stopped, the claims are released, and kgate-mcp exits within 3 s. Spoken in the 2026-07-28 era
(`_meta` on every request, no initialize), as Claude Code speaks it."""

import signal
import time

import pytest

from conftest import wait_until
from test_mcp_transcript import Mcp, mcp_bin, modern_meta  # noqa: F401 (mcp_bin is a fixture)


def call(p, id_, name, **args):
    p.send({"jsonrpc": "2.0", "id": id_, "method": "tools/call",
            "params": {"name": name, "arguments": args, "_meta": modern_meta()}})


def kernel_ids(kg):
    status, _, body = kg.rest("GET", "/api/kernels")
    assert status == 200, (status, body)
    return [k["id"] for k in body]


def ended_within(p, seconds):
    """(exit code, seconds) once the process exits, or fails after `seconds`."""
    start = time.monotonic()
    try:
        rc = p.proc.wait(seconds)
    except Exception:
        p.kill()
        pytest.fail(f"kgate-mcp still runs {seconds} s after the signal\n{p.stderr_text()[-3000:]}")
    return rc, time.monotonic() - start


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_ends_the_conversation_and_its_auto_kernel(kgate, mcp_bin, tmp_path, sig):  # noqa: F811
    before = set(kernel_ids(kgate))
    p = Mcp(mcp_bin, tmp_path / "mcp", {"KGATE_URL": kgate.url})
    call(p, 1, "execute", code="1 + 1")
    res = p.reply(1, timeout=90)["result"]
    assert not res.get("isError") and "2" in res["content"][0]["text"], res
    mine = set(kernel_ids(kgate)) - before
    assert len(mine) == 1, (before, mine)
    p.proc.send_signal(sig)
    rc, took = ended_within(p, 3)
    assert rc == 0, (rc, p.stderr_text()[-2000:])
    assert not (set(kernel_ids(kgate)) & mine), "the auto kernel outlived its conversation"
    print(f"{signal.Signals(sig).name}: kgate-mcp and its auto kernel gone in {took:.2f} s")


def test_sigint_in_the_middle_of_a_cell_interrupts_it_and_stops_the_kernel(kgate, mcp_bin, tmp_path):  # noqa: F811
    before = set(kernel_ids(kgate))
    p = Mcp(mcp_bin, tmp_path / "mcp", {"KGATE_URL": kgate.url})
    call(p, 1, "execute", code="1")
    p.reply(1, timeout=90)
    mine = set(kernel_ids(kgate)) - before
    (kid,) = mine
    call(p, 2, "execute", code="import time\ntime.sleep(120)", timeout=300)
    assert wait_until(lambda: kgate.kernel_model(kid)["execution_state"] == "busy", 15), kgate.kernel_model(kid)
    p.proc.send_signal(signal.SIGINT)
    rc, took = ended_within(p, 5)
    assert rc == 0, p.stderr_text()[-2000:]
    assert kid not in kernel_ids(kgate), "the busy auto kernel outlived its conversation"
    # The cell's record ended with the kernel, and says why.
    status, _, body = kgate.rest("GET", f"/api/kgate/jobs?kernel={kid}")
    assert status == 200, body
    sleep_job = next(j for j in body["jobs"] if "sleep" in j["code"])
    assert sleep_job["status"] in ("interrupted", "kernel_lost") and sleep_job["ended_at"], sleep_job
    print(f"SIGINT during a cell: gone in {took:.2f} s; the cell's record: {sleep_job['status']}, "
          f"{sleep_job['note']!r}")
