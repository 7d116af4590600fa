"""kgate's own /mcp (README "MCP over HTTP"): the Streamable HTTP transport's status codes and
headers, sessions, and what a session's end does.  The tools themselves are driven through the
official SDK client in test_mcp_e2e.py (test_mcp_http_e2e)."""

import json

from conftest import wait_until

TOKEN = "kgate-mcp-http-token-7d21"
JSON = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def post(kg, body, session=None, headers=None, auth=True):
    h = dict(JSON)
    if session:
        h["Mcp-Session-Id"] = session
    h.update(headers or {})
    raw = body if isinstance(body, (str, bytes)) else json.dumps(body)
    status, hdrs, data = kg.http("POST", "/mcp", raw, h, auth=auth)
    return status, hdrs, (json.loads(data) if data else None)


def initialize(kg, name="pytest"):
    status, hdrs, body = post(kg, {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                   "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                              "clientInfo": {"name": name, "version": "1"}}})
    assert status == 200, body
    assert body["result"]["protocolVersion"] == "2025-11-25", body
    sid = hdrs["Mcp-Session-Id"]
    assert len(sid) >= 32 and sid.isalnum(), sid
    return sid


def call(kg, sid, tool, arguments=None, rid=7):
    status, _, body = post(kg, {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                                "params": {"name": tool, "arguments": arguments or {}}}, sid)
    assert status == 200, body
    assert body["id"] == rid, body
    return "\n".join(b["text"] for b in body["result"]["content"] if b["type"] == "text"), body["result"]


def test_transport_status_codes(kgate_factory):
    kg = kgate_factory(token=TOKEN)
    # Behind the token, like every route.
    status, _, _ = post(kg, {"jsonrpc": "2.0", "id": 1, "method": "ping"}, auth=False)
    assert status == 401
    # No session yet: only initialize opens one.
    status, _, body = post(kg, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert status == 400 and "Mcp-Session-Id" in body["error"]["message"], body
    status, _, body = post(kg, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, session="0" * 32)
    assert status == 404 and body["error"]["code"] == -32001, body
    status, _, body = post(kg, "{not json")
    assert status == 400 and body["error"]["code"] == -32700, body
    status, _, body = post(kg, [{"jsonrpc": "2.0", "id": 1, "method": "ping"}])
    assert status == 400 and body["error"]["code"] == -32600, body
    status, _, body = post(kg, {"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers={"Content-Type": "text/plain"})
    assert status == 415, body
    status, _, body = post(kg, {"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers={"Accept": "text/html"})
    assert status == 406, body
    status, _, body = post(kg, {"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers={"MCP-Protocol-Version": "1999-01-01"})
    assert status == 400 and "1999-01-01" in body["error"]["message"], body
    status, headers, _ = kg.http("GET", "/mcp", headers={"Accept": "text/event-stream"})
    assert status == 405 and headers["Allow"] == "POST, DELETE", headers

    sid = initialize(kg)
    status, _, body = post(kg, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
    assert status == 202 and body is None, body
    status, _, body = post(kg, {"jsonrpc": "2.0", "id": "a", "method": "tools/list"}, sid)
    assert status == 200 and [t["name"] for t in body["result"]["tools"]][:2] == ["connect", "execute"], body
    status, _, body = post(kg, {"jsonrpc": "2.0", "id": 2, "method": "nope"}, sid)
    assert status == 200 and body["error"]["code"] == -32601, body
    # initialize again opens another session, never re-initializes this one.
    status, _, body = post(kg, {"jsonrpc": "2.0", "id": 3, "method": "initialize", "params": {}}, sid)
    assert status == 400, body

    # A host other than this kgate is refused: the client holds this kgate's token only.
    text, result = call(kg, sid, "list_kernels", {"host": "http://example.invalid:1"})
    assert result["isError"] and "this kgate's kernels only" in text, text

    status, _, _ = kg.http("DELETE", "/mcp", headers={"Mcp-Session-Id": sid})
    assert status == 200
    status, _, body = post(kg, {"jsonrpc": "2.0", "id": 4, "method": "tools/list"}, sid)
    assert status == 404, body
    status, _, _ = kg.http("DELETE", "/mcp", headers={"Mcp-Session-Id": sid})
    assert status == 404


def test_each_session_has_its_own_kernel_and_its_end_frees_it(kgate_factory):
    kg = kgate_factory(token=TOKEN)
    a, b = initialize(kg, "agent-a"), initialize(kg, "agent-b")
    call(kg, a, "execute", {"code": "x = 'a'"})
    call(kg, b, "execute", {"code": "x = 'b'"})
    ta, _ = call(kg, a, "execute", {"code": "x"})
    tb, _ = call(kg, b, "execute", {"code": "x"})
    assert ta.strip().endswith("'a'") and tb.strip().endswith("'b'"), (ta, tb)
    status, _, kernels = kg.rest("GET", "/api/kgate/kernels")
    assert status == 200 and len(kernels) == 2, kernels
    labels = sorted(k["claim"]["label"] for k in kernels)
    assert labels[0].startswith("agent-a (kgate /mcp session ") and labels[1].startswith("agent-b ("), labels

    # Ending a session stops its auto kernel and frees its claim; the other goes on.
    status, _, _ = kg.http("DELETE", "/mcp", headers={"Mcp-Session-Id": a})
    assert status == 200
    assert wait_until(lambda: len(kg.rest("GET", "/api/kernels")[2]) == 1, 15), kg.rest("GET", "/api/kernels")
    tb, _ = call(kg, b, "execute", {"code": "x"})
    assert tb.strip().endswith("'b'"), tb
    assert any("mcp: session" in line and "ended: the client deleted it" in line for line in kg.log_lines), kg.log_tail(20)
    kg.http("DELETE", "/mcp", headers={"Mcp-Session-Id": b})


def test_origin_and_host_are_checked(kgate_factory):
    kg = kgate_factory(token=TOKEN)
    status, _, _ = post(kg, {"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers={"Origin": "http://evil.example"})
    assert status == 403
    status, _, _ = post(kg, {"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers={"Host": "evil.example"})
    assert status == 403


def test_concurrent_sessions_never_cross_replies(kgate_factory):
    """Sessions at once, each on its own kernel, each cell's reply checked against the value only
    that session's kernel holds: no reply lost, none answered to the wrong session or request."""
    import threading

    kg = kgate_factory(token=TOKEN)
    sessions, cells = 8, 12
    sids = [initialize(kg, f"agent-{i}") for i in range(sessions)]
    errors = []

    def work(i, sid):
        try:
            text, result = call(kg, sid, "execute", {"code": f"mine = {i}"}, rid=1)
            assert not result["isError"], text
            for n in range(cells):
                rid = 100 + n
                text, result = call(kg, sid, "execute", {"code": f"print(mine, {n})"}, rid=rid)
                assert not result["isError"] and text.strip().endswith(f"{i} {n}"), (i, n, text)
        except Exception as e:  # noqa: BLE001 (reported below, with the session)
            errors.append(f"session {i}: {e!r}")

    threads = [threading.Thread(target=work, args=(i, sid)) for i, sid in enumerate(sids)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, "\n".join(errors)
    status, _, kernels = kg.rest("GET", "/api/kernels")
    assert len(kernels) == sessions, kernels
    for sid in sids:
        kg.http("DELETE", "/mcp", headers={"Mcp-Session-Id": sid})
    assert wait_until(lambda: kg.rest("GET", "/api/kernels")[2] == [], 60), kg.rest("GET", "/api/kernels")


def test_stateless_2026_07_28_requests_need_no_session(kgate_factory):
    """The 2026-07-28 era over HTTP: no initialize and no Mcp-Session-Id; each request stands
    alone, so the kernel is named in every call."""
    kg = kgate_factory(token=TOKEN)
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "modern", "version": "1"}}

    def modern(rid, method, params=None):
        p = dict(params or {})
        p["_meta"] = meta
        status, hdrs, body = post(kg, {"jsonrpc": "2.0", "id": rid, "method": method, "params": p},
                                  headers={"MCP-Protocol-Version": "2026-07-28"})
        assert status == 200 and "Mcp-Session-Id" not in hdrs, (status, body)
        return body

    d = modern(1, "server/discover")
    assert "2026-07-28" in d["result"]["supportedVersions"] and d["result"]["resultType"] == "complete", d
    tools = modern(2, "tools/list")["result"]
    assert tools["resultType"] == "complete" and "ttlMs" in tools and tools["tools"][1]["name"] == "execute", tools

    def tool(rid, name, args):
        r = modern(rid, "tools/call", {"name": name, "arguments": args})["result"]
        return "\n".join(b["text"] for b in r["content"] if b["type"] == "text"), r

    # An execute without a kernel makes one, names it for the calls that follow, and leaves it to
    # kgate's culler (the conversation's end is never seen); its output is tagged as on stdio.
    text, r = tool(3, "execute", {"code": "print('made')\n1+1"})
    assert not r["isError"] and "pass kernel='" in text and "stopped after 30 min idle" in text, text
    assert "<stdout>\nmade\n</stdout>" in text and "2" in text, text
    made = text.split("pass kernel='")[1].split("'")[0]
    assert kg.rest("GET", f"/api/kernels/{made}")[0] == 200, "the request's end stopped its kernel"
    text, r = tool(4, "connect", {})
    assert not r["isError"], text
    kid = text.split("created kernel ")[1].split()[0]
    text, r = tool(5, "execute", {"code": "y = 40 + 2", "kernel": kid})
    assert not r["isError"], text
    text, r = tool(6, "execute", {"code": "y", "kernel": kid})
    assert text.strip().endswith("42"), text
    # The kernel outlives the requests (connect's kernels are never stopped implicitly), and no
    # claim is left: each request's agent ends with it.
    status, _, info = kg.rest("GET", f"/api/kgate/kernels/{kid}")
    assert status == 200, info
    assert wait_until(lambda: not (kg.rest("GET", f"/api/kgate/kernels/{kid}")[2].get("claim") or {}).get("alive"), 15), \
        kg.rest("GET", f"/api/kgate/kernels/{kid}")[2]
    kg.rest("DELETE", f"/api/kernels/{kid}")


def sse_events(data):
    """The JSON-RPC messages of an event stream's body, in order."""
    events = []
    for block in data.decode("utf-8").split("\n\n"):
        lines = [line for line in block.split("\n") if line]
        if not lines:
            continue
        assert any(line == "event: message" for line in lines), block
        events.append(json.loads("".join(line[len("data: "):] for line in lines if line.startswith("data: "))))
    return events


def test_progress_and_questions_come_on_an_event_stream(kgate_factory):
    """A tools/call whose POST accepts text/event-stream gets its progress on an event stream,
    ended by its reply, and the connection then serves the next request. A call with nothing to
    send before its reply, or whose POST accepts JSON only, is answered with plain JSON."""
    kg = kgate_factory(token=TOKEN)
    sid = initialize(kg)
    text, _ = call(kg, sid, "execute", {"code": "import time; time.sleep(30)", "timeout": 1})
    job = [w for w in text.replace(":", " ").replace(",", " ").split() if w.startswith("job-")][0]

    conn = kg._connection(60)
    try:
        def send(rid, args, accept, token=None):
            params = {"name": "poll_job", "arguments": args}
            if token is not None:
                params["_meta"] = {"progressToken": token}
            conn.request("POST", "/mcp", body=json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                                                          "params": params}),
                         headers={"Content-Type": "application/json", "Accept": accept, "Mcp-Session-Id": sid,
                                  "Authorization": f"Bearer {TOKEN}"})
            resp = conn.getresponse()
            return resp.status, resp.headers, resp.read()

        status, hdrs, data = send(11, {"job": job, "wait": 2.5}, JSON["Accept"], token="p-1")
        assert status == 200 and hdrs["Content-Type"] == "text/event-stream", (status, hdrs, data)
        assert hdrs["Transfer-Encoding"] == "chunked" and hdrs["Cache-Control"] == "no-cache", hdrs
        events = sse_events(data)
        progress, reply = events[:-1], events[-1]
        assert reply["id"] == 11 and "running" in reply["result"]["content"][0]["text"], reply
        assert len(progress) >= 1, events
        for p in progress:
            assert p["method"] == "notifications/progress" and p["params"]["progressToken"] == "p-1", p
            assert p["params"]["total"] == 2.5 and job in p["params"]["message"], p
        # The same connection goes on: JSON only, then nothing to stream.
        status, hdrs, data = send(12, {"job": job, "wait": 1.5}, "application/json", token="p-2")
        assert status == 200 and hdrs["Content-Type"] == "application/json", (hdrs, data)
        assert json.loads(data)["id"] == 12, data
        status, hdrs, data = send(13, {"job": job, "wait": 0}, JSON["Accept"])
        assert status == 200 and hdrs["Content-Type"] == "application/json", (hdrs, data)
        assert json.loads(data)["id"] == 13, data
    finally:
        conn.close()
    call(kg, sid, "interrupt", {})
    kg.http("DELETE", "/mcp", headers={"Mcp-Session-Id": sid})


def test_stateless_progress_comes_on_an_event_stream(kgate_factory):
    """The stateless era streams a call's progress on its response, as a session does, so that no
    client's timeout cuts a long cell (Claude Code's HTTP transport gives up after 60 s)."""
    kg = kgate_factory(token=TOKEN)
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "modern", "version": "1"}}
    kid = kg.start_kernel()["id"]
    body = {"jsonrpc": "2.0", "id": 9, "method": "tools/call",
            "params": {"name": "execute", "arguments": {"code": "import time; time.sleep(2.5); print('late')",
                                                        "kernel": kid},
                       "_meta": {**meta, "progressToken": "p9"}}}
    status, hdrs, data = kg.http("POST", "/mcp", json.dumps(body),
                                 {**JSON, "Accept": "application/json, text/event-stream",
                                  "MCP-Protocol-Version": "2026-07-28"})
    assert status == 200 and hdrs["Content-Type"] == "text/event-stream", (status, hdrs, data)
    events = sse_events(data)
    progress = [e for e in events if e.get("method") == "notifications/progress"]
    assert progress and all(e["params"]["progressToken"] == "p9" for e in progress), events
    assert events[-1]["id"] == 9 and "late" in json.dumps(events[-1]["result"]), events[-1]
    kg.rest("DELETE", f"/api/kernels/{kid}")


def open_streaming_call(kg, body):
    """POSTs a stateless tools/call whose answer streams (its progress first); returns the
    connection once the first progress came, for the test to drop."""
    conn = kg._connection(60)
    conn.request("POST", "/mcp", json.dumps(body),
                 {**JSON, "MCP-Protocol-Version": "2026-07-28", "Authorization": f"token {TOKEN}"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream", resp.status
    assert b"notifications/progress" in resp.fp.readline() + resp.fp.readline() + resp.fp.readline()
    return conn


def test_a_call_whose_client_went_away_interrupts_its_cell(kgate_factory):
    """A client that closes the connection before the reply (a timeout, a crash) will never read
    it: the call is cancelled, which interrupts its cell and frees the kernel."""
    kg = kgate_factory(token=TOKEN)
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "modern", "version": "1"}}
    kid = kg.start_kernel()["id"]
    code = "import time\ntime.sleep(60)"
    body = {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
            "params": {"name": "execute", "arguments": {"code": code, "kernel": kid, "timeout": 120},
                       "_meta": {**meta, "progressToken": "p5"}}}
    conn = open_streaming_call(kg, body)
    conn.sock.close()  # gone, with the cell running
    conn.close()

    def job():
        status, _, jobs = kg.rest("GET", "/api/kgate/jobs")
        return next(j for j in jobs["jobs"] if j["code"] == code)

    assert wait_until(lambda: job()["status"] == "interrupted", 10), job()
    assert wait_until(lambda: kg.kernel_model(kid)["execution_state"] == "idle", 10)
    kg.rest("DELETE", f"/api/kernels/{kid}")


def test_a_kernel_made_by_a_call_whose_client_went_away_is_stopped(kgate_factory):
    """Issue 60: a stateless call that made its kernel and was cancelled (its client went away)
    sends no reply, so nothing will ever name that kernel: it is stopped, not left for the idle
    cull."""
    kg = kgate_factory(token=TOKEN)
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "modern", "version": "1"}}
    before = {k["id"] for k in kg.rest("GET", "/api/kernels")[2]}
    code = "import time\ntime.sleep(60)  # made its own kernel"
    body = {"jsonrpc": "2.0", "id": 6, "method": "tools/call",
            "params": {"name": "execute", "arguments": {"code": code, "timeout": 120},
                       "_meta": {**meta, "progressToken": "p6"}}}
    conn = open_streaming_call(kg, body)
    made = {k["id"] for k in kg.rest("GET", "/api/kernels")[2]} - before
    assert len(made) == 1, made
    conn.sock.close()  # gone, with the cell running in the kernel its call made
    conn.close()
    assert wait_until(lambda: not (made & {k["id"] for k in kg.rest("GET", "/api/kernels")[2]}), 20), \
        kg.log_tail()
    # /mcp runs the translator inside kgate: its log line is kgate's.
    assert any("made by a call that was cancelled before any reply named it; stopped" in ln for ln in kg.log_lines), \
        kg.log_tail()
