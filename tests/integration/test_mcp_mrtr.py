"""input() in the 2026-07-28 era (issue 43, point 3): the protocol has no server-to-client
requests, so kgate-mcp answers the tools/call that reaches input() with an InputRequiredResult
(multi round-trip requests, MRTR): one form elicitation and a signed requestState naming the
waiting cell. The client's retry with inputResponses answers the kernel's input_request, and the
same cell goes on: it is not run again. Spoken as Claude Code speaks it (`_meta` on every
request, elicitation {form, url} declared, no initialize)."""

import base64
import time

from conftest import wait_until
from test_mcp_transcript import Mcp, mcp_bin, modern_meta  # noqa: F401 (mcp_bin is a fixture)

def asks(tag):
    """A cell that asks for a name: its code is this test's own (the kgate fixture is shared)."""
    return f"# {tag}\nname = input('name? ')\nprint('hi', name)"


def meta(elicitation=True):
    m = modern_meta()
    m["io.modelcontextprotocol/clientCapabilities"] = (
        {"elicitation": {"form": {}, "url": {}}} if elicitation else {"roots": {}})
    return m


def call(p, id_, code, timeout=90, state=None, responses=None, elicitation=True, **args):
    params = {"name": "execute", "arguments": {"code": code, **args}, "_meta": meta(elicitation)}
    if state is not None:
        params["requestState"] = state
    if responses is not None:
        params["inputResponses"] = responses
    p.send({"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": params})
    return p.reply(id_, timeout=timeout)["result"]


def text(result):
    return "".join(b.get("text", "") for b in result["content"] if b["type"] == "text")


def jobs_with(kg, code):
    status, _, body = kg.rest("GET", "/api/kgate/jobs")
    assert status == 200, body
    return [j for j in body["jobs"] if j["code"] == code]


def asked(result):
    """(key, the elicitation request) of an input_required result."""
    assert result["resultType"] == "input_required", result
    assert result["requestState"], result
    ((key, req),) = result["inputRequests"].items()
    assert req["method"] == "elicitation/create" and req["params"]["mode"] == "form", req
    assert "name?" in req["params"]["message"], req
    assert req["params"]["requestedSchema"]["required"] == ["value"], req
    return key, req


def test_input_is_asked_by_a_retry_and_the_same_cell_goes_on(kgate, mcp_bin, tmp_path):  # noqa: F811
    ASKS = asks("retry")
    p = Mcp(mcp_bin, tmp_path / "mcp", {"KGATE_URL": kgate.url})
    try:
        first = call(p, 1, ASKS)
        key, _ = asked(first)
        # A retry without the answer is asked again, with a new key; the cell still waits.
        again = call(p, 2, ASKS, state=first["requestState"], responses={})
        key2, _ = asked(again)
        assert key2 != key
        done = call(p, 3, ASKS, state=again["requestState"],
                    responses={key2: {"action": "accept", "content": {"value": "Ada"}}})
        assert done["resultType"] == "complete" and not done["isError"], done
        assert text(done).endswith("hi Ada"), done
        (job,) = jobs_with(kgate, ASKS)  # run once, not once per retry
        assert job["status"] == "ok", job
        # The answered state cannot be used again: its cell has ended, so nothing waits.
        replay = call(p, 4, ASKS, state=again["requestState"],
                      responses={key2: {"action": "accept", "content": {"value": "Eve"}}})
        assert "Eve" not in text(replay) and len(jobs_with(kgate, ASKS)) == 1, replay
    finally:
        p.close()
        p.kill()


def test_a_declined_input_interrupts_the_cell_and_getpass_is_never_asked(kgate, mcp_bin, tmp_path):  # noqa: F811
    ASKS = asks("declined")
    p = Mcp(mcp_bin, tmp_path / "mcp", {"KGATE_URL": kgate.url})
    try:
        first = call(p, 1, ASKS)
        key, _ = asked(first)
        declined = call(p, 2, ASKS, state=first["requestState"], responses={key: {"action": "decline"}})
        assert declined["isError"] and "declined the cell's input() prompt" in text(declined), declined
        (job,) = jobs_with(kgate, ASKS)
        assert job["status"] == "interrupted", job
        secret = "import getpass\nsecret = getpass.getpass('password: ')"
        r = call(p, 3, secret)
        assert r["resultType"] == "complete" and r["isError"], r
        assert "getpass() was not answered" in text(r), r
        # Without elicitation declared, input() raises, and the reply says why.
        r = call(p, 4, "input('x? ')", elicitation=False)
        assert r["isError"] and "did not declare it" in text(r), r
    finally:
        p.close()
        p.kill()


def test_a_forged_or_altered_request_state_runs_nothing(kgate, mcp_bin, tmp_path):  # noqa: F811
    ASKS = asks("forged")
    p = Mcp(mcp_bin, tmp_path / "mcp", {"KGATE_URL": kgate.url})
    try:
        first = call(p, 1, ASKS)
        key, _ = asked(first)
        state = first["requestState"]
        body, sig = state.rsplit(".", 1)
        forged = base64.b64encode(base64.b64decode(body).replace(b'"job-', b'"job-9')).decode() + "." + sig
        for i, bad in enumerate([forged, "not a state", state[:-2] + "00"]):
            r = call(p, 10 + i, ASKS, state=bad, responses={key: {"action": "accept", "content": {"value": "x"}}})
            assert r["isError"] and "Invalid requestState" in text(r), r
        # The same state with other code: made for another call.
        r = call(p, 20, "print('other')", state=state, responses={key: {"action": "accept", "content": {"value": "x"}}})
        assert r["isError"] and "another call" in text(r), r
        assert len(jobs_with(kgate, ASKS)) == 1 and not jobs_with(kgate, "print('other')")
        # The real one still works.
        done = call(p, 30, ASKS, state=state, responses={key: {"action": "accept", "content": {"value": "Ada"}}})
        assert text(done).endswith("hi Ada"), done
    finally:
        p.close()
        p.kill()


def test_an_input_nobody_answers_is_interrupted_after_input_timeout(kgate):
    """kgate's side of a retry that never comes: execute's input_timeout."""
    ASKS = asks("timeout")
    status, _, rec = kgate.rest("POST", "/api/kernels", {"name": "python3"})
    assert status in (200, 201), rec
    kid = rec["id"]
    status, _, rec = kgate.rest("POST", f"/api/kgate/kernels/{kid}/execute",
                                {"code": ASKS, "agent": "agent-a", "allow_stdin": True, "input_timeout": 1,
                                 "wait": 30})
    assert status == 200, rec
    job = rec["job"]
    deadline = time.monotonic() + 30
    while rec["status"] == "running" and time.monotonic() < deadline:
        status, _, rec = kgate.rest("GET", f"/api/kgate/jobs/{job}?wait=5")
    assert rec["status"] == "interrupted", rec
    assert "input() had no answer within 1 second (input_timeout)" in rec["note"], rec
    for bad in (0, -1, "5", 10 ** 9):
        status, _, body = kgate.rest("POST", f"/api/kgate/kernels/{kid}/execute",
                                     {"code": "1", "agent": "agent-a", "input_timeout": bad})
        assert status == 400 and "input_timeout" in body["message"], (bad, status, body)
    assert wait_until(lambda: kgate.kernel_model(kid)["execution_state"] == "idle", 10)


def test_the_same_over_stateless_http(kgate_factory):
    """kgate's /mcp in the stateless era: each request has its own translator, so the retry is
    resumed from its requestState alone (the job, its kernel, the agent that ran it)."""
    from test_mcp_http import TOKEN, post
    kg = kgate_factory(token=TOKEN)
    ASKS = asks("http")

    def tool(rid, args, **extra):
        params = {"name": "execute", "arguments": args, "_meta": meta(), **extra}
        status, _, body = post(kg, {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params},
                               headers={"MCP-Protocol-Version": "2026-07-28"})
        assert status == 200, (status, body)
        return body["result"]

    status, _, rec = kg.rest("POST", "/api/kernels", {"name": "python3"})
    kid = rec["id"]
    first = tool(1, {"code": ASKS, "kernel": kid})
    key, _ = asked(first)
    time.sleep(1.5)  # the first request's agent is gone by now: the cell still waits
    done = tool(2, {"code": ASKS, "kernel": kid}, requestState=first["requestState"],
                inputResponses={key: {"action": "accept", "content": {"value": "Ada"}}})
    assert done["resultType"] == "complete" and text(done).endswith("hi Ada"), done
    (job,) = jobs_with(kg, ASKS)
    assert job["status"] == "ok", job
    kg.rest("DELETE", f"/api/kernels/{kid}")
