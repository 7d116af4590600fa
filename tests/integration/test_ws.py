"""Websocket channels: legacy JSON, legacy binary, v1, routing between clients, replay."""

import time
import uuid

import pytest
import websocket

from conftest import V1_PROTOCOL, KernelWS, wait_until

TEXT = websocket.ABNF.OPCODE_TEXT
BINARY = websocket.ABNF.OPCODE_BINARY

ECHO_TARGET_CODE = """
def _kgate_echo_target(comm, open_msg):
    @comm.on_msg
    def _echo(msg):
        comm.send({"echo": msg["content"]["data"], "nbuf": len(msg["buffers"])},
                  buffers=[bytes(b) for b in msg["buffers"]])
get_ipython().kernel.comm_manager.register_target("kgate_echo", _kgate_echo_target)
print("echo-ready")
"""

# Deliberately not valid UTF-8.
BUFFERS = [b"\x00\x01\xff\xfe binary \x80\x81", b"second buffer \xc3\x28", bytes(range(256))]


@pytest.fixture(scope="module")
def echo_kernel(kgate, shared_kernel):
    """The shared kernel with a comm target that echoes comm_msg data and buffers."""
    with kgate.connect(shared_kernel) as ws:
        assert ws.run(ECHO_TARGET_CODE) == "echo-ready\n"
    return shared_kernel


def parent_id(msg):
    return msg.get("parent_header", {}).get("msg_id")


def check_full_message(msg):
    for key in ("header", "parent_header", "metadata", "content", "buffers", "msg_id", "msg_type",
                "channel"):
        assert key in msg, f"server message lacks {key!r}: {msg!r}"
    assert msg["msg_id"] == msg["header"]["msg_id"], msg
    assert msg["msg_type"] == msg["header"]["msg_type"], msg


def comm_echo(ws, buffers, binary_opcode=None, timeout=15):
    """Open a kgate_echo comm and send one comm_msg with buffers; return the echoed message."""
    comm_id = uuid.uuid4().hex
    ws.request("comm_open", {"comm_id": comm_id, "target_name": "kgate_echo", "data": {}})
    payload = {"hello": "world", "n": 42}
    mid = ws.request("comm_msg", {"comm_id": comm_id, "data": payload}, buffers=buffers,
                     binary_opcode=binary_opcode)
    echo = ws.wait_for(lambda m: m.get("msg_type") == "comm_msg" and m.get("channel") == "iopub"
                       and parent_id(m) == mid, timeout, what="echoed comm_msg")
    check_full_message(echo)
    assert echo["content"]["comm_id"] == comm_id, echo
    assert echo["content"]["data"] == {"echo": payload, "nbuf": len(buffers)}, echo["content"]
    ws.request("comm_close", {"comm_id": comm_id, "data": {}})
    return echo


# ---------------------------------------------------------------- legacy JSON

def test_legacy_json_kernel_info(kgate, shared_kernel):
    with kgate.connect(shared_kernel, session_id="legacy-" + uuid.uuid4().hex) as ws:
        assert ws.subprotocol is None, f"server selected {ws.subprotocol!r} though none was offered"
        mid = ws.request("kernel_info_request")
        reply = ws.wait_reply(mid, "kernel_info_reply")
        check_full_message(reply)
        assert reply["channel"] == "shell"
        assert reply["_opcode"] == TEXT, "a message without buffers should be a text frame"
        assert reply["buffers"] == []
        assert reply["content"]["status"] == "ok"
        assert reply["content"]["language_info"]["name"] == "python"
        assert reply["parent_header"]["msg_id"] == mid


def test_legacy_json_execute(kgate, shared_kernel):
    with kgate.connect(shared_kernel) as ws:
        r = ws.execute("print('hello from kgate')\n6 * 7")
        assert r.status == "ok", r
        assert r.stdout == "hello from kgate\n", r
        assert r.results and r.results[-1]["data"]["text/plain"] == "42", r
        types = [m["msg_type"] for m in r.iopub]
        assert "execute_input" in types, types
        states = [m["content"]["execution_state"] for m in r.iopub if m["msg_type"] == "status"]
        assert states[0] == "busy" and states[-1] == "idle", states
        for m in r.iopub:
            check_full_message(m)
        check_full_message(r.reply)
        assert isinstance(r.reply["content"]["execution_count"], int)


def test_without_session_id(kgate, shared_kernel):
    ws = KernelWS(kgate.ws_url(shared_kernel, token=kgate.token))   # no ?session_id
    with ws:
        assert ws.run("print('no session id')") == "no session id\n"


def test_control_channel(kgate, shared_kernel):
    with kgate.connect(shared_kernel) as ws:
        mid = ws.request("kernel_info_request", channel="control")
        reply = ws.wait_reply(mid, "kernel_info_reply")
        assert reply["channel"] == "control", reply["channel"]


def input_roundtrip(ws, value="forty-two", timeout=5):
    """Run a cell calling input(); answer the input_request. Returns (got_request, result).
    If the input_request never arrives, a blind input_reply still unblocks the kernel
    (ipykernel does not check its parent), so one lost request cannot wedge the kernel."""
    r = ws.execute_async("answer = input('prompt> ')\nprint('got', answer)", allow_stdin=True)
    try:
        req = ws.wait_for(lambda m: m.get("msg_type") == "input_request" and parent_id(m) == r.msg_id,
                          timeout, what="input_request")
    except TimeoutError:
        req = None
    reply = ws.make_msg("input_reply", {"value": value}, channel="stdin")
    reply["parent_header"] = req["header"] if req else {}
    ws.send_msg(reply)
    ws.collect(r, 15)
    return req, r


def test_stdin_input_request(kgate, shared_kernel):
    with kgate.connect(shared_kernel) as ws:
        req, r = input_roundtrip(ws)
        assert req is not None, "input_request from the kernel never reached the requesting client"
        assert req["channel"] == "stdin", req
        assert req["content"]["prompt"] == "prompt> "
        assert r.status == "ok", r
        assert r.stdout == "got forty-two\n", r


@pytest.mark.parametrize("after", ["start", "restart"])
def test_stdin_right_after_ready(kgate, after):
    """input() as the very first cell once POST /api/kernels (or .../restart) returned: the
    kernel sends input_request on its stdin ROUTER, which drops messages for a peer that
    is not connected yet, so kgate's stdin channel must be connected before it says ready.
    Several attempts, since a lost request depends on timing."""
    attempts, lost = 6, []
    kid = kgate.start_kernel()["id"] if after == "restart" else None
    try:
        for i in range(attempts):
            if after == "start":
                kid = kgate.start_kernel()["id"]
            else:
                status, _, body = kgate.rest("POST", f"/api/kernels/{kid}/restart")
                assert status == 200, (status, body)
            with kgate.connect(kid) as ws:
                req, r = input_roundtrip(ws, value=f"v{i}", timeout=3)
                if req is None:
                    lost.append(i)
                else:
                    assert r.stdout == f"got v{i}\n", r
            if after == "start":
                kgate.delete_kernel(kid)
    finally:
        if after == "restart":
            kgate.delete_kernel(kid, check=False)
    assert not lost, (f"input_request lost in attempts {lost} of {attempts}: the first cell after "
                      f"{after} called input() and the kernel's request never reached the client")


def test_unknown_kernel_ws_is_404(kgate):
    with pytest.raises(websocket.WebSocketBadStatusException) as info:
        KernelWS(kgate.ws_url(str(uuid.uuid4()), token=kgate.token)).close()
    assert info.value.status_code == 404, str(info.value)


# ---------------------------------------------------------------- legacy binary

def test_legacy_binary_frame_kernel_info(kgate, shared_kernel):
    """A client request inside a legacy binary frame (one buffer) reaches the kernel."""
    with kgate.connect(shared_kernel) as ws:
        mid = ws.request("kernel_info_request", buffers=[b"\x00\xffunused buffer"])
        reply = ws.wait_reply(mid, "kernel_info_reply")
        assert reply["content"]["status"] == "ok"


def test_legacy_binary_buffers_roundtrip(kgate, echo_kernel):
    """Client->server buffers arrive at the kernel; server->client messages with buffers
    come as legacy binary frames carrying the exact bytes."""
    with kgate.connect(echo_kernel) as ws:
        echo = comm_echo(ws, BUFFERS)
        assert echo["_opcode"] == BINARY, "a message with buffers must be a binary frame"
        assert [bytes(b) for b in echo["buffers"]] == BUFFERS
        # the connection keeps working
        assert ws.run("print('after binary')") == "after binary\n"


def test_legacy_binary_frame_with_text_opcode(kgate, echo_kernel):
    """jupyter_server's relay forwards browser binary frames with a TEXT opcode; the payload
    starts with the u32be count and is not valid UTF-8. It must be accepted."""
    with kgate.connect(echo_kernel) as ws:
        mid = ws.request("kernel_info_request", buffers=[b"\xff\xfe\xfd"], binary_opcode=TEXT)
        reply = ws.wait_reply(mid, "kernel_info_reply")
        assert reply["content"]["status"] == "ok"
        echo = comm_echo(ws, BUFFERS, binary_opcode=TEXT)
        assert [bytes(b) for b in echo["buffers"]] == BUFFERS
        assert ws.run("print('after text-binary')") == "after text-binary\n"


# ---------------------------------------------------------------- v1 protocol

def test_v1_protocol(kgate, echo_kernel):
    with kgate.connect(echo_kernel, subprotocols=[V1_PROTOCOL]) as ws:
        assert ws.subprotocol == V1_PROTOCOL, ws.subprotocol
        assert ws.v1
        mid = ws.request("kernel_info_request")
        reply = ws.wait_reply(mid, "kernel_info_reply")
        assert reply["channel"] == "shell"
        assert reply["content"]["status"] == "ok"

        r = ws.execute("print('v1 says hi')")
        assert r.status == "ok" and r.stdout == "v1 says hi\n", r
        assert r.reply["channel"] == "shell"
        assert all(m["channel"] == "iopub" for m in r.iopub)

        mid = ws.request("kernel_info_request", channel="control")
        assert ws.wait_reply(mid, "kernel_info_reply")["channel"] == "control"

        echo = comm_echo(ws, BUFFERS)
        assert [bytes(b) for b in echo["buffers"]] == BUFFERS
        assert all(op == BINARY for op, _ in ws.frame_log), ws.frame_log


# ---------------------------------------------------------------- many clients

def test_two_clients_routing(kgate, shared_kernel, ws_clients):
    a = kgate.connect(shared_kernel, session_id="client-a-" + uuid.uuid4().hex)
    b = kgate.connect(shared_kernel, session_id="client-b-" + uuid.uuid4().hex)
    ws_clients += [a, b]
    for ws in (a, b):  # both fully attached before the test proper
        ws.wait_reply(ws.request("kernel_info_request"), "kernel_info_reply")

    def observe(ws, exec_id):
        """Messages ws sees for exec_id, until its iopub idle plus a grace period."""
        seen = [ws.wait_for(lambda m: m.get("channel") == "iopub" and m.get("msg_type") == "status"
                            and parent_id(m) == exec_id
                            and m["content"]["execution_state"] == "idle",
                            15, what=f"iopub idle of the other client's cell {exec_id}")]
        seen += [m for m in ws.drain(0.7) if parent_id(m) == exec_id]
        return seen

    for sender, other, tag in ((a, b, "from-a"), (b, a, "from-b")):
        r = sender.execute(f"print('{tag}')")
        assert r.status == "ok" and r.stdout == f"{tag}\n", r
        seen = observe(other, r.msg_id)
        streams = "".join(m["content"]["text"] for m in seen if m.get("msg_type") == "stream")
        assert streams == f"{tag}\n", f"iopub not fanned out to the other client: {seen!r}"
        leaked = [m for m in seen if m.get("channel") != "iopub"]
        assert not leaked, f"shell reply of one client delivered to the other: {leaked!r}"

    mid = a.request("kernel_info_request")
    a.wait_reply(mid, "kernel_info_reply")
    leaked = [m for m in b.drain(0.7) if parent_id(m) == mid and m.get("channel") != "iopub"]
    assert not leaked, f"client B received client A's kernel_info_reply: {leaked!r}"


def test_connections_count(kgate, shared_kernel):
    def conns():
        return kgate.kernel_model(shared_kernel)["connections"]

    assert wait_until(lambda: conns() == 0, 5), f"connections={conns()} with no client open"
    ws1 = kgate.connect(shared_kernel)
    ws2 = kgate.connect(shared_kernel)
    try:
        ws1.wait_reply(ws1.request("kernel_info_request"))
        ws2.wait_reply(ws2.request("kernel_info_request"))
        assert wait_until(lambda: conns() == 2, 3), f"connections={conns()} with 2 clients"
        _, _, st = kgate.rest("GET", "/api/status")
        assert st["connections"] >= 2, st
        ws1.close()
        assert wait_until(lambda: conns() == 1, 3), f"connections={conns()} after one close"
    finally:
        ws1.close()
        ws2.close()
    assert wait_until(lambda: conns() == 0, 3), f"connections={conns()} after all closed"


def test_garbage_frames_do_not_break_the_daemon(kgate, shared_kernel):
    ws = kgate.connect(shared_kernel)
    try:
        for payload, opcode in (("this is not json", TEXT), ("{\"header\": 5}", TEXT),
                                (b"\x00\x00\x00\x05\x00\x00", BINARY),
                                (b"\x00\x00\x00\x02\x00\x00\x00\x0c\xff\xff\xff\xff", BINARY),
                                (b"\xff\xfe\xfd", TEXT), (b"", BINARY)):
            try:
                ws.ws.send(payload, opcode=opcode)
            except (OSError, websocket.WebSocketException):
                break
        time.sleep(0.3)
    finally:
        ws.close()
    status, _, _ = kgate.rest("GET", "/api")
    assert status == 200
    with kgate.connect(shared_kernel) as ws2:
        assert ws2.run("print('still fine')") == "still fine\n"


# ---------------------------------------------------------------- replay

N_LINES = 4000
REPLAY_CODE = f"""
import sys, time
for i in range({N_LINES}):
    print("%05d %s" % (i, "abcdefghij" * 4))
    if i % 40 == 39:
        sys.stdout.flush()
        time.sleep(0.02)
"""
REPLAY_EXPECTED = "".join("%05d %s\n" % (i, "abcdefghij" * 4) for i in range(N_LINES))


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


@pytest.mark.parametrize("when", ["mid-cell", "after-cell"])
def test_replay_after_reconnect(kgate, shared_kernel, when):
    session = f"replay-{when}-" + uuid.uuid4().hex
    ws1 = kgate.connect(shared_kernel, session_id=session)
    try:
        ws1.wait_reply(ws1.request("kernel_info_request"))
        r = ws1.execute_async(REPLAY_CODE)
        ws1.wait_for(lambda m: m.get("msg_type") == "stream" and parent_id(m) == r.msg_id, 15,
                     what="first stream chunk")
        during_close = ws1.close_collecting()
    finally:
        ws1.close()
    first = [m for m in ws1.received if parent_id(m) == r.msg_id]
    for m in first:
        r.add(m)
    assert not r.saw_idle, "the cell finished before the disconnect; make it longer"
    disconnected_at = time.monotonic()
    if when == "mid-cell":
        time.sleep(1.0)
    else:
        assert wait_until(lambda: kgate.kernel_model(shared_kernel)["execution_state"] == "idle", 20), \
            "the cell did not finish while disconnected"
        time.sleep(0.3)
    assert time.monotonic() - disconnected_at < 10

    ws2 = kgate.connect(shared_kernel, session_id=session)
    try:
        deadline = time.monotonic() + 30
        second = []
        while not r.saw_idle and time.monotonic() < deadline:
            try:
                m = ws2.wait_for(lambda m: parent_id(m) == r.msg_id, deadline - time.monotonic(),
                                 what="replayed/live messages")
            except TimeoutError:
                break
            second.append(m)
            r.add(m)
        if r.saw_idle and r.reply is None:
            try:
                m = ws2.wait_reply(r.msg_id, "execute_reply", timeout=3)
                second.append(m)
            except TimeoutError:
                pass
    finally:
        ws2.close()

    stdout = "".join(m["content"]["text"] for m in first + second
                     if m.get("msg_type") == "stream" and m["content"].get("name") == "stdout")
    n_first = sum(1 for m in first if m.get("msg_type") == "stream")
    n_second = sum(1 for m in second if m.get("msg_type") == "stream")
    assert r.saw_idle, (f"never saw the cell's iopub idle after reconnecting; "
                        f"{n_first} stream msgs before, {n_second} after "
                        f"({len(during_close)} during close)")
    if stdout != REPLAY_EXPECTED:
        i = first_difference(stdout, REPLAY_EXPECTED)
        pytest.fail(f"stream output not delivered exactly once in order: got {len(stdout)} chars, "
                    f"expected {len(REPLAY_EXPECTED)}; first difference at {i}: "
                    f"got {stdout[max(0, i - 60):i + 60]!r} expected "
                    f"{REPLAY_EXPECTED[max(0, i - 60):i + 60]!r}; stream msgs: {n_first} on the first "
                    f"connection ({len(during_close)} msgs during close), {n_second} on the second")
    replies = [m for m in first + second if m.get("msg_type") == "execute_reply"]
    assert len(replies) == 1, f"execute_reply delivered {len(replies)} times across both connections"
