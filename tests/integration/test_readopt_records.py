"""Records outlive kgate too (issue 18; docs/dev/readoption.md): the job records of a kernel are kept in
<state>/records/<id>.log and read back by the kgate that re-adopts it.  Old jobs stay readable,
job numbers continue, a job that ran across the gap ends with a note of it, cells another client
ran while no kgate listened are recovered from the kernel's history, and a torn log is reported
and skipped."""

import contextlib
import json
import os
import re
import signal
import time

import pytest

from conftest import Kgate, pid_alive, wait_until
from records_util import (agent_execute, agent_run, attach_client, digest, job_num, kc_run, list_jobs,
                          wait_job_end)
from test_mcp_semantics import Agent
from test_mcp_transcript import mcp_bin  # noqa: F401 (a fixture)
from test_readopt import kernel_ids, kill_9


def records_dir(kg):
    return kg.root / "state" / "kgate" / "records"


def stop_kgate(kg, how):
    if how == "kill -9":
        kill_9(kg)
    else:
        kg.stop(sweep=False)  # SIGTERM: the kernels stay


def delete_all(kg):
    """Kernels a kgate re-adopted are not in its own list of kernels to clean up."""
    try:
        ids = list(kernel_ids(kg))
    except Exception:
        return
    for kid in ids:
        kg.delete_kernel(kid, check=False)


@contextlib.contextmanager
def next_kgate(kgate_bin, root, **kwargs):
    """The kgate that takes the kernels back (same state directory); at the end its kernels
    are deleted and it is stopped."""
    kg2 = Kgate(kgate_bin, root, **kwargs).start()
    try:
        yield kg2
    finally:
        delete_all(kg2)
        kg2.stop()


def wait_idle(kg, kid, timeout=30):
    assert wait_until(lambda: kernel_ids(kg).get(kid, {}).get("execution_state") == "idle", timeout), \
        f"{kernel_ids(kg)}\n{kg.log_tail(30)}"


@pytest.mark.parametrize("how", ["kill -9", "SIGTERM"])
def test_records_and_job_numbers_survive_a_restart(kgate_factory, kgate_bin, how):
    kg = kgate_factory()
    kid = kg.start_kernel()["id"]
    first = agent_run(kg, kid, "x = 41\nprint('set')", "agent-1", label="Claude (test)")
    assert first["status"] == "ok", first
    log = records_dir(kg) / f"{kid}.log"
    assert wait_until(log.exists, 5), sorted(os.listdir(records_dir(kg)))  # the kgate-records thread writes it
    assert oct(os.stat(log).st_mode & 0o777) == "0o600"
    assert oct(os.stat(records_dir(kg)).st_mode & 0o777) == "0o700"
    stop_kgate(kg, how)

    with next_kgate(kgate_bin, kg.root) as kg2:
        wait_idle(kg2, kid)
        jobs = list_jobs(kg2, kid, code_chars=200)["jobs"]
        old = [j for j in jobs if j["job"] == first["job"]]
        assert old and old[0]["status"] == "ok" and old[0]["code"] == "x = 41\nprint('set')", jobs
        rec = agent_run(kg2, kid, "x + 1", "agent-1")
        assert rec["status"] == "ok" and rec["result"] == "42", rec
        assert job_num(rec["job"]) > job_num(first["job"]), (first["job"], rec["job"])
        full = kg2.rest("GET", f"/api/kgate/jobs/{first['job']}")[2]
        assert full["output"] == "set\n" and full["agent"] == "agent-1", full
        assert any("job record" in line and "read back" in line for line in kg2.log_lines), kg2.log_tail(30)
    assert not (records_dir(kg) / f"{kid}.log").exists(), "a deleted kernel's records stayed on disk"


def test_a_cell_running_across_a_kill_9_ends_with_the_gap_noted(kgate_factory, kgate_bin):
    kg = kgate_factory()
    kid = kg.start_kernel()["id"]
    status, rec = agent_execute(kg, kid, "import time\nfor i in range(15):\n    print(i, flush=True)\n    time.sleep(1)\n'done'",
                                "agent-1")
    assert status in (200, 202), rec
    job = rec["job"]
    time.sleep(1.5)
    kill_9(kg)
    time.sleep(1.0)
    with next_kgate(kgate_bin, kg.root) as kg2:
        running = kg2.rest("GET", f"/api/kgate/jobs/{job}")[2]
        assert running["status"] == "running" and "kgate was away" in running["note"], running
        # Re-adopted in the middle of the cell: busy (not idle) until it ends.
        assert wait_until(lambda: kernel_ids(kg2)[kid]["execution_state"] != "starting", 20)
        assert kernel_ids(kg2)[kid]["execution_state"] == "busy", kernel_ids(kg2)[kid]
        done = wait_job_end(kg2, job, timeout=30)
        assert done["status"] == "ok", done
        assert "kgate was away while this job ran" in done["note"], done
        assert done["output"].endswith("13\n14\n"), done  # heard after the re-adoption
        assert done["result"] == "'done'", done
        assert wait_until(lambda: kernel_ids(kg2)[kid]["execution_state"] == "idle", 5), kernel_ids(kg2)[kid]


def test_a_cell_that_ended_while_kgate_was_away_is_ended_end_not_recorded(kgate_factory, kgate_bin):
    kg = kgate_factory()
    kid = kg.start_kernel()["id"]
    status, rec = agent_execute(kg, kid, "import time\ntime.sleep(1.5)\nprint('late')", "agent-1")
    assert status in (200, 202), rec
    time.sleep(0.5)
    kill_9(kg)
    time.sleep(2.0)  # the cell ends while no kgate listens
    with next_kgate(kgate_bin, kg.root) as kg2:
        done = wait_job_end(kg2, rec["job"], timeout=20)
        assert done["status"] == "end_not_recorded", done
        assert "ended while kgate was away" in done["note"], done
        # The kernel takes the next cell at once.
        nxt = agent_run(kg2, kid, "1 + 1", "agent-1")
        assert nxt["status"] == "ok" and nxt["result"] == "2", nxt


def test_cells_run_while_kgate_was_away_are_recovered_from_history(kgate_factory, kgate_bin):
    kg = kgate_factory()
    kid = kg.start_kernel()["id"]
    agent_run(kg, kid, "a = 1", "agent-1")
    kc = attach_client(kg, kid)
    try:
        kill_9(kg)
        content, out = kc_run(kc, "y = 7\nprint('by hand')\ny * 6")
        assert content["status"] == "ok" and out == "by hand\n", (content, out)
        with next_kgate(kgate_bin, kg.root) as kg2:
            wait_idle(kg2, kid)
            job = None

            def recovered():
                nonlocal job
                for j in list_jobs(kg2, kid, code_chars=200)["jobs"]:
                    if j["origin"] == "user" and j["code"] == "y = 7\nprint('by hand')\ny * 6":
                        job = j
                        return True
                return False
            assert wait_until(recovered, 15), list_jobs(kg2, kid)
            full = kg2.rest("GET", f"/api/kgate/jobs/{job['job']}")[2]
            assert full["status"] == "end_not_recorded" and full["result"] == "42", full
            assert "ran while kgate was away" in full["note"], full
            assert job["job"] in [j["job"] for j in digest(kg2, kid, "agent-1")["jobs"]]
            # The agent's own cell is not recovered twice.
            codes = [j["code"] for j in list_jobs(kg2, kid, code_chars=200)["jobs"]]
            assert codes.count("a = 1") == 1, codes
    finally:
        kc.stop_channels()


def test_a_kernel_dead_while_kgate_was_away_keeps_its_records(kgate_factory, kgate_bin):
    kg = kgate_factory()
    kid = kg.start_kernel()["id"]
    done = agent_run(kg, kid, "print('before')", "agent-1")
    status, rec = agent_execute(kg, kid, "import time\ntime.sleep(60)", "agent-1")
    assert status in (200, 202), rec
    time.sleep(0.5)
    pid = kg.kernel_pid(kid)
    kill_9(kg)
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not pid_alive(pid), 5)
    with next_kgate(kgate_bin, kg.root) as kg2:
        assert kernel_ids(kg2)[kid]["execution_state"] == "dead"
        lost = kg2.rest("GET", f"/api/kgate/jobs/{rec['job']}")[2]
        assert lost["status"] == "kernel_lost" and "ended while no kgate was running" in lost["note"], lost
        old = kg2.rest("GET", f"/api/kgate/jobs/{done['job']}")[2]
        assert old["status"] == "ok" and old["output"] == "before\n", old


def test_a_torn_or_foreign_records_log_is_reported_and_skipped(kgate_factory, kgate_bin):
    kg = kgate_factory()
    a = kg.start_kernel()["id"]
    b = kg.start_kernel()["id"]
    ja = agent_run(kg, a, "print('a')", "agent-1")
    jb = agent_run(kg, b, "print('b')", "agent-2")
    kill_9(kg)
    with open(records_dir(kg) / f"{a}.log", "a") as f:
        f.write('{"t": "job", "n": 999, "orig')  # a kill -9 in the middle of a write
    (records_dir(kg) / f"{b}.log").write_text(json.dumps({"format": "kgate-records", "version": 99, "kernel": b}) + "\n")
    with next_kgate(kgate_bin, kg.root) as kg2:
        wait_idle(kg2, a)
        assert any("last line was cut short" in line for line in kg2.log_lines), kg2.log_tail(30)
        assert any("another version" in line and ".bad" in line for line in kg2.log_lines), kg2.log_tail(30)
        assert kg2.rest("GET", f"/api/kgate/jobs/{ja['job']}")[2]["output"] == "a\n"
        assert kg2.rest("GET", f"/api/kgate/jobs/{jb['job']}")[0] == 404
        assert (records_dir(kg) / f"{b}.log.bad").exists()
        # The torn line is gone from the log (compacted at the start), and appends go on.
        nxt = agent_run(kg2, a, "print('after')", "agent-1")
        lines = (records_dir(kg) / f"{a}.log").read_text().splitlines()
        assert all(json.loads(line) for line in lines), lines
        assert any(json.loads(line).get("n") == job_num(nxt["job"]) for line in lines)


def test_the_cull_clock_goes_on_across_a_sigterm_restart(kgate_factory, kgate_bin):
    """The kernel's last_activity is saved when kgate leaves it running, and the next kgate's
    model (and cull clock) goes on from it; kgate's own requests at the re-adoption are not
    activity.  After a kill -9 nothing was saved, and the clock starts at the re-adoption."""
    kg = kgate_factory()
    kid = kg.start_kernel()["id"]
    agent_run(kg, kid, "x = 1", "agent-1")
    time.sleep(0.5)
    before = kernel_ids(kg)[kid]["last_activity"]
    time.sleep(1.5)
    kg.stop(sweep=False)  # SIGTERM
    with next_kgate(kgate_bin, kg.root) as kg2:
        wait_idle(kg2, kid)
        time.sleep(0.5)  # the history probe's busy/idle have come
        after = kernel_ids(kg2)[kid]["last_activity"]
        assert after[:23] == before[:23], (before, after)  # saved to the millisecond
        status, _, model = kg2.rest("GET", f"/api/kgate/kernels/{kid}")
        assert status == 200 and model["age_seconds"] >= 2.0, model  # its age goes on too


def test_the_agents_next_reply_tells_of_cells_run_while_kgate_was_away(mcp_bin, kgate_factory, kgate_bin, tmp_path):
    """kgate-mcp across a restart, with a qtconsole-style client running a cell in the gap: the
    agent's next reply names it, and poll_job shows its code, result and note."""
    kg = kgate_factory()
    agent = Agent(mcp_bin, tmp_path / "agent", kg.url)
    try:
        assert agent.ok("execute", code="x = 41").endswith("(no output)")
        (kid,) = kernel_ids(kg)
        kc = attach_client(kg, kid)
        try:
            port = kg.port
            kg.stop(sweep=False)  # SIGTERM: the kernel stays
            content, _ = kc_run(kc, "y = x * 2\ny")
            assert content["status"] == "ok", content
        finally:
            kc.stop_channels()
        with next_kgate(kgate_bin, kg.root, port=port):
            reply = agent.ok("execute", code="x + 1")
            m = re.search(r"1 cell was run by the user since your last call: (job-\d+) \(end_not_recorded\)", reply)
            assert reply.startswith("42") and m, reply
            shown = agent.ok("poll_job", job=m.group(1))
            assert "end_not_recorded" in shown and "82" in shown and "It ran while kgate was away" in shown, shown
    finally:
        agent.kill()
