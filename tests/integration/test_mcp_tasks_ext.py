"""The 2026-07-28 tasks extension, io.modelcontextprotocol/tasks (issue 43, point 2), as
interactive Claude Code declares it (in `_meta` clientCapabilities, on every request). The server
decides: an `execute` that ends within 5 s is answered as usual; a longer one, or one whose cell
asks for input(), is answered with its task (`resultType: "task"`), which the client follows with
tasks/get, answers with tasks/update and stops with tasks/cancel."""

import time

from conftest import wait_until
from test_mcp_transcript import Mcp, mcp_bin, modern_meta  # noqa: F401 (mcp_bin is a fixture)

TASKS = "io.modelcontextprotocol/tasks"


def meta(tasks=True):
    m = modern_meta()
    caps = {"roots": {}, "elicitation": {"form": {}, "url": {}}}
    if tasks:
        caps["extensions"] = {TASKS: {}}
    m["io.modelcontextprotocol/clientCapabilities"] = caps
    return m


def execute(p, id_, code, **args):
    p.send({"jsonrpc": "2.0", "id": id_, "method": "tools/call",
            "params": {"name": "execute", "arguments": {"code": code, **args}, "_meta": meta()}})
    return p.reply(id_, timeout=90)


def tasks(p, id_, method, tasks_declared=True, **params):
    return p.request(id_, method, {**params, "_meta": meta(tasks_declared)})


def text(result):
    return "".join(b.get("text", "") for b in result["content"] if b["type"] == "text")


def follow(p, first_id, task_id, until, timeout=60):
    """tasks/get until `until(task)`; returns that task."""
    deadline = time.monotonic() + timeout
    n = first_id
    while time.monotonic() < deadline:
        got = tasks(p, n, "tasks/get", taskId=task_id)["result"]
        assert got["resultType"] == "complete" and got["taskId"] == task_id, got
        if until(got):
            return got
        n += 1
        time.sleep(got["pollIntervalMs"] / 1000)
    raise AssertionError(f"task {task_id} never got there: {got}")


def jobs_with(kg, code):
    status, _, body = kg.rest("GET", "/api/kgate/jobs")
    assert status == 200, body
    return [j for j in body["jobs"] if j["code"] == code]


def test_a_long_execute_becomes_a_task_and_a_short_one_does_not(kgate, mcp_bin, tmp_path):  # noqa: F811
    p = Mcp(mcp_bin, tmp_path / "mcp", {"KGATE_URL": kgate.url})
    try:
        d = p.request(1, "server/discover", {"_meta": meta()})["result"]
        assert d["capabilities"]["extensions"] == {TASKS: {}}, d
        quick = execute(p, 2, "1 + 1")["result"]
        assert quick["resultType"] == "complete" and text(quick).strip().endswith("2"), quick
        code = "import time\nfor i in range(8):\n    time.sleep(1)\nprint('slept')"
        started = time.monotonic()
        created = execute(p, 3, code)["result"]
        took = time.monotonic() - started
        assert created["resultType"] == "task" and created["status"] == "working", created
        assert 4 <= took < 8, took
        assert created["ttlMs"] > 0 and created["pollIntervalMs"] > 0 and created["createdAt"], created
        done = follow(p, 10, created["taskId"], lambda t: t["status"] != "working")
        assert done["status"] == "completed", done
        assert done["result"]["isError"] is False and text(done["result"]).startswith("slept"), done
        (job,) = jobs_with(kgate, code)
        assert job["status"] == "ok", job
        # No progress once it is a task (the extension has none for tasks).
        progress_after = [m for m in p.messages[p.messages.index(next(
            m for m in p.messages if m.get("id") == 3 and "result" in m)):]
            if m.get("method") == "notifications/progress"]
        assert not progress_after, progress_after
        # Errors: an unknown task, and a request that does not declare the extension.
        bad = tasks(p, 100, "tasks/get", taskId="no-such-task")
        assert bad["error"]["code"] == -32602, bad
        bad = tasks(p, 101, "tasks/get", tasks_declared=False, taskId=created["taskId"])
        assert bad["error"]["code"] == -32021 and TASKS in str(bad["error"]["data"]), bad
        bad = tasks(p, 102, "tasks/update", taskId=created["taskId"])
        assert bad["error"]["code"] == -32602 and "inputResponses" in bad["error"]["message"], bad
    finally:
        p.close()
        p.kill()


def test_tasks_cancel_interrupts_the_cell(kgate, mcp_bin, tmp_path):  # noqa: F811
    p = Mcp(mcp_bin, tmp_path / "mcp", {"KGATE_URL": kgate.url})
    try:
        code = "import time\ntime.sleep(120)"
        created = execute(p, 1, code)["result"]
        assert created["resultType"] == "task", created
        ack = tasks(p, 2, "tasks/cancel", taskId=created["taskId"])["result"]
        assert ack == {"resultType": "complete", "_meta": ack["_meta"]}, ack
        got = follow(p, 3, created["taskId"], lambda t: t["status"] != "working", timeout=5)
        assert got["status"] == "cancelled" and "result" not in got, got
        assert wait_until(lambda: jobs_with(kgate, code)[0]["status"] == "interrupted", 15), jobs_with(kgate, code)
        # The kernel is free again.
        again = execute(p, 20, "print('free')")["result"]
        assert text(again).startswith("free"), again
    finally:
        p.close()
        p.kill()


def test_input_in_a_task_is_asked_through_the_task(kgate, mcp_bin, tmp_path):  # noqa: F811
    p = Mcp(mcp_bin, tmp_path / "mcp", {"KGATE_URL": kgate.url})
    try:
        code = "name = input('name? ')\nprint('hi', name)"
        started = time.monotonic()
        created = execute(p, 1, code)["result"]
        assert created["resultType"] == "task", created
        assert time.monotonic() - started < 4.5, "asking makes it a task at once"
        asking = follow(p, 2, created["taskId"], lambda t: t["status"] == "input_required", timeout=15)
        ((key, req),) = asking["inputRequests"].items()
        assert req["method"] == "elicitation/create" and "name?" in req["params"]["message"], req
        # An answer to an unknown key is ignored; the right one goes to the cell.
        ack = tasks(p, 30, "tasks/update", taskId=created["taskId"],
                    inputResponses={"nope": {"action": "accept", "content": {"value": "Eve"}},
                                    key: {"action": "accept", "content": {"value": "Ada"}}})
        assert ack["result"]["resultType"] == "complete", ack
        done = follow(p, 31, created["taskId"], lambda t: t["status"] == "completed", timeout=30)
        assert text(done["result"]).endswith("hi Ada"), done
        (job,) = jobs_with(kgate, code)
        assert job["status"] == "ok", job
    finally:
        p.close()
        p.kill()


def test_the_extension_over_stateless_http(kgate_factory):
    """kgate's /mcp in the stateless era: a call that becomes a task keeps its session, which the
    tasks/get, tasks/update and tasks/cancel naming the task reach; the cell is not cut when the
    request that made the task is answered."""
    from test_mcp_http import TOKEN, post
    kg = kgate_factory(token=TOKEN)
    kid = kg.start_kernel()["id"]

    def rpc(rid, method, params):
        status, _, body = post(kg, {"jsonrpc": "2.0", "id": rid, "method": method,
                                    "params": {**params, "_meta": meta()}},
                               headers={"MCP-Protocol-Version": "2026-07-28"})
        assert status == 200, (status, body)
        return body

    code = "import time\nfor i in range(7):\n    time.sleep(1)\nprint('over http')"
    created = rpc(1, "tools/call", {"name": "execute", "arguments": {"code": code, "kernel": kid}})["result"]
    assert created["resultType"] == "task", created
    tid = created["taskId"]
    deadline = time.monotonic() + 60
    while True:
        got = rpc(2, "tasks/get", {"taskId": tid})["result"]
        if got["status"] != "working" or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert got["status"] == "completed" and text(got["result"]).endswith("over http"), got
    # A cancel over HTTP reaches its cell too.
    created = rpc(3, "tools/call", {"name": "execute", "arguments": {"code": "import time\ntime.sleep(60)",
                                                                       "kernel": kid}})["result"]
    assert rpc(4, "tasks/cancel", {"taskId": created["taskId"]})["result"]["resultType"] == "complete"
    assert wait_until(lambda: jobs_with(kg, "import time\ntime.sleep(60)")[0]["status"] == "interrupted", 15)
    assert rpc(5, "tasks/get", {"taskId": "no-such-task"})["error"]["code"] == -32602
    kg.rest("DELETE", f"/api/kernels/{kid}")
