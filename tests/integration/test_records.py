"""Session records (docs/records.md, "Session records: the kgate extensions"): every cell recorded with
its origin, the agent path (no queue, claims), stops that name their job, the foreign digest,
kernel death and restarts, and the notebook export.  Real kernels, real sockets, real clients:
the agent path over HTTP, humans over the websocket API and straight on the kernel's ZMQ ports
with jupyter_client's BlockingKernelClient (which kgate sees only on iopub)."""

import os
import re
import shlex
import signal
import threading
import time
import uuid

import pytest

from conftest import pid_alive, wait_until
from records_util import (AgentLink, agent_execute, agent_run, assert_refusal, attach_client,
                          digest, digest_ack, get_job, interrupt_job, job_num, kc_finish, kc_run,
                          kgate_kernel, list_jobs, records_config, wait_for_job, wait_job_end)

SLEEP30 = "import time\ntime.sleep(30)"


def agent_id(name):
    return f"{name}-{uuid.uuid4().hex[:8]}"


def wait_began(kg, job, timeout=15):
    """The record once its execute_input has come (a SIGINT before it would be lost)."""
    rec = wait_until(lambda: (lambda r: r if r["began"] else None)(get_job(kg, job)), timeout)
    assert rec, f"{job} did not begin within {timeout}s: {get_job(kg, job)!r}"
    assert rec["status"] == "running", rec
    return rec


def no_ansi(lines):
    return not any("\x1b" in line for line in lines)


def mark_after(mark):
    """after_job of a restart mark as a number (the README shows it as a job: "job-N")."""
    after = mark["after_job"]
    return job_num(after) if isinstance(after, str) else after


# --------------------------------------------------------------------------
# Discovery and the kernel model
# --------------------------------------------------------------------------

def test_api_advertises_extensions(kgate):
    status, _, body = kgate.rest("GET", "/api")
    assert status == 200, body
    assert isinstance(body.get("extensions"), dict), f"GET /api has no extensions: {body!r}"
    assert isinstance(body["extensions"].get("kgate"), dict), body


def test_kgate_kernel_model(kgate, kernel):
    model = kgate_kernel(kgate, kernel)
    assert model["id"] == kernel, model
    assert model["connection_file"] == str(kgate.connection_file(kernel)), model
    argv = shlex.split(model["attach_command"])
    assert "--existing" in argv, model["attach_command"]
    assert argv[argv.index("--existing") + 1] == model["connection_file"], model["attach_command"]
    assert model["claim"] is None and model["running_job"] is None, model
    status, _, listing = kgate.rest("GET", "/api/kgate/kernels")
    assert status == 200, listing
    assert kernel in [k["id"] for k in listing], listing


# --------------------------------------------------------------------------
# 1. Two writers, the digest
# --------------------------------------------------------------------------

def test_two_writers_recorded_and_digest(kgate, kernel):
    a, b = agent_id("agent-a"), agent_id("agent-b")
    with AgentLink(kgate, a, "Agent A"):
        rec = agent_run(kgate, kernel, "print('from agent')\n6*7", a, label="Agent A")
        assert rec["status"] == "ok", rec
        assert (rec["origin"], rec["agent"], rec["label"], rec["kernel"]) == ("mcp", a, "Agent A", kernel), rec
        assert rec["output"] == "from agent\n", rec
        assert rec["result"] == "42", rec
        assert rec["error"] is None and rec["began"] is True, rec
        assert isinstance(rec["execution_count"], int), rec
        assert rec["began_at"] and rec["ended_at"] and rec["created"], rec

        kc = attach_client(kgate, kernel)
        try:
            content, out = kc_run(kc, "print('from user')\n'u' * 2")
            assert content["status"] == "ok" and out == "from user\n", (content, out)
            u = wait_for_job(kgate, kernel, lambda j: "from user" in j["code"], what="the user's cell")
            urec = wait_job_end(kgate, u["job"])
            assert job_num(u["job"]) > job_num(rec["job"]), (u, rec)
            assert (urec["origin"], urec["agent"], urec["label"]) == ("user", None, None), urec
            assert urec["status"] == "ok", urec
            assert urec["output"] == "from user\n", urec
            assert urec["result"] == "'uu'", urec
            assert urec["error"] is None, urec
            assert urec["execution_count"] == content["execution_count"], (urec, content)
            assert urec["seen_by_agent"] is False, urec

            content, _ = kc_run(kc, "raise ValueError('boom')")
            assert content["status"] == "error", content
            e = wait_for_job(kgate, kernel, lambda j: "boom" in j["code"], what="the user's failing cell")
            erec = wait_job_end(kgate, e["job"])
            assert erec["origin"] == "user" and erec["status"] == "error", erec
            assert erec["error"]["ename"] == "ValueError" and erec["error"]["evalue"] == "boom", erec
            assert isinstance(erec["error"]["traceback"], list) and erec["error"]["traceback"], erec
            assert "ValueError" in "\n".join(erec["error"]["traceback"]), erec
            assert no_ansi(erec["error"]["traceback"]), f"ANSI codes in the traceback: {erec!r}"

            # The digest lists the foreign jobs (not the agent's own), oldest first; reading
            # (the digest, the list, the records) never consumes.
            foreign = [u["job"], e["job"]]
            d1 = digest(kgate, kernel, a)
            assert [j["job"] for j in d1["jobs"]] == foreign, d1
            assert [(j["status"], j["origin"]) for j in d1["jobs"]] == [("ok", "user"), ("error", "user")], d1
            assert all(isinstance(j["elapsed"], (int, float)) for j in d1["jobs"]), d1
            assert d1["evicted_unseen"] == 0, d1
            list_jobs(kgate, kernel)
            get_job(kgate, u["job"])
            d2 = digest(kgate, kernel, a)
            assert [j["job"] for j in d2["jobs"]] == foreign, f"reading the digest consumed it: {d1!r} -> {d2!r}"

            # Only the claim holder acks while it is alive.
            status, body = digest_ack(kgate, kernel, b, foreign)
            assert_refusal(status, body, 403, "not_owner")
            assert [j["job"] for j in digest(kgate, kernel, a)["jobs"]] == foreign

            status, body = digest_ack(kgate, kernel, a, foreign)
            assert status == 200, body
            assert body.get("kept", []) == [], body
            assert digest(kgate, kernel, a)["jobs"] == [], "acked jobs are still in the digest"
            assert get_job(kgate, u["job"])["seen_by_agent"] is True

            # A running job is reported, but an ack does not retire it (kept) until it ends.
            msg_id = kc.execute("import time\ntime.sleep(3)", stop_on_error=False)
            r = wait_for_job(kgate, kernel, lambda j: "sleep(3)" in j["code"] and j["status"] == "running",
                             what="the user's running cell")
            d = digest(kgate, kernel, a)
            assert [(j["job"], j["status"]) for j in d["jobs"]] == [(r["job"], "running")], d
            status, body = digest_ack(kgate, kernel, a, [r["job"]])
            assert status == 200, body
            kept = body.get("kept")
            assert isinstance(kept, list) and [k["job"] for k in kept] == [r["job"]], body
            assert isinstance(kept[0].get("reason"), str) and kept[0]["reason"], body
            assert [j["job"] for j in digest(kgate, kernel, a)["jobs"]] == [r["job"]], "a running job was retired"
            assert kc_finish(kc, msg_id)["status"] == "ok"
            assert wait_job_end(kgate, r["job"])["status"] == "ok"
            d = digest(kgate, kernel, a)
            assert [(j["job"], j["status"]) for j in d["jobs"]] == [(r["job"], "ok")], d
            status, body = digest_ack(kgate, kernel, a, [r["job"]])
            assert status == 200 and body.get("kept", []) == [], body
            assert digest(kgate, kernel, a)["jobs"] == []
        finally:
            kc.stop_channels()


def test_finished_records_carry_the_digest_when_asked(kgate, kernel):
    """"digest": true on execute (and digest=1 on a job's GET) puts the kernel's digest in a
    record that is no longer running, so an agent learns of foreign cells without a second
    request; a running record never carries one, and a bad value is a 400."""
    a = agent_id("agent-d")
    with AgentLink(kgate, a, "Agent D"):
        kc = attach_client(kgate, kernel)
        try:
            kc_run(kc, "print('user cell')")
            u = wait_job_end(kgate, wait_for_job(kgate, kernel, lambda j: "user cell" in j["code"])["job"])
        finally:
            kc.stop_channels()
        status, rec = kgate.rest("POST", f"/api/kgate/kernels/{kernel}/execute",
                                 {"code": "1+1", "agent": a, "wait": 20, "digest": True})[0::2]
        assert status == 200 and rec["status"] == "ok", rec
        assert rec["digest"] == digest(kgate, kernel, a), rec
        assert [j["job"] for j in rec["digest"]["jobs"]] == [u["job"]], rec
        plain = agent_run(kgate, kernel, "2+2", a)
        assert "digest" not in plain, plain
        status, _, polled = kgate.rest("GET", f"/api/kgate/jobs/{plain['job']}?digest=1&agent={a}")
        assert status == 200 and polled["digest"]["kernel"] == kernel, polled
        assert [j["job"] for j in polled["digest"]["jobs"]] == [u["job"]], polled
        status, rec = kgate.rest("POST", f"/api/kgate/kernels/{kernel}/execute",
                                 {"code": "import time; time.sleep(2)", "agent": a, "wait": 0, "digest": True})[0::2]
        assert status == 200 and rec["status"] == "running" and "digest" not in rec, rec
        assert "digest" not in wait_job_end(kgate, rec["job"]), "a plain GET carries the digest"
        status, _, body = kgate.rest("GET", f"/api/kgate/jobs/{rec['job']}?digest=yes")
        assert status == 400 and "digest=yes" in body["message"], body
        status, _, body = kgate.rest("POST", f"/api/kgate/kernels/{kernel}/execute",
                                     {"code": "1", "agent": a, "digest": "yes"})
        assert status == 400 and "digest" in body["message"], body


# --------------------------------------------------------------------------
# 2. Claims
# --------------------------------------------------------------------------

def test_any_agent_acks_while_unclaimed(kgate, kernel, ws_clients):
    ws = kgate.connect(kernel)
    ws_clients.append(ws)
    ws.run("print('nobody claimed this')")
    u = wait_for_job(kgate, kernel, lambda j: "nobody" in j["code"] and j["status"] != "running")
    x = agent_id("agent-x")
    assert [j["job"] for j in digest(kgate, kernel, x)["jobs"]] == [u["job"]]
    status, body = digest_ack(kgate, kernel, x, [u["job"]])
    assert status == 200 and body.get("kept", []) == [], body
    assert digest(kgate, kernel, agent_id("agent-y"))["jobs"] == []
    assert kgate_kernel(kgate, kernel)["claim"] is None, "an ack claimed the kernel"


def test_claim_refuses_second_agent_until_first_exits(kgate, kernel, ws_clients):
    a, b = agent_id("agent-a"), agent_id("agent-b")
    link = AgentLink(kgate, a, "Agent A")
    try:
        agent_run(kgate, kernel, "a_var = 1", a, label="Agent A")
        assert kgate_kernel(kgate, kernel)["claim"] == {"agent": a, "label": "Agent A", "alive": True,
                                                        "connected": True, "lapses_in_seconds": None}

        status, body = agent_execute(kgate, kernel, "print('B')", b, label="Agent B")
        assert_refusal(status, body, 409, "claimed")
        assert body["holder"]["agent"] == a and body["holder"]["label"] == "Agent A", body
        assert "Agent A" in body["message"], f"the refusal does not name the holder: {body!r}"
        assert not [j for j in list_jobs(kgate, kernel)["jobs"] if j["agent"] == b], "a refused call became a job"

        # Humans are never gated: a websocket client and a client attached by connection file.
        ws = kgate.connect(kernel)
        ws_clients.append(ws)
        assert ws.run("print('human ws')") == "human ws\n"
        kc = attach_client(kgate, kernel)
        try:
            content, out = kc_run(kc, "print('human kc')")
            assert content["status"] == "ok" and out == "human kc\n", (content, out)
        finally:
            kc.stop_channels()
        for text in ("human ws", "human kc"):
            j = wait_for_job(kgate, kernel, lambda j, t=text: t in j["code"] and j["status"] != "running",
                             what=f"the cell {text!r}")
            assert j["origin"] == "user" and j["status"] == "ok", j

        # The second agent may neither stop the holder's job nor restart the kernel.
        long = agent_run(kgate, kernel, SLEEP30, a, label="Agent A", wait=0)
        wait_began(kgate, long["job"])
        assert_refusal(*interrupt_job(kgate, long["job"], agent=b), 403, "not_owner")
        status, _, body = kgate.rest("POST", f"/api/kgate/kernels/{kernel}/restart", {"agent": b})
        assert_refusal(status, body, 403, "not_owner")
        assert get_job(kgate, long["job"])["status"] == "running"
        status, body = interrupt_job(kgate, long["job"], agent=a)
        assert status == 200 and body == {"interrupted": long["job"]}, body
        assert wait_job_end(kgate, long["job"])["status"] == "interrupted"

        # The holder exits (close code 1000): a later agent resumes the kernel, namespace and all.
        link.close_normally()
        deadline = time.monotonic() + 1.5
        while True:
            status, rec = agent_execute(kgate, kernel, "print(a_var + 1)", b, label="Agent B", wait=20)
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert status == 200, f"agent B still refused after A closed its agent websocket: {status} {rec!r}"
        assert rec["status"] == "ok" and rec["output"] == "2\n" and rec["agent"] == b, rec
        claim = kgate_kernel(kgate, kernel)["claim"]
        assert claim and claim["agent"] == b and claim["label"] == "Agent B", claim

        status, body = agent_execute(kgate, kernel, "print('A again')", a, label="Agent A")
        assert_refusal(status, body, 409, "claimed")
        assert body["holder"]["agent"] == b and "Agent B" in body["message"], body
        status, _, model = kgate.rest("POST", f"/api/kgate/kernels/{kernel}/restart", {"agent": b})
        assert status == 200 and model["id"] == kernel, (status, model)
    finally:
        link.close_normally()


def test_claim_grace_after_abnormal_drop(kgate_factory, tmp_path):
    grace = 2
    kg = kgate_factory(config=records_config(tmp_path, claim_grace_seconds=grace))
    kid = kg.start_kernel()["id"]
    a, b = agent_id("agent-a"), agent_id("agent-b")
    link = AgentLink(kg, a, "Agent A")
    try:
        agent_run(kg, kid, "x = 1", a, label="Agent A")
        # Alive for as long as the websocket is held, however long ago the last request was.
        time.sleep(grace + 0.5)
        assert_refusal(*agent_execute(kg, kid, "x", b, label="Agent B"), 409, "claimed")

        link.drop()  # no close frame: the connection is down, not closed
        t_drop = time.monotonic()
        assert_refusal(*agent_execute(kg, kid, "x", b, label="Agent B"), 409, "claimed")
        while True:
            status, rec = agent_execute(kg, kid, "print(x + 1)", b, label="Agent B", wait=20)
            took = time.monotonic() - t_drop
            if status == 200:
                break
            assert_refusal(status, rec, 409, "claimed")
            assert took < grace + 5, f"claim not taken over {took:.1f}s after the drop (grace {grace}s)"
            time.sleep(0.2)
        assert took >= grace - 0.3, f"claim taken over {took:.2f}s after the drop, before the {grace}s grace"
        assert rec["output"] == "2\n" and rec["agent"] == b, rec
        assert kgate_kernel(kg, kid)["claim"]["agent"] == b
        assert [j["agent"] for j in list_jobs(kg, kid)["jobs"]] == [a, b], "refused calls became jobs"
    finally:
        link.close_normally()

    # An agent that never opened its websocket is alive for the grace after its last request.
    kid2 = kg.start_kernel()["id"]
    c, d = agent_id("agent-c"), agent_id("agent-d")
    agent_run(kg, kid2, "y = 5", c, label="Agent C")
    t_req = time.monotonic()
    assert_refusal(*agent_execute(kg, kid2, "y", d, label="Agent D"), 409, "claimed")
    while True:
        status, rec = agent_execute(kg, kid2, "print(y)", d, label="Agent D", wait=20)
        took = time.monotonic() - t_req
        if status == 200:
            break
        assert_refusal(status, rec, 409, "claimed")
        assert took < grace + 5, f"claim of a silent agent not taken over after {took:.1f}s"
        time.sleep(0.2)
    assert took >= grace - 0.3, f"silent agent's claim taken over {took:.2f}s after its request"
    assert rec["output"] == "5\n", rec


# --------------------------------------------------------------------------
# 3. The agent does not queue
# --------------------------------------------------------------------------

@pytest.mark.parametrize("via", ["attached", "websocket"])
def test_agent_refused_while_user_cell_runs(kgate, kernel, ws_clients, via):
    a = agent_id("agent")
    code = "import time\ntime.sleep(5)"
    if via == "attached":
        kc = attach_client(kgate, kernel)
        msg_id = kc.execute(code, stop_on_error=False)
    else:
        ws = kgate.connect(kernel)
        ws_clients.append(ws)
        r = ws.execute_async(code)
    try:
        u = wait_for_job(kgate, kernel, lambda j: j["code"] == code and j["status"] == "running",
                         what="the user's running sleep(5)")
        assert u["origin"] == "user", u
        status, body = agent_execute(kgate, kernel, "print('agent')", a)
        assert_refusal(status, body, 409, "busy")
        assert body["running_job"] == u["job"], body
        assert kgate_kernel(kgate, kernel)["running_job"] == u["job"]
        assert get_job(kgate, u["job"])["status"] == "running", "the refusal ended the user's cell"
        assert not [j for j in list_jobs(kgate, kernel)["jobs"] if j["origin"] == "mcp"], "refused call became a job"

        assert wait_job_end(kgate, u["job"], 15)["status"] == "ok"
        if via == "attached":
            assert kc_finish(kc, msg_id)["status"] == "ok"
        else:
            assert ws.collect(r).status == "ok"
    finally:
        if via == "attached":
            kc.stop_channels()
    rec = agent_run(kgate, kernel, "print('agent')", a)
    assert rec["status"] == "ok" and rec["output"] == "agent\n", rec
    assert kgate_kernel(kgate, kernel)["running_job"] is None


def test_agent_refused_while_a_request_awaits_its_reply(kgate, kernel, ws_clients):
    """A silent cell has no execute_input, so no record: the pending execute_request alone
    makes the kernel busy."""
    a = agent_id("agent")
    ws = kgate.connect(kernel)
    ws_clients.append(ws)
    r = ws.execute_async("import time\ntime.sleep(3)", silent=True)
    ws.wait_for(lambda m: m.get("parent_header", {}).get("msg_id") == r.msg_id
                and m.get("msg_type") == "status" and m["content"].get("execution_state") == "busy",
                10, what="busy for the silent cell")
    status, body = agent_execute(kgate, kernel, "print('agent')", a)
    assert_refusal(status, body, 409, "busy")
    assert body["running_job"] is None or get_job(kgate, body["running_job"])["kernel"] == kernel, body
    assert ws.collect(r).status == "ok"
    rec = agent_run(kgate, kernel, "print('agent')", a)
    assert rec["status"] == "ok" and rec["output"] == "agent\n", rec


def test_user_cell_waits_behind_agent_cell(kgate, kernel, ws_clients):
    a = agent_id("agent")
    ag = agent_run(kgate, kernel, "import time\ntime.sleep(1.5)\nprint('agent done')", a, wait=0)
    assert ag["status"] == "running", ag
    ws = kgate.connect(kernel)
    ws_clients.append(ws)
    r = ws.execute("print('user after')")
    assert r.status == "ok" and r.stdout == "user after\n", r
    agr = wait_job_end(kgate, ag["job"])
    assert agr["status"] == "ok" and agr["output"] == "agent done\n", agr
    u = wait_for_job(kgate, kernel, lambda j: "user after" in j["code"] and j["status"] != "running")
    assert job_num(u["job"]) > job_num(ag["job"]), (u, ag)
    urec = get_job(kgate, u["job"])
    assert urec["status"] == "ok" and urec["output"] == "user after\n" and urec["origin"] == "user", urec


# --------------------------------------------------------------------------
# 4. Stop names its job
# --------------------------------------------------------------------------

def test_stop_names_its_job(kgate, kernel):
    a = agent_id("agent")
    with AgentLink(kgate, a, "Agent"):
        done = agent_run(kgate, kernel, "print('finished')", a, label="Agent")
        assert done["status"] == "ok", done
        status, body = interrupt_job(kgate, done["job"], agent=a)
        assert_refusal(status, body, 409, "not_running")
        assert body["running_job"] is None, body

        r = agent_run(kgate, kernel, SLEEP30, a, label="Agent", wait=0)
        wait_began(kgate, r["job"])
        t0 = time.monotonic()
        status, body = interrupt_job(kgate, done["job"], agent=a)
        assert_refusal(status, body, 409, "not_running")
        assert body["running_job"] == r["job"], f"the refusal does not name the running job: {body!r}"
        still = get_job(kgate, r["job"], wait=1)
        assert still["status"] == "running", f"a stale stop stopped the running job: {still!r}"

        status, body = interrupt_job(kgate, r["job"], agent=a)
        assert status == 200 and body == {"interrupted": r["job"]}, (status, body)
        rec = wait_job_end(kgate, r["job"], 10)
        assert rec["status"] == "interrupted", rec
        assert time.monotonic() - t0 < 10, "the interrupt did not cut the sleep short"
        assert rec["error"] and rec["error"]["ename"] == "KeyboardInterrupt", rec

        after = agent_run(kgate, kernel, "print('after stop')", a, label="Agent")
        assert after["status"] == "ok" and after["output"] == "after stop\n", after

        # The stock interrupt endpoint is recorded the same way.
        r2 = agent_run(kgate, kernel, SLEEP30, a, label="Agent", wait=0)
        wait_began(kgate, r2["job"])
        status, _, _ = kgate.rest("POST", f"/api/kernels/{kernel}/interrupt")
        assert status == 204
        assert wait_job_end(kgate, r2["job"], 10)["status"] == "interrupted"


def test_stop_spares_child_processes(kgate, kernel):
    a = agent_id("agent")
    kernel_pid = kgate.kernel_pid(kernel)
    code = ("import subprocess, time\np = subprocess.Popen(['sleep', '60'])\n"
            "print('child', p.pid, flush=True)\ntime.sleep(30)")
    r = agent_run(kgate, kernel, code, a, wait=0)
    rec = wait_until(lambda: (lambda x: x if re.search(r"child (\d+)\n", x["output"]) else None)(
        get_job(kgate, r["job"])), 15)
    assert rec, f"the cell did not print its child's pid: {get_job(kgate, r['job'])!r}"
    child = int(re.search(r"child (\d+)\n", rec["output"]).group(1))
    try:
        assert pid_alive(child), f"child {child} not running"
        status, body = interrupt_job(kgate, r["job"], agent=a)
        assert status == 200 and body == {"interrupted": r["job"]}, (status, body)
        end = wait_job_end(kgate, r["job"], 10)
        assert end["status"] == "interrupted", end
        assert pid_alive(child), f"the stop killed the cell's child process {child}"
        assert pid_alive(kernel_pid) and kgate.kernel_pid(kernel) == kernel_pid, "the stop hit the kernel"
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass


def test_stop_foreign_job(kgate, kernel, ws_clients):
    a = agent_id("agent")
    with AgentLink(kgate, a, "Agent"):
        agent_run(kgate, kernel, "pass", a, label="Agent")  # a holds the claim
        ws = kgate.connect(kernel)
        ws_clients.append(ws)
        # stop_on_error=False: the KeyboardInterrupt must not make ipykernel abort the agent cell
        # sent right after it (its abort window is racy under load).
        r = ws.execute_async(SLEEP30, stop_on_error=False)
        u = wait_for_job(kgate, kernel, lambda j: j["code"] == SLEEP30 and j["status"] == "running" and j["began"],
                         what="the user's running cell")
        assert_refusal(*interrupt_job(kgate, u["job"], agent=a), 403, "foreign_job")
        assert get_job(kgate, u["job"])["status"] == "running"

        status, body = interrupt_job(kgate, u["job"])  # the person at the machine
        assert status == 200 and body == {"interrupted": u["job"]}, (status, body)
        rec = wait_job_end(kgate, u["job"], 10)
        assert rec["status"] == "interrupted", rec
        assert rec["note"], f"a stop by the person at the machine left no note: {rec!r}"
        assert ws.collect(r).status == "error"

        # The person may stop an agent's job too.
        j = agent_run(kgate, kernel, SLEEP30, a, label="Agent", wait=0)
        wait_began(kgate, j["job"])
        status, body = interrupt_job(kgate, j["job"])
        assert status == 200 and body == {"interrupted": j["job"]}, (status, body)
        assert wait_job_end(kgate, j["job"], 10)["status"] == "interrupted"


# --------------------------------------------------------------------------
# 5. Kernel death and restarts
# --------------------------------------------------------------------------

def test_kill_9_mid_cell_is_kernel_lost(kgate, kernel):
    a = agent_id("agent")
    first = agent_run(kgate, kernel, "import os; print(os.getpid())", a)
    pid = int(first["output"].strip())
    assert pid == kgate.kernel_pid(kernel), (pid, kgate.children())
    r = agent_run(kgate, kernel, SLEEP30, a, wait=0)
    wait_began(kgate, r["job"])
    os.kill(pid, signal.SIGKILL)
    rec = wait_job_end(kgate, r["job"], 15)
    assert rec["status"] == "kernel_lost", rec
    assert rec["note"] and rec["ended_at"], rec
    assert kgate_kernel(kgate, kernel)["running_job"] is None
    assert_refusal(*agent_execute(kgate, kernel, "print(1)", a), 409, "dead")
    old = get_job(kgate, first["job"])
    assert old["status"] == "ok" and old["output"] == first["output"], old


def test_restart_marks_ids_keep_counting_records_survive(kgate, kernel):
    a, b = agent_id("agent-a"), agent_id("agent-b")
    with AgentLink(kgate, a, "Agent A"):
        j1 = agent_run(kgate, kernel, "restart_marker = 1\nprint('before')", a, label="Agent A")
        status, _, model = kgate.rest("POST", f"/api/kernels/{kernel}/restart")
        assert status == 200 and model["id"] == kernel, (status, model)
        marks = list_jobs(kgate, kernel)["restarts"]
        assert len(marks) == 1 and marks[0]["kernel"] == kernel, marks
        assert mark_after(marks[0]) == job_num(j1["job"]), marks
        assert marks[0]["at"] and "reason" in marks[0], marks

        j2 = agent_run(kgate, kernel, "print('restart_marker' in globals())", a, label="Agent A")
        assert j2["status"] == "ok" and j2["output"] == "False\n", j2
        assert job_num(j2["job"]) == job_num(j1["job"]) + 1, (j1["job"], j2["job"])
        old = get_job(kgate, j1["job"])
        assert old["status"] == "ok" and old["output"] == "before\n", old

        # A restart without an agent (the observe page's) under a running job: kernel_lost,
        # a second mark, and the claim is cleared even though A is alive.
        r = agent_run(kgate, kernel, SLEEP30, a, label="Agent A", wait=0)
        wait_began(kgate, r["job"])
        status, _, model = kgate.rest("POST", f"/api/kgate/kernels/{kernel}/restart", {})
        assert status == 200 and model["id"] == kernel, (status, model)
        rec = wait_job_end(kgate, r["job"], 15)
        assert rec["status"] == "kernel_lost", rec
        body = list_jobs(kgate, kernel)
        assert [mark_after(m) for m in body["restarts"]] == [job_num(j1["job"]), job_num(r["job"])], body
        assert [j["job"] for j in body["jobs"]] == [j1["job"], j2["job"], r["job"]], body
        km = kgate_kernel(kgate, kernel)
        assert km["claim"] is None, f"a restart without agent did not clear the claim: {km!r}"
        restarts = km["restarts"]
        assert (len(restarts) if isinstance(restarts, list) else restarts) == 2, km

        j3 = agent_run(kgate, kernel, "print('b here')", b, label="Agent B")
        assert j3["status"] == "ok" and j3["output"] == "b here\n", j3
        assert job_num(j3["job"]) == job_num(r["job"]) + 1, (r["job"], j3["job"])
        assert kgate_kernel(kgate, kernel)["claim"]["agent"] == b


# --------------------------------------------------------------------------
# 6. Lifecycle details
# --------------------------------------------------------------------------

def test_error_interrupted_and_stream_order(kgate, kernel):
    a = agent_id("agent")
    e = agent_run(kgate, kernel, "1/0", a)
    assert e["status"] == "error", e
    assert e["error"]["ename"] == "ZeroDivisionError" and e["error"]["evalue"] == "division by zero", e
    assert e["error"]["traceback"] and "ZeroDivisionError" in "\n".join(e["error"]["traceback"]), e
    assert no_ansi(e["error"]["traceback"]), f"ANSI codes in the traceback: {e['error']!r}"

    k = agent_run(kgate, kernel, "raise KeyboardInterrupt", a)
    assert k["status"] == "interrupted", k

    t = time.monotonic()
    i = agent_run(kgate, kernel, "input('name? ')", a)  # allow_stdin is false: fails, never hangs
    assert i["status"] == "error" and i["error"]["ename"] == "StdinNotImplementedError", i
    assert time.monotonic() - t < 10

    # stop_on_error is false for agent cells: the next cell runs, and streams keep their order.
    s = agent_run(kgate, kernel, "import sys\nprint('out1', flush=True)\n"
                  "print('err1', file=sys.stderr, flush=True)\nprint('out2', flush=True)", a)
    assert s["status"] == "ok" and s["output"] == "out1\nerr1\nout2\n", s
    assert s["error"] is None, s


def test_empty_code_is_never_a_cell(kgate, kernel, ws_clients):
    a = agent_id("agent")
    status, _, body = kgate.rest("POST", f"/api/kgate/kernels/{kernel}/execute", {"code": "", "agent": a})
    assert status == 400, (status, body)
    ws = kgate.connect(kernel)
    ws_clients.append(ws)
    assert ws.execute("").status == "ok"
    ws.run("print('marker')")
    wait_for_job(kgate, kernel, lambda j: "marker" in j["code"] and j["status"] != "running")
    jobs = list_jobs(kgate, kernel)["jobs"]
    assert [j["code"] for j in jobs] == ["print('marker')"], jobs


def test_job_ids_count_across_kernels(kgate, kernel):
    a = agent_id("agent")
    k2 = kgate.start_kernel()["id"]
    try:
        j1 = agent_run(kgate, kernel, "1", a)
        j2 = agent_run(kgate, k2, "2", a)
        j3 = agent_run(kgate, kernel, "3", a)
        n1, n2, n3 = (job_num(j["job"]) for j in (j1, j2, j3))
        assert n1 < n2 < n3, (j1["job"], j2["job"], j3["job"])
        assert (j1["kernel"], j2["kernel"], j3["kernel"]) == (kernel, k2, kernel)
        assert [j["job"] for j in list_jobs(kgate, kernel)["jobs"]] == [j1["job"], j3["job"]]
        assert [j["job"] for j in list_jobs(kgate, kernel, after=n1)["jobs"]] == [j3["job"]]
        assert [j["job"] for j in list_jobs(kgate, k2)["jobs"]] == [j2["job"]]
        long_code = "x = 1  # " + "a" * 600
        lj = agent_run(kgate, k2, long_code, a)
        summary = [j for j in list_jobs(kgate, k2)["jobs"] if j["job"] == lj["job"]][0]
        assert summary["code"] == long_code[:240], f"summary code not cut to 240 chars: {len(summary['code'])}"
        assert "output" not in summary and "result" not in summary and "error" not in summary, summary
        assert get_job(kgate, lj["job"])["code"] == long_code
        h = agent_run(kgate, k2, "print('host')", a, origin="host")
        assert h["origin"] == "host" and h["agent"] == a and h["output"] == "host\n", h
        assert job_num(h["job"]) == job_num(lj["job"]) + 1 == n3 + 2, h
    finally:
        kgate.delete_kernel(k2, check=False)
    status, _, body = kgate.rest("GET", "/api/kgate/jobs/job-999999999")
    assert status == 404, (status, body)
    status, body = agent_execute(kgate, str(uuid.uuid4()), "1", a)
    assert status == 404, (status, body)


def test_wait_returns_early_or_partial(kgate, kernel):
    a = agent_id("agent")
    r = agent_run(kgate, kernel, "import time\ntime.sleep(3)\nprint('slept')", a, wait=0)
    assert r["status"] == "running", r
    t = time.monotonic()
    part = get_job(kgate, r["job"], wait=1)
    dt = time.monotonic() - t
    assert part["status"] == "running" and 0.8 <= dt < 2.5, (dt, part)
    assert part["ended_at"] in (None, ""), part
    t = time.monotonic()
    done = get_job(kgate, r["job"], wait=20)
    dt = time.monotonic() - t
    assert done["status"] == "ok" and done["output"] == "slept\n", done
    assert 2.9 <= done["elapsed"] < 6 and done["ended_at"], done
    assert dt < 5, f"?wait=20 answered {dt:.1f}s later, not when the job ended"

    t = time.monotonic()
    q = agent_run(kgate, kernel, "print('quick')", a, wait=20)
    assert q["status"] == "ok" and q["output"] == "quick\n", q
    assert time.monotonic() - t < 5

    # The list's long poll: answers after `wait` with nothing new, at once on a change.
    v = list_jobs(kgate, kernel)["version"]
    t = time.monotonic()
    same = list_jobs(kgate, kernel, version=v, wait=1)
    dt = time.monotonic() - t
    assert same["version"] == v and 0.8 <= dt < 2.5, (dt, same)
    got = {}

    def poll():
        t0 = time.monotonic()
        got["body"] = list_jobs(kgate, kernel, version=v, wait=20)
        got["dt"] = time.monotonic() - t0

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    c = agent_run(kgate, kernel, "print('change')", a, wait=0)
    th.join(25)
    assert "body" in got, "the long poll did not answer"
    assert got["dt"] < 5 and got["body"]["version"] != v, got
    assert c["job"] in [j["job"] for j in got["body"]["jobs"]], got


def test_output_cap_keeps_the_tail(kgate_factory, tmp_path):
    cap = 10000
    kg = kgate_factory(config=records_config(tmp_path, job_output_bytes=cap, job_code_bytes=2048))
    kid = kg.start_kernel()["id"]
    a = agent_id("agent")
    expected = "".join("%09d\n" % i for i in range(2500))  # 25,000 bytes
    rec = agent_run(kg, kid, "import sys\nfor i in range(2500):\n    sys.stdout.write('%09d\\n' % i)\n",
                    a, wait=30)
    assert rec["status"] == "ok", rec
    out, cut = rec["output"], rec["output_cut"]
    assert len(out) == cap, f"kept {len(out)} bytes, cap {cap}"
    assert out == expected[-len(out):], "the kept output is not the tail"
    assert cut == len(expected) - len(out) > 0, (cut, len(expected), len(out))

    # The same for a user's cell over the websocket.
    ws = kg.connect(kid)
    try:
        r = ws.execute("for i in range(2500):\n    print('%09d' % i)")
        assert r.status == "ok" and r.stdout == expected
    finally:
        ws.close()
    u = wait_for_job(kg, kid, lambda j: j["origin"] == "user" and j["status"] != "running")
    urec = get_job(kg, u["job"])
    assert urec["output"] == expected[-cap:] and urec["output_cut"] == len(expected) - cap, (
        len(urec["output"]), urec["output_cut"])
    # The result is capped the same way (the tail), the code at job_code_bytes (the head).
    res = agent_run(kg, kid, "'y' * 30000", a)
    full = repr("y" * 30000)
    assert res["result"] == full[-cap:] and res["result_cut"] == len(full) - cap, (
        len(res["result"]), res["result_cut"])
    code = "z = 0\n" + "".join("z += %d\n" % i for i in range(800))
    assert len(code) > 4096
    c = agent_run(kg, kid, code, a)
    assert c["status"] == "ok", c
    assert c["code"] == code[:2048] and c["code_cut"] == len(code) - 2048, (len(c["code"]), c["code_cut"])


# --------------------------------------------------------------------------
# 7. Notebook export
# --------------------------------------------------------------------------

def test_notebook_export(kgate, kernel):
    import nbformat

    a = agent_id("agent")
    with AgentLink(kgate, a, "Agent"):
        j_a = agent_run(kgate, kernel, "print('nb agent')\n6*7", a, label="Agent")
        kc = attach_client(kgate, kernel)
        try:
            content, out = kc_run(kc, "print('nb user')")
            assert content["status"] == "ok" and out == "nb user\n"
        finally:
            kc.stop_channels()
        u = wait_for_job(kgate, kernel, lambda j: "nb user" in j["code"] and j["status"] != "running")
        j_e = agent_run(kgate, kernel, "raise ValueError('nb boom')", a, label="Agent")
        status, _, _ = kgate.rest("POST", f"/api/kgate/kernels/{kernel}/restart", {})
        assert status == 200
        j_b = agent_run(kgate, kernel, "print('after restart')", a, label="Agent")

    status, _, raw = kgate.http("GET", f"/api/kgate/kernels/{kernel}/notebook")
    assert status == 200, raw[:500]
    nb = nbformat.reads(raw.decode("utf-8"), as_version=4)
    nbformat.validate(nb)
    assert nb.nbformat == 4

    def cell_of(job):
        hits = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
                and re.search(rf"\b{re.escape(job)}\b", c.source.split("\n", 1)[0])]
        assert len(hits) == 1, f"{job}: {len(hits)} code cells with it in the header: {nb.cells!r}"
        return hits[0]

    def texts(cell):
        out = []
        for o in cell.outputs:
            if o.output_type == "stream":
                out.append(o.text)
            elif o.output_type in ("execute_result", "display_data"):
                out.append(o.data.get("text/plain", ""))
            elif o.output_type == "error":
                out += [o.ename, o.evalue] + list(o.traceback)
        return "\n".join(out)

    expected = [(j_a["job"], "mcp", "ok"), (u["job"], "user", "ok"), (j_e["job"], "mcp", "error"),
                (j_b["job"], "mcp", "ok")]
    idx = [cell_of(job) for job, _, _ in expected]
    assert idx == sorted(idx), f"jobs out of order in the notebook: {list(zip(expected, idx))}"
    assert len([c for c in nb.cells if c.cell_type == "code"]) == 4, nb.cells
    for (job, origin, status), i in zip(expected, idx):
        header = nb.cells[i].source.split("\n", 1)[0]
        assert header.startswith("#"), header
        assert re.search(rf"\b{origin}\b", header) and re.search(rf"\b{status}\b", header), (job, header)
        assert re.search(r"\d(\.\d+)?\s*(ms|s|sec)\b", header), f"no duration in the header: {header!r}"
    cells = [nb.cells[i] for i in idx]
    assert "print('nb agent')" in cells[0].source
    assert "nb agent" in texts(cells[0]) and "42" in texts(cells[0]), cells[0]
    assert "nb user" in texts(cells[1]), cells[1]
    assert "nb boom" in texts(cells[2]), cells[2]
    assert "after restart" in texts(cells[3]), cells[3]
    between = nb.cells[idx[2] + 1:idx[3]]
    assert [c for c in between if c.cell_type == "markdown" and "restart" in c.source.lower()], (
        f"no restart note between {j_e['job']} and {j_b['job']}: {between!r}")
    early = [i for i, c in enumerate(nb.cells) if idx[0] < i < idx[2]
             and c.cell_type == "markdown" and "restart" in c.source.lower()]
    assert not early, f"a restart note before the restart: {[nb.cells[i] for i in early]!r}"


# --------------------------------------------------------------------------
# 8. A failing agent cell aborts nothing; eviction; the token; records switched off
# --------------------------------------------------------------------------

def test_failing_agent_cell_aborts_nothing_of_the_users(kgate, kernel, ws_clients):
    a = agent_id("agent")
    ag = agent_run(kgate, kernel, "import time\ntime.sleep(1)\n1/0", a, wait=0)
    ws = kgate.connect(kernel)
    ws_clients.append(ws)
    r = ws.execute("print('user queued')")  # queued in the kernel behind the agent's cell
    assert r.status == "ok" and r.stdout == "user queued\n", f"the agent's error aborted the user's cell: {r!r}"
    assert wait_job_end(kgate, ag["job"])["status"] == "error"
    u = wait_for_job(kgate, kernel, lambda j: "user queued" in j["code"] and j["status"] != "running")
    assert u["status"] == "ok", u


def test_eviction_spares_unseen_foreign_jobs(kgate_factory, tmp_path):
    kg = kgate_factory(config=records_config(tmp_path, max_jobs=3))
    kid = kg.start_kernel()["id"]
    a = agent_id("agent")
    ws = kg.connect(kid)
    try:
        ws.run("print('foreign')")
    finally:
        ws.close()
    u = wait_for_job(kg, kid, lambda j: j["origin"] == "user" and j["status"] != "running")
    agent_jobs = [agent_run(kg, kid, f"print({i})", a)["job"] for i in range(4)]
    jobs = [j["job"] for j in list_jobs(kg, kid)["jobs"]]
    assert jobs == [u["job"]] + agent_jobs[2:], f"evicted the wrong jobs: {jobs}"
    status, _, _ = kg.rest("GET", f"/api/kgate/jobs/{agent_jobs[0]}")
    assert status == 404, f"an evicted job is still served: {status}"
    d = digest(kg, kid, a)
    assert [j["job"] for j in d["jobs"]] == [u["job"]] and d["evicted_unseen"] == 0, d

    status, body = digest_ack(kg, kid, a, [u["job"]])
    assert status == 200 and body.get("kept", []) == [], body
    last = agent_run(kg, kid, "print('last')", a)["job"]
    jobs = [j["job"] for j in list_jobs(kg, kid)["jobs"]]
    assert jobs == agent_jobs[2:] + [last], f"a told-of foreign job is not evicted like the rest: {jobs}"


def test_extensions_take_the_token(kgate_factory):
    token = "records-" + uuid.uuid4().hex
    kg = kgate_factory(token=token)
    kid = kg.start_kernel()["id"]
    a = agent_id("agent")
    for method, path, body in (("GET", f"/api/kgate/jobs?kernel={kid}", None),
                               ("GET", f"/api/kgate/kernels/{kid}", None),
                               ("POST", f"/api/kgate/kernels/{kid}/execute", {"code": "1", "agent": a})):
        status, _, reply = kg.rest(method, path, body, auth=False)
        assert status == 401, f"{method} {path} without the token -> {status} {reply!r}"
    with pytest.raises(Exception) as info:
        AgentLink(type("NoToken", (), {"token": None, "ws_base": kg.ws_base})(), a, "Agent")
    assert "401" in str(info.value), str(info.value)
    with AgentLink(kg, a, "Agent"):
        rec = agent_run(kg, kid, "print('with token')", a, label="Agent")
        assert rec["output"] == "with token\n", rec
        assert kgate_kernel(kg, kid)["claim"]["alive"] is True
    assert not [j for j in list_jobs(kg, kid)["jobs"] if j["code"] == "1"], "an unauthenticated call ran"


def test_records_switched_off(kgate_factory, tmp_path):
    kg = kgate_factory(config=records_config(tmp_path, enabled=False))
    kid = kg.start_kernel()["id"]
    status, body = agent_execute(kg, kid, "print(1)", agent_id("agent"))
    assert status == 503, (status, body)
    ws = kg.connect(kid)
    try:
        assert ws.run("print('still a gateway')") == "still a gateway\n"
    finally:
        ws.close()
