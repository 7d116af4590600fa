"""The sessions API (/api/sessions, docs/api.md "Sessions"), in jupyter_server's shapes and status
codes, against a real kgate and real ipykernels.  @jupyterlab/services drives it too, in
tests/e2e/e2e.mjs (notebook_session, notebook_lifecycle; test_mcp_e2e.py runs them)."""

import json
import os
import re

from conftest import Kgate, wait_until

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def sessions(kg):
    status, _, body = kg.rest("GET", "/api/sessions")
    assert status == 200, body
    return body


def kernel_ids(kg):
    status, _, body = kg.rest("GET", "/api/kernels")
    assert status == 200, body
    return {k["id"] for k in body}


def create(kg, body, expect=201):
    status, headers, reply = kg.rest("POST", "/api/sessions", body)
    assert status == expect, (status, reply, kg.log_tail(20))
    return reply, headers


def test_create_list_get_delete(kgate_factory):
    kg = kgate_factory()
    (kg.root / "work").mkdir()
    s, headers = create(kg, {"path": "work/a.ipynb", "name": "a.ipynb", "type": "notebook",
                             "kernel": {"name": "python3"}})
    assert UUID.match(s["id"]), s
    assert (s["path"], s["name"], s["type"]) == ("work/a.ipynb", "a.ipynb", "notebook"), s
    assert s["notebook"] == {"path": "work/a.ipynb", "name": "a.ipynb"}, s  # the older clients' shape
    assert s["kernel"]["name"] == "python3" and s["kernel"]["execution_state"] in ("idle", "starting"), s
    assert headers["Location"] == f"/api/sessions/{s['id']}", headers
    kid = s["kernel"]["id"]
    # The kernel runs in the notebook's directory, with JPY_SESSION_NAME as jupyter_server sets it.
    with kg.connect(kid) as ws:
        out = ws.run("import os\nprint(os.getcwd())\nprint(os.environ.get('JPY_SESSION_NAME'))")
    assert out.splitlines() == [str(kg.root / "work"), "work/a.ipynb"], out

    assert [x["id"] for x in sessions(kg)] == [s["id"]]
    status, _, one = kg.rest("GET", f"/api/sessions/{s['id']}")
    assert status == 200 and one["kernel"]["id"] == kid, one
    # One session per path: a second POST gets the first.
    again, _ = create(kg, {"path": "work/a.ipynb", "type": "notebook", "kernel": {"name": "python3"}})
    assert again["id"] == s["id"] and again["kernel"]["id"] == kid, again
    assert kernel_ids(kg) >= {kid}

    status, _, body = kg.rest("DELETE", f"/api/sessions/{s['id']}")
    assert status == 204, body
    assert sessions(kg) == []
    assert kid not in kernel_ids(kg), "the kernel the session started outlived it"
    status, _, body = kg.rest("GET", f"/api/sessions/{s['id']}")
    assert status == 404 and s["id"] in body["message"], body
    status, _, body = kg.rest("DELETE", f"/api/sessions/{s['id']}")
    assert status == 404, body


def test_bad_requests_are_named(kgate):
    kg = kgate
    cases = [
        (None, 400, "No JSON data provided"),
        ("[1]", 400, "must be a JSON object"),
        ({"type": "notebook"}, 400, "Missing field in JSON data: path"),
        ({"path": "x.ipynb"}, 400, "Missing field in JSON data: type"),
        ({"path": 3, "type": "notebook"}, 400, '"path" must be a string'),
        ({"path": "x", "type": "notebook", "kernel": "python3"}, 400, '"kernel" must be an object'),
        ({"path": "x", "type": "notebook", "kernel": {"name": 7}}, 400, '"kernel.name" must be a string'),
        ({"path": "x", "type": "notebook", "kernel": {"id": "0000"}}, 400, "No such kernel: 0000"),
    ]
    for body, code, text in cases:
        status, _, reply = kg.rest("POST", "/api/sessions", body)
        assert status == code and text in reply["message"], (body, status, reply)
    # No such kernelspec: jupyter_server's 501 with its short message.
    status, _, reply = kg.rest("POST", "/api/sessions", {"path": "x", "type": "console", "kernel": {"name": "nope"}})
    assert status == 501, reply
    assert reply["short_message"] == "nope not found" and "'nope' kernel is not available" in reply["message"], reply
    # Methods the routes do not take, and unknown ids.
    status, headers, _ = kg.rest("PUT", "/api/sessions")
    assert status == 405 and headers["Allow"] == "GET, POST", headers
    status, headers, _ = kg.rest("POST", "/api/sessions/00000000-0000-0000-0000-000000000000")
    assert status == 405 and headers["Allow"] == "GET, PATCH, DELETE", headers
    status, _, reply = kg.rest("PATCH", "/api/sessions/00000000-0000-0000-0000-000000000000", {"path": "y"})
    assert status == 404 and "Session not found" in reply["message"], reply
    assert sessions(kg) == [], "a refused POST left a session"


def test_the_old_notebook_shape_and_a_default_kernel(kgate):
    kg = kgate
    s, _ = create(kg, {"notebook": {"path": "old.ipynb"}})
    try:
        assert s["type"] == "notebook" and s["path"] == "old.ipynb", s
        assert s["kernel"]["name"] == "python3", s  # the default kernelspec
    finally:
        kg.rest("DELETE", f"/api/sessions/{s['id']}")


def test_a_session_on_a_running_kernel_never_stops_it(kgate):
    """An agent's kernel a notebook is opened on: deleting the session, or moving it to another
    kernel, leaves that kernel running (jupyter_server would shut it down)."""
    kg = kgate
    agent = kg.start_kernel()["id"]
    s, _ = create(kg, {"path": "on-agent.ipynb", "type": "notebook", "kernel": {"id": agent}})
    assert s["kernel"]["id"] == agent, s
    shared, _ = create(kg, {"path": "second.ipynb", "type": "notebook", "kernel": {"id": agent}})
    assert shared["id"] != s["id"] and shared["kernel"]["id"] == agent
    # Moved to a new kernel by name: the agent's kernel stays.
    status, _, moved = kg.rest("PATCH", f"/api/sessions/{s['id']}", {"kernel": {"name": "python3"}})
    assert status == 200 and moved["kernel"]["id"] != agent, moved
    assert agent in kernel_ids(kg)
    new_kernel = moved["kernel"]["id"]
    # Moved back by id: the kernel the session had started is shut down (no other session uses it).
    status, _, back = kg.rest("PATCH", f"/api/sessions/{s['id']}", {"kernel": {"id": agent}, "path": "renamed.ipynb"})
    assert status == 200 and back["kernel"]["id"] == agent and back["path"] == "renamed.ipynb", back
    assert wait_until(lambda: new_kernel not in kernel_ids(kg), 10), kernel_ids(kg)
    status, _, body = kg.rest("PATCH", f"/api/sessions/{s['id']}", {"kernel": {"id": "nope"}})
    assert status == 400 and "No such kernel: nope" in body["message"], body
    for x in (s, shared):
        status, _, body = kg.rest("DELETE", f"/api/sessions/{x['id']}")
        assert status == 204, body
    assert agent in kernel_ids(kg), "deleting the sessions stopped the kernel they were opened on"
    kg.rest("DELETE", f"/api/kernels/{agent}")


def test_a_session_ends_with_its_kernel(kgate):
    kg = kgate
    s, _ = create(kg, {"path": "gone.ipynb", "type": "notebook"})
    status, _, _ = kg.rest("DELETE", f"/api/kernels/{s['kernel']['id']}")
    assert status == 204
    assert sessions(kg) == []
    status, _, _ = kg.rest("GET", f"/api/sessions/{s['id']}")
    assert status == 404
    assert wait_until(lambda: any("its kernel" in line and s["id"] in line for line in kg.log_lines), 5), \
        kg.log_tail(10)


def test_sessions_outlive_kgate_with_their_kernels(kgate_factory, kgate_bin):
    """SIGTERM: kernels stay for the next kgate (docs/dev/readoption.md), and their sessions come back with
    them; a session whose kernel did not outlive kgate is gone."""
    kg = kgate_factory()
    kept, _ = create(kg, {"path": "kept.ipynb", "name": "kept", "type": "notebook"})
    lost, _ = create(kg, {"path": "lost.ipynb", "type": "console"})
    # Written on the store's writer thread, a moment after the answer.
    def stored_ids():
        try:
            return {x["id"] for x in json.loads((kg.root / "state" / "kgate" / "sessions.json").read_text())["sessions"]}
        except (OSError, ValueError):
            return set()
    assert wait_until(lambda: stored_ids() == {kept["id"], lost["id"]}, 5), stored_ids()
    assert oct(os.stat(kg.root / "state" / "kgate" / "sessions.json").st_mode & 0o777) == "0o600"
    # The lost session's kernel ends, and kgate stops before anyone reads the sessions again:
    # the file still names it, and the next kgate drops it.
    status, _, _ = kg.rest("DELETE", f"/api/kernels/{lost['kernel']['id']}")
    assert status == 204
    kg.stop(sweep=False)

    kg2 = Kgate(kgate_bin, kg.root).start()
    try:
        listed = sessions(kg2)
        assert [(x["id"], x["path"], x["name"], x["kernel"]["id"]) for x in listed] == \
            [(kept["id"], "kept.ipynb", "kept", kept["kernel"]["id"])], (listed, kg2.log_tail(30))
        status, _, body = kg2.rest("DELETE", f"/api/sessions/{kept['id']}")
        assert status == 204, body
        assert kept["kernel"]["id"] not in kernel_ids(kg2), "the re-adopted session did not stop its kernel"
        assert any("1 session ended with kernels that did not outlive" in line for line in kg2.log_lines), \
            kg2.log_tail(30)
    finally:
        kg2.stop()
