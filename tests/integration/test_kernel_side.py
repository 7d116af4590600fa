"""kgate's half of the session kernel inside the kernel (issue 21; docs/dev/kernel-side.md): installed into
every ipykernel kgate launches. Silent cells from clients attached by connection file are
recorded as the user's; a shutdown_request from anyone but kgate is refused; a stop names its
cell and never lands in the next one; a background task is its own job beside the cells; verify
runs cells in a scratch kernel; a kernel without the kernel side works as before and says which
features are off."""

import json
import os
import random
import re
import signal
import time

from conftest import Kgate, wait_until
from records_util import (agent_execute, agent_run, attach_client, digest, get_job, interrupt_job, kgate_kernel,
                          list_jobs, wait_for_job, wait_job_end)
from test_mcp_semantics import Agent
from test_mcp_transcript import mcp_bin  # noqa: F401 (a fixture)

FEATURES = {"shutdown_guard", "silent_echo", "stop", "close", "tasks", "run_async"}


def kernel_side(kg, kid, timeout=20):
    """The kernel's kgate_kernel_side once its install was answered."""
    assert wait_until(lambda: kgate_kernel(kg, kid).get("kgate_kernel_side"), timeout), \
        f"no kgate_kernel_side for {kid}: {kgate_kernel(kg, kid)}\n{kg.log_tail(30)}"
    return kgate_kernel(kg, kid)["kgate_kernel_side"]


def assert_on(side):
    assert side["installed"] is True, side
    assert side["features"] == {f: True for f in FEATURES}, side


def kgate_with_kernel(kgate_factory):
    """A kgate and an ipykernel of it with every feature of the kernel side on."""
    kg = kgate_factory()
    kid = kg.start_kernel()["id"]
    assert_on(kernel_side(kg, kid))
    return kg, kid


def reply_to(get, msg, timeout=15):
    """The reply to `msg` (or to the request with that msg_id) from a channel's get_*_msg."""
    msg_id = msg if isinstance(msg, str) else msg["header"]["msg_id"]
    while True:
        reply = get(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply


def test_silent_foreign_cells_are_recorded_and_empty_ones_are_not(kgate_factory):
    kg, kid = kgate_with_kernel(kgate_factory)
    kc = attach_client(kg, kid)
    try:
        # A silent cell runs with full effect: it is the user's cell, silent or not.
        reply = kc.execute_interactive("x_silent = 41 + 1", silent=True, timeout=30)
        assert reply["content"]["status"] == "ok", reply
        job = wait_for_job(kg, kid, lambda j: j.get("code") == "x_silent = 41 + 1", what="the silent cell")
        assert job["origin"] == "user", job
        # What clients send silently without code (qtconsole's prompt number, user_expressions)
        # is not a cell.
        for _ in range(3):
            r = kc.execute_interactive("", silent=True, user_expressions={"n": "1 + 1"}, timeout=30)
            assert r["content"]["status"] == "ok" and r["content"]["user_expressions"]["n"]["status"] == "ok", r
        r = kc.execute_interactive("marker_cell = 1", timeout=30)
        assert r["content"]["status"] == "ok", r
        wait_for_job(kg, kid, lambda j: j.get("code") == "marker_cell = 1" and j["status"] != "running",
                     what="the marker cell")
        codes = [j.get("code") for j in list_jobs(kg, kid)["jobs"]]
        assert codes == ["x_silent = 41 + 1", "marker_cell = 1"], codes
    finally:
        kc.stop_channels()
    # The agent is told of it, and sees its effect.
    rec = agent_run(kg, kid, "print(x_silent)", "agent-a")
    assert rec["status"] == "ok" and "42" in rec.get("output", ""), rec
    d = digest(kg, kid, "agent-a")
    assert any(j["job"] == job["job"] for j in d["jobs"]), d


def test_a_foreign_shutdown_is_refused_and_the_kernel_lives_on(kgate_factory):
    kg, kid = kgate_with_kernel(kgate_factory)
    pid = kg.kernel_pid(kid)
    kc = attach_client(kg, kid)
    try:
        for restart in (False, True):
            msg = kc.session.msg("shutdown_request", {"restart": restart})
            kc.control_channel.send(msg)
            reply = reply_to(kc.get_control_msg, msg)
            assert reply["msg_type"] == "shutdown_reply" and reply["content"]["status"] == "error", reply
            assert "kgate" in reply["content"]["evalue"], reply
        # The shell channel's shutdown_request (older clients) is refused too.
        msg = kc.session.msg("shutdown_request", {"restart": False})
        kc.shell_channel.send(msg)
        reply = reply_to(kc.get_shell_msg, msg)
        assert reply["msg_type"] == "shutdown_reply" and reply["content"]["status"] == "error", reply
        time.sleep(0.5)
        r = kc.execute_interactive("alive = 'yes'", timeout=30)
        assert r["content"]["status"] == "ok", r
    finally:
        kc.stop_channels()
    os.kill(pid, 0)  # the same process
    assert kg.kernel_model(kid)["execution_state"] != "dead"
    # The record says who tried.
    side = kernel_side(kg, kid)
    assert len(side["refused"]) == 3, side
    assert {r["session"] for r in side["refused"]} == {kc.session.session}, side
    assert [r["channel"] for r in side["refused"]] == ["control", "control", "shell"], side
    assert [r["restart"] for r in side["refused"]] == [False, True, False], side
    assert any("refused a shutdown_request from session" in line for line in kg.log_lines), kg.log_tail(20)

    # kgate itself may: a restart keeps the id and installs the kernel side anew, and a DELETE
    # ends the kernel by its shutdown_request, well within the grace before SIGTERM.
    status, _, body = kg.rest("POST", f"/api/kernels/{kid}/restart")
    assert status == 200, body
    new_pid = kg.kernel_pid(kid)
    assert new_pid != pid
    assert_on(kernel_side(kg, kid))
    t0 = time.monotonic()
    kg.delete_kernel(kid)
    assert wait_until(lambda: not os.path.exists(f"/proc/{new_pid}") or
                      open(f"/proc/{new_pid}/stat").read().split()[2] == "Z", 10)
    assert time.monotonic() - t0 < 2.0, "the kernel did not end by kgate's own shutdown_request"
    assert not any("SIGTERM" in line and kid in line for line in kg.log_lines), kg.log_tail(20)


ECHO_KERNEL = r'''
from ipykernel.kernelapp import IPKernelApp
from ipykernel.kernelbase import Kernel


class EchoKernel(Kernel):
    implementation = "kgate-test-echo"
    implementation_version = "1"
    language = "text"
    language_version = "1"
    language_info = {"name": "text", "mimetype": "text/plain", "file_extension": ".txt"}
    banner = "echo"

    def do_execute(self, code, silent, store_history=True, user_expressions=None, allow_stdin=False):
        if not silent:
            self.send_response(self.iopub_socket, "stream", {"name": "stdout", "text": code})
        return {"status": "ok", "execution_count": self.execution_count, "payload": [], "user_expressions": {}}


IPKernelApp.launch_instance(kernel_class=EchoKernel)
'''


def kgate_with_echo_kernel(kgate_bin, tmp_path_factory):
    """A started kgate whose kernelspecs include "echo", a kernel that is not an ipykernel."""
    kg = Kgate(kgate_bin, tmp_path_factory.mktemp("kgate"))
    spec = kg.root / "share" / "kernels" / "echo"
    spec.mkdir(parents=True)
    (spec / "echo_kernel.py").write_text(ECHO_KERNEL)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": ["/usr/bin/python3", str(spec / "echo_kernel.py"), "-f", "{connection_file}"],
        "display_name": "Echo", "language": "text"}))
    return kg.start()


def test_a_kernel_without_the_kernel_side_works_with_its_features_off(kgate_bin, tmp_path_factory):
    kg = kgate_with_echo_kernel(kgate_bin, tmp_path_factory)
    try:
        kid = kg.start_kernel({"name": "echo"})["id"]
        side = kernel_side(kg, kid)
        assert side["installed"] is False and "kgate-test-echo" in side["reason"], side
        assert set(side["features"]) == FEATURES and all(isinstance(v, str) for v in side["features"].values()), side
        rec = agent_run(kg, kid, "hello echo", "agent-a")
        assert rec["status"] == "ok" and rec.get("output") == "hello echo", rec
        # As today: anyone holding the connection file may shut it down.
        kc = attach_client(kg, kid)
        try:
            kc.shutdown()
        finally:
            kc.stop_channels()
        assert wait_until(lambda: kg.rest("GET", f"/api/kernels/{kid}")[0] == 404 or
                          kg.kernel_model(kid)["execution_state"] in ("dead", "restarting", "starting"), 20), \
            kg.log_tail(20)
    finally:
        kg.cleanup_kernels()
        kg.stop()


def test_the_host_is_kept_across_kgates_so_readopted_kernels_obey_the_next(kgate_bin, tmp_path_factory):
    """Kernels outlive kgate: the next kgate on the same state directory is the same host."""
    kg = Kgate(kgate_bin, tmp_path_factory.mktemp("kgate"))
    kg.start()
    kid = kg.start_kernel()["id"]
    assert_on(kernel_side(kg, kid))
    host = (kg.root / "state" / "kgate" / "host-session").read_text().strip()
    assert host.startswith("kgate-") and len(host) == 38, host
    assert oct(os.stat(kg.root / "state" / "kgate" / "host-session").st_mode & 0o777) == "0o600"
    pid = kg.kernel_pid(kid)
    os.kill(kg.proc.pid, signal.SIGKILL)
    kg.proc.wait(10)
    kg2 = Kgate(kgate_bin, kg.root).start()
    try:
        assert wait_until(lambda: kg2.rest("GET", f"/api/kernels/{kid}")[0] == 200 and
                          kg2.kernel_model(kid)["execution_state"] == "idle", 30), kg2.log_tail(30)
        assert (kg.root / "state" / "kgate" / "host-session").read_text().strip() == host
        assert_on(kernel_side(kg2, kid))
        rec = agent_run(kg2, kid, "print('still here')", "agent-b")
        assert rec["status"] == "ok", rec
        kg2.delete_kernel(kid)
        assert wait_until(lambda: not os.path.exists(f"/proc/{pid}") or
                          open(f"/proc/{pid}/stat").read().split()[2] == "Z", 10)
        assert not any("refused" in line for line in kg2.log_lines), kg2.log_tail(20)
    finally:
        kg2.cleanup_kernels()
        kg2.stop()


def test_a_stop_interrupts_its_cell_through_the_kernel_side(kgate_factory):
    kg, kid = kgate_with_kernel(kgate_factory)
    status, rec = agent_execute(kg, kid, "import time\ntime.sleep(30)", "agent-a")
    assert status == 200, rec
    job = rec["job"]
    assert wait_until(lambda: get_job(kg, job)["began"], 10)
    t0 = time.monotonic()
    status, reply = interrupt_job(kg, job, agent="agent-a")
    assert status == 200 and reply == {"interrupted": job}, (status, reply)
    end = wait_job_end(kg, job, timeout=10)
    assert end["status"] == "interrupted" and time.monotonic() - t0 < 5, end
    assert any(f"{job} interrupted (in the kernel)" in line for line in kg.log_lines), kg.log_tail(20)
    # The kernel goes on; a stop of an ended job stops nothing.
    assert agent_run(kg, kid, "print('next')", "agent-a")["output"] == "next\n"
    status, reply = interrupt_job(kg, job, agent="agent-a")
    assert status == 409 and reply["refusal"] == "not_running", reply

    # The kernel side takes kgate_request from kgate only.
    kc = attach_client(kg, kid)
    try:
        msg = kc.session.msg("kgate_request", {"op": "interrupt", "request": "anything"})
        kc.control_channel.send(msg)
        r = reply_to(kc.get_control_msg, msg)
        assert r["msg_type"] == "kgate_reply" and r["content"]["refusal"] == "not_host", r
    finally:
        kc.stop_channels()


def test_a_stop_sent_as_a_cell_ends_never_lands_in_the_next_cell(kgate_factory):
    """200 times: the agent's short cell A, a user's cell B queued behind it, and a person's stop
    of A sent around the moment A ends. B is never interrupted."""
    kg, kid = kgate_with_kernel(kgate_factory)
    kc = attach_client(kg, kid)
    rng = random.Random(21)
    outcomes = {"interrupted": 0, "ok": 0, "stale": 0}
    try:
        for i in range(200):
            deadline = time.monotonic() + 10
            while True:
                status, rec = agent_execute(kg, kid, "import time\ntime.sleep(0.04)", "agent-a")
                if status == 200 or time.monotonic() > deadline:
                    break
                time.sleep(0.01)  # the last B's end not yet recorded
            assert status == 200, rec
            a = rec["job"]
            b = kc.execute(f"import time\ntime.sleep(0.03)\nb_{i % 7} = {i}", stop_on_error=False)
            time.sleep(rng.uniform(0.0, 0.08))
            status, reply = interrupt_job(kg, a)
            assert status in (200, 409), (status, reply)
            if status == 409:
                assert reply["refusal"] in ("not_running", "not_begun"), reply
            msg = reply_to(kc.get_shell_msg, b, timeout=30)
            assert msg["content"]["status"] == "ok", f"iteration {i}: the stop of {a} landed in the next cell: {msg['content']}"
            end = wait_job_end(kg, a, timeout=10)
            assert end["status"] in ("ok", "interrupted"), end
            if end["status"] == "interrupted":
                assert status == 200, (status, reply, end)
            outcomes["interrupted" if end["status"] == "interrupted" else ("stale" if status == 409 else "ok")] += 1
    finally:
        kc.stop_channels()
    # The race was really run: stops landed, and stops came too late.
    assert outcomes["interrupted"] >= 10 and outcomes["ok"] + outcomes["stale"] >= 10, outcomes


# ---- kgate-mcp: verify in a scratch kernel, and what server_status says ----



def kernels(kg):
    status, _, body = kg.rest("GET", "/api/kernels")
    assert status == 200, body
    return {k["id"] for k in body}


def test_verify_runs_cells_in_a_scratch_kernel_and_leaves_the_working_one_alone(kgate_factory, mcp_bin, tmp_path):
    kg = kgate_factory()
    agent = Agent(mcp_bin, tmp_path / "agent", kg.url)
    try:
        agent.ok("execute", code="import os\nworking = 'mine'\nos.environ['KGATE_VERIFY_MARK'] = 'set'")
        status = agent.ok("server_status")
        assert "kernel side: on (close, run_async, shutdown_guard, silent_echo, stop, tasks)" in status, status
        kid = re.search(r"kernel: ([0-9a-f-]{36})", status).group(1)
        before = kernels(kg)

        text = agent.ok("verify", cells=["a = 40", "b = a + 2\nprint('b is', b)", "b"])
        assert "all 3 cells passed" in text and "your kernel was not touched" in text, text
        assert "b is 42" in text and "42" in text.split("cell 3/3")[1], text
        # A clean start: the working kernel's names are not there; its own are not kept.
        text = agent.error("verify", cells=["print(working)"])
        assert "FAILED: cell 1/1 raised NameError" in text and "NameError: name 'working' is not defined" in text, text
        # The first error stops the run unless keep_going.
        text = agent.error("verify", cells=["x = 1", "1/0", "print('after')"])
        assert "ZeroDivisionError" in text and "2 of 3 passed" not in text and "1 not run" in text, text
        assert "cell 3/3" not in text, text
        text = agent.error("verify", cells=["x = 1", "1/0", "print('after')"], keep_going=True)
        assert "2 of 3 passed" in text and "after" in text, text
        # A cell past its timeout is interrupted and fails.
        text = agent.error("verify", cells=["import time\ntime.sleep(30)"], timeout=1)
        assert "timeout" in text and "interrupted" in text, text

        # Every scratch kernel is gone, the working kernel is untouched.
        assert wait_until(lambda: kernels(kg) == before, 15), (kernels(kg), before)
        assert agent.ok("execute", code="print(working, os.environ['KGATE_VERIFY_MARK'])").startswith("mine set")
        # Each cell was recorded, under the verification's label.
        status_, _, jobs = kg.rest("GET", "/api/kgate/jobs")
        labels = [j.get("label") or "" for j in jobs["jobs"]]
        assert sum(" · verify " in lab for lab in labels) >= 10, labels
        assert kid in kernels(kg)
        # The scratch kernels may come from the warm pool: their request is one a pooled kernel takes.
        assert not any("not from the pool" in line for line in kg.log_lines), kg.log_tail(30)
    finally:
        agent.exit()



TICKER = "import time\nfor i in range(300):\n    print('tick', i, flush=True)\n    time.sleep(0.1)"


def test_a_background_task_is_its_own_job_beside_the_cells(kgate_factory):
    kg, kid = kgate_with_kernel(kgate_factory)
    # Attached first: jupyter_client's wait_for_ready drains iopub until it is quiet.
    kc = attach_client(kg, kid)
    status, rec = agent_execute(kg, kid, TICKER, "agent-a", wait=1, background=True)
    assert status == 200, rec
    task = rec["job"]
    assert rec["status"] == "running" and rec["code"] == TICKER and rec["origin"] == "mcp", rec
    # The agent does not queue: execute is refused while the task runs, naming it.
    status, reply = agent_execute(kg, kid, "1 + 1", "agent-a")
    assert status == 409 and reply["refusal"] == "busy" and reply["running_job"] == task, reply
    assert "background task" in reply["message"], reply
    # A person's cell runs beside it, and is recorded on its own: no tick in it, and it does not
    # end the task.
    try:
        r = kc.execute_interactive("print('user cell')\nuser_var = 7", timeout=30)
        assert r["content"]["status"] == "ok", r
    finally:
        kc.stop_channels()
    user = wait_for_job(kg, kid, lambda j: j.get("code", "").startswith("print('user cell')") and j["status"] != "running",
                        what="the user's cell")
    assert get_job(kg, user["job"])["output"] == "user cell\n"
    time.sleep(0.5)
    rec = get_job(kg, task)
    assert rec["status"] == "running" and "tick 3" in rec["output"] and "user cell" not in rec["output"], rec
    # interrupt(job) raises KeyboardInterrupt in the task's thread, and stops nothing else.
    status, reply = interrupt_job(kg, task, agent="agent-a")
    assert status == 200, reply
    end = wait_job_end(kg, task, timeout=10)
    assert end["status"] == "interrupted", end
    status, reply = interrupt_job(kg, task, agent="agent-a")
    assert status == 409 and reply["refusal"] == "not_running", reply
    after = agent_run(kg, kid, "print(user_var, i > 3)", "agent-a")
    assert after["status"] == "ok" and after["output"] == "7 True\n", after

    # A task that ends by itself: ok with its output, or error with its traceback.
    status, rec = agent_execute(kg, kid, "import time\ntime.sleep(0.5)\nbg_result = 6 * 7\nprint('done')", "agent-a",
                                wait=0, background=True)
    assert status == 200, rec
    end = wait_job_end(kg, rec["job"], timeout=15)
    assert end["status"] == "ok" and end["output"] == "done\n", end
    assert agent_run(kg, kid, "print(bg_result)", "agent-a")["output"] == "42\n"
    status, rec = agent_execute(kg, kid, "import time\ntime.sleep(0.3)\n{}['missing']", "agent-a", wait=0,
                                background=True)
    end = wait_job_end(kg, rec["job"], timeout=15)
    assert end["status"] == "error" and end["error"]["ename"] == "KeyError", end
    assert any("missing" in line for line in end["error"]["traceback"]), end
    assert end["error"]["traceback"][-1].startswith("KeyError"), end
    # Code that does not compile fails in its starting cell: no task.
    status, rec = agent_execute(kg, kid, "def (:", "agent-a", wait=5, background=True)
    assert status == 200 and rec["status"] == "error" and rec["error"]["ename"] == "SyntaxError", rec
    assert agent_run(kg, kid, "print('free')", "agent-a")["output"] == "free\n"


def test_background_needs_the_kernel_side(kgate_bin, tmp_path_factory):
    kg = kgate_with_echo_kernel(kgate_bin, tmp_path_factory)
    try:
        kid = kg.start_kernel({"name": "echo"})["id"]
        kernel_side(kg, kid)
        status, _, reply = kg.rest("POST", f"/api/kgate/kernels/{kid}/execute",
                                   {"code": "x", "agent": "a", "background": True})
        assert status == 409 and reply["refusal"] == "no_tasks" and "kgate-test-echo" in reply["message"], reply
    finally:
        kg.cleanup_kernels()
        kg.stop()


def test_kgate_mcp_runs_a_background_task(kgate_factory, mcp_bin, tmp_path):
    kg = kgate_factory()
    agent = Agent(mcp_bin, tmp_path / "agent", kg.url)
    try:
        text = agent.ok("execute", code=TICKER, background=True)
        job = re.search(r"(job-\d+) runs in the background", text).group(1)
        text = agent.error("execute", code="1 + 1")
        assert job in text and "background task" in text, text
        text = agent.ok("poll_job", job=job, wait=1)
        assert "tick" in text, text
        status = agent.ok("server_status")
        assert f"state: busy (background task {job}, yours: interrupt(job='{job}') stops it)" in status, status
        text = agent.ok("interrupt", job=job)
        assert job in text and "interrupted" in text, text
        assert agent.ok("execute", code="print('after')").startswith("after")
    finally:
        agent.exit()


def test_a_background_task_stays_running_until_it_ends(kgate_factory, mcp_bin, tmp_path):  # noqa: F811
    """A task's starting cell is answered at once; its job used to be ended "ok" by the reply
    grace (5 s) while the task printed on, so poll_job, server_status and the refusal all said
    it was over. Followed here to its real end, past the grace."""
    kg = kgate_factory()
    agent = Agent(mcp_bin, tmp_path / "agent", kg.url)
    try:
        code = "import time\nfor i in range(9):\n    print('tick', i, flush=True)\n    time.sleep(1)"
        text = agent.ok("execute", code=code, background=True)
        job = re.search(r"(job-\d+) runs in the background", text).group(1)
        text = agent.ok("poll_job", job=job, wait=6.5)  # past the 5 s grace
        assert f"{job}: running" in text or "still running" in text, text
        status = agent.ok("server_status")
        assert f"state: busy (background task {job}" in status, status
        assert job in agent.error("execute", code="1 + 1")
        assert kg.rest("GET", f"/api/kgate/jobs/{job}")[2]["status"] == "running"
        text = agent.ok("poll_job", job=job, wait=15)
        assert f"{job}: ok" in text and "tick 8" in text, text
        assert agent.ok("execute", code="print('after')").startswith("after")
    finally:
        agent.exit()


def test_a_person_stops_a_silent_cell_of_an_attached_client(kgate_factory):
    """A silent cell is a cell: recorded, and stopped through the kernel side like any other."""
    kg, kid = kgate_with_kernel(kgate_factory)
    kc = attach_client(kg, kid)
    try:
        msg_id = kc.execute("import time\ntime.sleep(30)", silent=True)
        job = wait_for_job(kg, kid, lambda j: j.get("code") == "import time\ntime.sleep(30)", what="the silent cell")
        assert job["origin"] == "user", job
        assert wait_until(lambda: get_job(kg, job["job"])["began"], 10)
        time.sleep(0.3)
        status, reply = interrupt_job(kg, job["job"])  # the person at the machine
        assert status == 200 and reply == {"interrupted": job["job"]}, (status, reply)
        r = reply_to(kc.get_shell_msg, msg_id)
        assert r["content"]["status"] == "error" and r["content"]["ename"] == "KeyboardInterrupt", r["content"]
    finally:
        kc.stop_channels()
    end = wait_job_end(kg, job["job"], timeout=10)
    assert end["status"] == "interrupted", end


CLOSE_SETUP = """
import atexit, time
def _mark(name):
    with open({dir!r} + '/' + name, 'w') as f:
        f.write(name)
atexit.register(_mark, 'atexit')
"""
CLOSE_TASK = "try:\n    while True:\n        time.sleep(0.05)\nfinally:\n    _mark('task')\n"
CLOSE_CELL = "try:\n    time.sleep(60)\nfinally:\n    _mark('cell')\n"


def stop_busy_kernel(kg, kid, marks):
    """Starts a task and a cell that run until stopped, each marking its end in `marks`, then
    DELETEs the kernel; returns (seconds the DELETE took, the marks made, the two jobs)."""
    agent_run(kg, kid, CLOSE_SETUP.format(dir=str(marks)), "agent-a")
    status, task = agent_execute(kg, kid, CLOSE_TASK, "agent-a", wait=0, background=True)
    assert status == 200 and task["status"] == "running", task
    # A person's cell holds the main thread (the agent does not queue behind its own task).
    kc = attach_client(kg, kid)
    try:
        kc.execute(CLOSE_CELL)
        cell = wait_for_job(kg, kid, lambda j: j.get("code") == CLOSE_CELL and j["status"] == "running",
                            what="the cell")
    finally:
        kc.stop_channels()
    pid = kg.kernel_pid(kid)
    t0 = time.monotonic()
    kg.delete_kernel(kid)
    assert wait_until(lambda: not os.path.exists(f"/proc/{pid}") or
                      open(f"/proc/{pid}/stat").read().split()[2] == "Z", 15)
    return time.monotonic() - t0, sorted(os.listdir(marks)), (task["job"], cell["job"])


def test_a_busy_kernel_closes_before_it_stops(kgate_factory, tmp_path):
    kg, kid = kgate_with_kernel(kgate_factory)
    marks = tmp_path / "on"
    marks.mkdir()
    took, made, jobs = stop_busy_kernel(kg, kid, marks)
    # The close stopped the cell and the task, their finally blocks ran, and the process then
    # ended by kgate's shutdown_request, so its atexit handlers ran too; no SIGTERM.
    assert made == ["atexit", "cell", "task"], (made, kg.log_tail(20))
    assert took < 4.0, took
    assert any("closed; stopped" in line and kid in line for line in kg.log_lines), kg.log_tail(20)
    assert not any("SIGTERM" in line and kid in line for line in kg.log_lines), kg.log_tail(20)
    # The records say the shutdown ended them, not an interrupt.
    for job in jobs:
        rec = get_job(kg, job)
        assert rec["status"] == "kernel_lost" and "the kernel was shut down" in rec["note"], rec

    # With the close off (close_grace_ms = 0), the same kernel is ended by SIGTERM after the
    # grace: no finally block of the cell, no atexit handler.
    config = tmp_path / "kgate.toml"
    config.write_text("[kernel]\nclose_grace_ms = 0\n")
    kg2 = kgate_factory(config=config)
    kid2 = kg2.start_kernel()["id"]
    assert_on(kernel_side(kg2, kid2))
    marks2 = tmp_path / "off"
    marks2.mkdir()
    took2, made2, _ = stop_busy_kernel(kg2, kid2, marks2)
    assert "cell" not in made2 and "atexit" not in made2, made2
    assert any("SIGTERM" in line and kid2 in line for line in kg2.log_lines), kg2.log_tail(20)


def test_a_person_starts_a_task_with_run_async(kgate_factory):
    kg, kid = kgate_with_kernel(kgate_factory)
    kc = attach_client(kg, kid)
    code = "%%run_async\nimport time\nfor i in range(2000):\n    print('tock', i)\n    time.sleep(0.05)\n"
    try:
        r = kc.execute_interactive(code, timeout=30)
        assert r["content"]["status"] == "ok", r
        task = wait_for_job(kg, kid, lambda j: j.get("code") == code, what="the person's task")
        assert task["origin"] == "user", task
        # The cell returned at once; the task goes on as its job, with its prints.
        time.sleep(0.5)
        rec = get_job(kg, task["job"])
        assert rec["status"] == "running" and "tock 3" in rec["output"], rec
        # The agent does not run beside it, and is told which job runs.
        status, reply = agent_execute(kg, kid, "1 + 1", "agent-a")
        assert status == 409 and reply["refusal"] == "busy" and reply["running_job"] == task["job"], reply
        assert "The user's background task " + task["job"] in reply["message"], reply
        assert "ask the user to stop it" in reply["message"], reply
        # Nor may the agent stop it: it is the person's.
        status, reply = interrupt_job(kg, task["job"], agent="agent-a")
        assert status == 403, reply
        # The person's next cell runs meanwhile, recorded on its own.
        r = kc.execute_interactive("beside = 5", timeout=30)
        assert r["content"]["status"] == "ok", r
        beside = wait_for_job(kg, kid, lambda j: j.get("code") == "beside = 5" and j["status"] != "running",
                              what="the cell beside the task")
        assert "tock" not in get_job(kg, beside["job"])["output"]
        # The person at the machine stops it (the observe page's Stop); the person's console is
        # told as for a cell: an error under that cell.
        status, reply = interrupt_job(kg, task["job"])
        assert status == 200, reply
        assert wait_job_end(kg, task["job"], timeout=10)["status"] == "interrupted"
        start_request = get_job(kg, task["job"])["request"]
        deadline = time.monotonic() + 10
        while True:
            msg = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["msg_type"] == "error" and msg["parent_header"].get("msg_id") == start_request:
                assert msg["content"]["ename"] == "KeyboardInterrupt", msg
                break
        # Misuse is the cell's error, and starts nothing.
        for bad in ("%%run_async now\nx = 1", "%%run_async\n"):
            # stop_on_error=False: ipykernel would abort the second if it came in the first's
            # abort window.
            r = kc.execute_interactive(bad, timeout=30, stop_on_error=False)
            assert r["content"]["status"] == "error" and "run_async" in r["content"]["evalue"], r
        # No name was added to the user's namespace.
        r = kc.execute_interactive("", user_expressions={"n": "'run_async' in dir()"}, timeout=30)
        assert r["content"]["user_expressions"]["n"]["data"]["text/plain"] == "False", r
    finally:
        kc.stop_channels()
    assert agent_run(kg, kid, "print(beside, i > 3)", "agent-a")["output"] == "5 True\n"


def test_a_task_outlives_its_kgate(kgate_bin, tmp_path_factory):
    """Kernels outlive kgate, and so do their background tasks: the next kgate keeps the task's
    job running and files its prints under it; a task that ended while no kgate listened ends
    end_not_recorded."""
    kg = Kgate(kgate_bin, tmp_path_factory.mktemp("kgate")).start()
    kg2 = None
    try:
        kid = kg.start_kernel()["id"]
        assert_on(kernel_side(kg, kid))
        status, rec = agent_execute(kg, kid, TICKER, "agent-a", wait=1, background=True)
        assert status == 200 and rec["status"] == "running", rec
        task = rec["job"]
        assert get_job(kg, task)["task"] is True
        status, rec = agent_execute(kg, kid, "import time\ntime.sleep(3)\nprint('short done')", "agent-a",
                                    wait=0, background=True)
        assert status == 409, rec  # one at a time
        kg.stop(sig=signal.SIGTERM, sweep=False)  # kernels go on
        kg2 = Kgate(kgate_bin, kg.root).start()
        assert wait_until(lambda: kg2.rest("GET", f"/api/kernels/{kid}")[0] == 200 and
                          kg2.kernel_model(kid)["execution_state"] == "idle", 30), kg2.log_tail(30)
        assert_on(kernel_side(kg2, kid))
        rec = get_job(kg2, task)
        assert rec["status"] == "running" and rec["task"] is True, rec
        time.sleep(1.5)  # past the gap's one-second end
        before = get_job(kg2, task)
        assert before["status"] == "running", before
        last = int(re.findall(r"tick (\d+)", before["output"])[-1])
        assert wait_until(lambda: f"tick {last + 3}" in get_job(kg2, task)["output"], 10), get_job(kg2, task)
        status, reply = agent_execute(kg2, kid, "1 + 1", "agent-a")
        assert status == 409 and reply["running_job"] == task, reply
        status, reply = interrupt_job(kg2, task, agent="agent-a")
        assert status == 200, reply
        assert wait_job_end(kg2, task, timeout=10)["status"] == "interrupted"

        # A task that ends while no kgate listens.
        status, rec = agent_execute(kg2, kid, "import time\ntime.sleep(2)\nprint('short done')", "agent-a",
                                    wait=0, background=True)
        assert status == 200, rec
        short = rec["job"]
        assert wait_until(lambda: get_job(kg2, short)["task"], 10), get_job(kg2, short)
        kg2.stop(sig=signal.SIGTERM, sweep=False)
        time.sleep(3)
        kg2 = Kgate(kgate_bin, kg.root).start()
        assert wait_until(lambda: kg2.rest("GET", f"/api/kernels/{kid}")[0] == 200 and
                          kg2.kernel_model(kid)["execution_state"] == "idle", 30), kg2.log_tail(30)
        rec = wait_job_end(kg2, short, timeout=10)
        assert rec["status"] == "end_not_recorded" and "while kgate was away" in rec["note"], \
            (rec["status"], rec["note"], kg2.log_tail(40))
        assert agent_run(kg2, kid, "print('free')", "agent-a")["output"] == "free\n"
    finally:
        for k in (kg2, kg):
            if k is not None and k.proc is not None and k.proc.poll() is None:
                k.cleanup_kernels()
                k.stop()
