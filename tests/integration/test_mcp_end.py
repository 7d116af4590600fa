"""The end of a conversation, however Claude Code ends it (issue 43, point 1): Claude Code ends
an MCP server with SIGINT, then SIGTERM 100 ms later if it still runs, then SIGKILL 400 ms after
that, not by closing stdin. Each of SIGINT, SIGTERM and SIGHUP runs the same end as stdin's EOF:
the calls in flight are cancelled and their cells interrupted, the auto kernel's stop is begun,
the claims are released, and kgate-mcp exits before that SIGKILL. Spoken in the 2026-07-28 era
(`_meta` on every request, no initialize), as Claude Code speaks it."""

import signal
import subprocess
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


def end_like_claude_code(p, first=signal.SIGINT):
    """Ends the server as Claude Code does (its stdio client's close, read from its build): the
    signal, SIGTERM 100 ms later if it still runs, SIGKILL 400 ms after that. Fails if the
    process lived to see the SIGKILL; else (exit code, seconds from the first signal)."""
    start = time.monotonic()
    p.proc.send_signal(first)
    for then, wait in ((signal.SIGTERM, 0.1), (signal.SIGKILL, 0.4)):
        try:
            rc = p.proc.wait(wait)
            return rc, time.monotonic() - start
        except subprocess.TimeoutExpired:
            if then == signal.SIGKILL:
                p.kill()
                pytest.fail(f"kgate-mcp still ran 500 ms after {first.name}: Claude Code would SIGKILL it\n"
                            f"{p.stderr_text()[-3000:]}")
            p.proc.send_signal(then)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_ends_the_conversation_and_its_auto_kernel(kgate, mcp_bin, tmp_path, sig):  # noqa: F811
    before = set(kernel_ids(kgate))
    p = Mcp(mcp_bin, tmp_path / "mcp", {"KGATE_URL": kgate.url})
    call(p, 1, "execute", code="1 + 1")
    res = p.reply(1, timeout=90)["result"]
    assert not res.get("isError") and "2" in res["content"][0]["text"], res
    mine = set(kernel_ids(kgate)) - before
    assert len(mine) == 1, (before, mine)
    rc, took = end_like_claude_code(p, sig)
    assert rc == 0, (rc, p.stderr_text()[-2000:])
    ended = time.monotonic()
    assert wait_until(lambda: not (set(kernel_ids(kgate)) & mine), 10), "the auto kernel outlived its conversation"
    print(f"{signal.Signals(sig).name}: kgate-mcp gone in {took:.3f} s, its auto kernel "
          f"{time.monotonic() - ended:.2f} s after")


def test_sigint_in_the_middle_of_a_cell_interrupts_it_and_stops_the_kernel(kgate, mcp_bin, tmp_path):  # noqa: F811
    before = set(kernel_ids(kgate))
    p = Mcp(mcp_bin, tmp_path / "mcp", {"KGATE_URL": kgate.url})
    call(p, 1, "execute", code="1")
    p.reply(1, timeout=90)
    mine = set(kernel_ids(kgate)) - before
    (kid,) = mine
    call(p, 2, "execute", code="import time\ntime.sleep(120)", timeout=300)
    assert wait_until(lambda: kgate.kernel_model(kid)["execution_state"] == "busy", 15), kgate.kernel_model(kid)
    rc, took = end_like_claude_code(p)
    assert rc == 0, p.stderr_text()[-2000:]
    assert wait_until(lambda: kid not in kernel_ids(kgate), 10), "the busy auto kernel outlived its conversation"
    # The cell's record ended with the kernel, and says why.
    status, _, body = kgate.rest("GET", f"/api/kgate/jobs?kernel={kid}")
    assert status == 200, body
    sleep_job = next(j for j in body["jobs"] if "sleep" in j["code"])
    assert sleep_job["status"] in ("interrupted", "kernel_lost") and sleep_job["ended_at"], sleep_job
    print(f"SIGINT during a cell: gone in {took:.2f} s; the cell's record: {sleep_job['status']}, "
          f"{sleep_job['note']!r}")


@pytest.mark.parametrize("late", [False, True])
def test_the_end_interrupts_a_cell_on_a_kept_kernel_and_leaves_the_kernel(kgate, mcp_bin, tmp_path, late):  # noqa: F811
    """A kernel the conversation connected to by id outlives it, but the cell its call was
    waiting on is interrupted as the conversation ends: right after the cell began (kgate still
    holds the execute POST, so kgate-mcp has no job id yet) and a few seconds in (it has)."""
    kid = kgate.start_kernel()["id"]
    p = Mcp(mcp_bin, tmp_path / "mcp", {"KGATE_URL": kgate.url})
    call(p, 1, "connect", kernel=kid)
    assert not p.reply(1, timeout=60)["result"].get("isError")
    call(p, 2, "execute", code="import time\ntime.sleep(120)", timeout=300)
    assert wait_until(lambda: kgate.kernel_model(kid)["execution_state"] == "busy", 15), kgate.kernel_model(kid)
    if late:
        time.sleep(2.5)  # past the POST's hold (1 s) and into the call's job polls
    rc, took = end_like_claude_code(p)
    assert rc == 0, p.stderr_text()[-2000:]

    def sleep_job():
        body = kgate.rest("GET", f"/api/kgate/jobs?kernel={kid}")[2]
        return next(j for j in body["jobs"] if "sleep" in j["code"])
    assert wait_until(lambda: sleep_job()["status"] != "running", 10), sleep_job()
    assert sleep_job()["status"] == "interrupted", sleep_job()
    assert wait_until(lambda: kgate.kernel_model(kid)["execution_state"] == "idle", 10), kgate.kernel_model(kid)
    assert kid in kernel_ids(kgate), "the end stopped a kernel that was not the conversation's own"
    print(f"{'late' if late else 'early'}: kgate-mcp gone in {took:.3f} s; the cell interrupted")


# --------------------------------------------------------------------------------------------
# Progress (issue 43, point 4): at most one notification a second per call, in every state

def test_a_cancelled_elicitation_sends_no_flood_of_progress(kgate, mcp_bin, tmp_path):  # noqa: F811
    """After Claude Code cancelled an input() form, kgate-mcp used to send hundreds of
    notifications/progress in a fraction of a second (its loop spun on the input_request that
    stays until the interrupt lands)."""
    p = Mcp(mcp_bin, tmp_path / "mcp", {"KGATE_URL": kgate.url})
    try:
        p.request(0, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}},
                                    "clientInfo": {"name": "progress-test", "version": "1"}})
        p.notify("notifications/initialized")
        p.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "execute", "arguments": {"code": "name = input('name? ')\nprint(name)"},
                           "_meta": {"progressToken": "p1"}}})
        ask = p.wait(lambda: next((m for m in p.messages if isinstance(m, dict)
                                   and m.get("method") == "elicitation/create"), None), timeout=90)
        assert ask, p.stdout_text()
        started = time.monotonic()
        p.send({"jsonrpc": "2.0", "id": ask["id"], "result": {"action": "cancel"}})
        reply = p.reply(1, timeout=60)
        took = time.monotonic() - started
        assert reply["result"]["isError"], reply
        progress = [m for m in p.messages if isinstance(m, dict) and m.get("method") == "notifications/progress"]
        # One a second at most (and one at once).
        after = [m for m in progress if p.messages.index(m) > p.messages.index(ask)]
        assert len(after) <= 1 + int(took) + 1, (len(after), took)
        print(f"cancelled input(): {len(after)} progress notification(s) in the {took:.2f} s to the reply")
    finally:
        p.close()
        p.kill()


# --------------------------------------------------------------------------------------------
# kgate's side: a conversation killed without its end (kill -9, the OOM killer)

@pytest.fixture
def quick_orphans(kgate_factory, tmp_path):
    """A kgate that stops an orphaned auto kernel 1 s after its agent is gone, and takes a
    dropped agent for gone 1 s after its connection dropped."""
    cfg = tmp_path / "kgate.toml"
    cfg.write_text("[records]\nclaim_grace_seconds = 1\n\n[culling]\nauto_kernel_grace_seconds = 1\n")
    return kgate_factory(config=cfg)


def auto_kernel_of(kg, p, id_):
    before = set(kernel_ids(kg))
    call(p, id_, "execute", code="x = 1")
    assert not p.reply(id_, timeout=90)["result"].get("isError")
    (kid,) = set(kernel_ids(kg)) - before
    return kid


def test_a_killed_conversations_auto_kernel_is_stopped_by_kgate(quick_orphans, mcp_bin, tmp_path):  # noqa: F811
    kg = quick_orphans
    p = Mcp(mcp_bin, tmp_path / "a", {"KGATE_URL": kg.url})
    kid = auto_kernel_of(kg, p, 1)
    status, _, model = kg.rest("GET", f"/api/kgate/kernels/{kid}")
    assert model["kgate_conversation"].startswith("kgate-mcp-"), model
    call(p, 2, "execute", code="import time\ntime.sleep(60)", timeout=120)
    assert wait_until(lambda: kg.kernel_model(kid)["execution_state"] == "busy", 15)
    p.proc.kill()  # SIGKILL: no end of its own
    p.proc.wait()
    assert wait_until(lambda: kid not in kernel_ids(kg), 15), kg.log_tail()
    took = [ln for ln in kg.log_lines if "auto kernel of a conversation that ended" in ln]
    assert took, kg.log_tail()
    # The running cell was interrupted as soon as the link dropped (issue 60), before the kernel
    # went; its record says why.
    body = kg.rest("GET", f"/api/kgate/jobs?kernel={kid}")[2]
    cell = next(j for j in body["jobs"] if "sleep" in j["code"])
    assert cell["status"] == "interrupted" and "connection to kgate dropped" in cell["note"], cell


def test_a_killed_conversations_cell_is_interrupted_at_once(kgate, mcp_bin, tmp_path):  # noqa: F811
    """kill -9 of kgate-mcp during a 30 s cell (issue 60, point 5): on loopback the dropped link
    means the process is gone, so kgate interrupts the cell at once, and the record says why; the
    kernel itself waits out the grace (60 s by default) as before."""
    p = Mcp(mcp_bin, tmp_path / "a", {"KGATE_URL": kgate.url})
    kid = auto_kernel_of(kgate, p, 1)
    call(p, 2, "execute", code="import time\ntime.sleep(30)", timeout=120)
    assert wait_until(lambda: kgate.kernel_model(kid)["execution_state"] == "busy", 15)
    p.proc.kill()
    p.proc.wait()
    killed = time.monotonic()
    assert wait_until(lambda: kgate.kernel_model(kid)["execution_state"] == "idle", 2), kgate.kernel_model(kid)
    print(f"idle {time.monotonic() - killed:.2f} s after the SIGKILL")
    body = kgate.rest("GET", f"/api/kgate/jobs?kernel={kid}")[2]
    cell = next(j for j in body["jobs"] if "sleep" in j["code"])
    assert cell["status"] == "interrupted", cell
    assert "connection to kgate dropped (kgate-mcp's process is gone" in cell["note"], cell
    assert kid in kernel_ids(kgate)  # the kernel waits out the grace
    kgate.delete_kernel(kid)


def test_a_conversation_killed_before_its_link_opened_still_loses_its_auto_kernel(quick_orphans):
    """kgate-mcp waits only 200 ms for a kernel create in flight at its end, so the kernel may
    come after it is gone, without its agent link ever opening: kgate expects the agent from
    its answer to the POST on, and takes it for gone claim_grace later."""
    kg = quick_orphans
    status, _, model = kg.rest("POST", "/api/kernels", {"name": "python3", "kgate_conversation": "kgate-mcp-never"})
    assert status == 201, (status, model)
    kg._kernels.add(model["id"])
    assert wait_until(lambda: model["id"] not in kernel_ids(kg), 15), kg.log_tail()
    assert any("auto kernel of a conversation that ended" in ln and "kgate-mcp-never" in ln for ln in kg.log_lines)


def test_an_attached_or_kept_auto_kernel_outlives_its_killed_conversation(quick_orphans, mcp_bin, tmp_path):  # noqa: F811
    kg = quick_orphans
    # A person's client is attached to one conversation's auto kernel...
    p1 = Mcp(mcp_bin, tmp_path / "a", {"KGATE_URL": kg.url})
    attached = auto_kernel_of(kg, p1, 1)
    ws = kg.connect(attached)
    # ...and another conversation connected to its own auto kernel by id.
    p2 = Mcp(mcp_bin, tmp_path / "b", {"KGATE_URL": kg.url})
    kept = auto_kernel_of(kg, p2, 1)
    call(p2, 2, "connect", kernel=kept)
    assert "no longer the auto kernel" in p2.reply(2, timeout=30)["result"]["content"][0]["text"]
    assert "kgate_conversation" not in kg.rest("GET", f"/api/kgate/kernels/{kept}")[2]
    try:
        for p in (p1, p2):
            p.proc.kill()
            p.proc.wait()
        time.sleep(4)  # past claim_grace + auto_kernel_grace, and a few sweeps
        assert attached in kernel_ids(kg) and kept in kernel_ids(kg), kg.log_tail()
        assert ws.run("print(x)").strip() == "1"
    finally:
        ws.close()
    # Once the person leaves, the orphan goes; the kept kernel stays.
    assert wait_until(lambda: attached not in kernel_ids(kg), 15), kg.log_tail()
    assert kept in kernel_ids(kg)
    kg.delete_kernel(kept)


def test_the_auto_kernel_mark_outlives_a_kgate_restart(quick_orphans, kgate_bin, mcp_bin, tmp_path):  # noqa: F811
    """kgate restarts (SIGTERM, as systemd does on an upgrade) and re-adopts an auto kernel: the
    kernel is still its conversation's. While that kgate-mcp lives (its link reconnects) the
    kernel stays; once it is gone, the next kgate stops the kernel as the first would have."""
    from conftest import Kgate
    kg = quick_orphans
    cfg = tmp_path / "kgate.toml"
    p = Mcp(mcp_bin, tmp_path / "a", {"KGATE_URL": kg.url})
    kid = auto_kernel_of(kg, p, 1)
    q = Mcp(mcp_bin, tmp_path / "b", {"KGATE_URL": kg.url})
    kid_q = auto_kernel_of(kg, q, 1)
    port = kg.port
    kg.stop(sig=signal.SIGTERM, sweep=False)  # the kernels go on
    q.proc.kill()  # this conversation dies while no kgate runs: the next one never meets it
    q.proc.wait()
    kg2 = Kgate(kgate_bin, kg.root, config=cfg, port=port).start()
    try:
        assert wait_until(lambda: kid_q not in kernel_ids(kg2), 15), kg2.log_tail()
        assert kg2.rest("GET", f"/api/kgate/kernels/{kid}")[2].get("kgate_conversation", "").startswith("kgate-mcp-")
        time.sleep(4)  # past claim_grace + auto_kernel_grace: the link came back, so it stays
        assert kid in kernel_ids(kg2), kg2.log_tail()
        call(p, 2, "execute", code="print(x)")
        assert p.reply(2, timeout=60)["result"]["content"][-1]["text"].strip() == "1"
        p.proc.kill()
        p.proc.wait()
        assert wait_until(lambda: kid not in kernel_ids(kg2), 15), kg2.log_tail()
        assert any("auto kernel of a conversation that ended" in ln for ln in kg2.log_lines), kg2.log_tail()
    finally:
        kg2.cleanup_kernels()
        kg2.stop()


def test_the_auto_kernel_mark_outlives_a_killed_kgate(quick_orphans, kgate_bin, mcp_bin, tmp_path):  # noqa: F811
    """The same after kill -9 of kgate: the table entry was written again when the mark was set,
    so the next kgate still knows whose auto kernel it is; a kept kernel stays kept."""
    from conftest import Kgate
    kg = quick_orphans
    cfg = tmp_path / "kgate.toml"
    p = Mcp(mcp_bin, tmp_path / "a", {"KGATE_URL": kg.url})
    kid = auto_kernel_of(kg, p, 1)
    q = Mcp(mcp_bin, tmp_path / "b", {"KGATE_URL": kg.url})
    kept = auto_kernel_of(kg, q, 1)
    call(q, 2, "connect", kernel=kept)
    assert "no longer the auto kernel" in q.reply(2, timeout=30)["result"]["content"][0]["text"]
    time.sleep(0.5)  # the entries are written on kgate's kernel thread
    kg.proc.kill()  # no leaving of its own: the kernels go on, with the entries as they were
    kg.proc.wait()
    for m in (p, q):
        m.proc.kill()
        m.proc.wait()
    kg2 = Kgate(kgate_bin, kg.root, config=cfg).start()
    try:
        assert wait_until(lambda: kid not in kernel_ids(kg2), 20), kg2.log_tail()
        time.sleep(2)
        assert kept in kernel_ids(kg2), kg2.log_tail()
    finally:
        kg2.cleanup_kernels()
        kg2.stop()
