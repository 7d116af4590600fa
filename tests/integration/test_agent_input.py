"""input() and getpass() in an agent's cell (README "Session records"): with allow_stdin the
record shows what the cell asks (input_request), the agent that ran it answers through
POST /api/kgate/jobs/{job}/input, and the wait returns as soon as the cell asks.  Without it,
input() raises StdinNotImplementedError, as before.  Real ipykernel, real sockets."""

import time

from records_util import wait_job_end


def execute(kg, kid, code, agent, **extra):
    body = {"code": code, "agent": agent, "wait": 20}
    body.update(extra)
    status, _, rec = kg.rest("POST", f"/api/kgate/kernels/{kid}/execute", body)
    assert status == 200, rec
    return rec


def answer(kg, job, value, agent):
    return kg.rest("POST", f"/api/kgate/jobs/{job}/input", {"value": value, "agent": agent})


def test_an_agent_answers_its_cells_input(kgate, kernel):
    kg = kgate
    t = time.monotonic()
    rec = execute(kg, kernel, "name = input('name? ')\nprint('hello', name)", "agent-in", allow_stdin=True)
    assert time.monotonic() - t < 10, "the wait did not return when the cell asked for input"
    assert rec["status"] == "running" and rec["input_request"] == {"prompt": "name? ", "password": False}, rec
    # Only the agent that ran it answers; the answer goes to the kernel, and the cell goes on.
    status, _, body = answer(kg, rec["job"], "mallory", "another-agent")
    assert status == 403 and body["refusal"] == "not_owner", body
    status, _, body = answer(kg, rec["job"], "ada", "agent-in")
    assert status == 200 and body == {"answered": rec["job"]}, body
    done = wait_job_end(kg, rec["job"])
    assert done["status"] == "ok" and done["output"] == "hello ada\n" and "input_request" not in done, done
    status, _, body = answer(kg, rec["job"], "again", "agent-in")
    assert status == 409 and body["refusal"] == "no_input_request", body

    # getpass is marked, so an agent can refuse it; an interrupt ends it.
    rec = execute(kg, kernel, "import getpass\npw = getpass.getpass('secret: ')", "agent-in", allow_stdin=True)
    assert rec["input_request"] == {"prompt": "secret: ", "password": True}, rec
    status, _, body = kg.rest("POST", f"/api/kgate/jobs/{rec['job']}/interrupt", {"agent": "agent-in"})
    assert status == 200, body
    done = wait_job_end(kg, rec["job"])
    assert done["status"] in ("interrupted", "error") and "input_request" not in done, done

    # Bad requests are named.
    status, _, body = kg.rest("POST", f"/api/kgate/jobs/{rec['job']}/input", {"agent": "agent-in"})
    assert status == 400 and "value" in body["message"], body
    status, _, body = kg.rest("POST", "/api/kgate/jobs/job-999999/input", {"value": "x", "agent": "agent-in"})
    assert status == 404, body
    status, _, body = kg.rest("POST", f"/api/kgate/kernels/{kernel}/execute",
                              {"code": "1", "agent": "agent-in", "allow_stdin": "yes"})
    assert status == 400 and "allow_stdin" in body["message"], body


def test_without_allow_stdin_input_raises(kgate, kernel):
    rec = execute(kgate, kernel, "input('no')", "agent-plain")
    assert rec["status"] == "error" and rec["error"]["ename"] == "StdinNotImplementedError", rec
