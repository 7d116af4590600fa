"""A plain jupyter_client.BlockingKernelClient attaches to a kgate kernel by its connection file."""

import json
import stat
import uuid

import pytest
from jupyter_client import BlockingKernelClient



@pytest.fixture
def kc(kgate, kernel):
    cf = kgate.connection_file(kernel)
    assert cf.is_file(), f"no connection file {cf}"
    client = BlockingKernelClient()
    client.load_connection_file(str(cf))
    client.start_channels()
    try:
        client.wait_for_ready(timeout=30)
        yield client
    finally:
        client.stop_channels()


def test_connection_file_contents(kgate, kernel):
    cf = kgate.connection_file(kernel)
    assert stat.S_IMODE(cf.stat().st_mode) == 0o600
    info = json.loads(cf.read_text())
    assert info["transport"] == "ipc", info  # Unix sockets in the runtime dir (test_kernel_sockets.py)
    assert info["signature_scheme"] == "hmac-sha256", info
    assert isinstance(info["key"], str) and len(info["key"]) >= 16, "weak or missing HMAC key"
    ports = [info[k] for k in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")]
    assert all(isinstance(p, int) and p > 0 for p in ports), info
    assert len(set(ports)) == 5, f"ports not distinct: {info}"


def test_execute_interactive(kc):
    out = []
    reply = kc.execute_interactive("print(sum(range(10)))", timeout=30,
                                   output_hook=lambda m: out.append(m))
    assert reply["content"]["status"] == "ok", reply["content"]
    text = "".join(m["content"]["text"] for m in out if m["msg_type"] == "stream")
    assert text == "45\n", out


def test_execute_and_get_iopub(kc):
    msg_id = kc.execute("print('via get_iopub_msg')")
    reply = kc.get_shell_msg(timeout=30)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=30)
    assert reply["content"]["status"] == "ok"
    text = ""
    while True:
        msg = kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            text += msg["content"]["text"]
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    assert text == "via get_iopub_msg\n"


def test_same_kernel_as_websocket(kgate, kernel, kc, ws_clients):
    ws = kgate.connect(kernel)
    ws_clients.append(ws)
    value = "from-ws-" + uuid.uuid4().hex
    ws.run(f"shared_value = {value!r}")

    out = []
    reply = kc.execute_interactive("print(shared_value)\nkc_value = shared_value[::-1]", timeout=30,
                                   output_hook=lambda m: out.append(m))
    assert reply["content"]["status"] == "ok", reply["content"]
    text = "".join(m["content"]["text"] for m in out if m["msg_type"] == "stream")
    assert text == value + "\n", f"variable set over the websocket not visible to the client: {out}"

    # the websocket client sees the direct client's cell on iopub (fan-out) ...
    kc_msg_id = reply["parent_header"]["msg_id"]
    msg = ws.wait_for(lambda m: m.get("channel") == "iopub" and m.get("msg_type") == "stream"
                      and m["parent_header"].get("msg_id") == kc_msg_id, 10,
                      what="iopub stream of the direct client's cell")
    assert msg["content"]["text"] == value + "\n"
    # ... but not its shell reply
    leaked = [m for m in ws.drain(0.5) if m.get("channel") == "shell"
              and m["parent_header"].get("msg_id") == kc_msg_id]
    assert not leaked, leaked

    # and the variable set by the direct client is visible over the websocket;
    # the websocket's cell shows up on the direct client's iopub too
    r = ws.execute("print(kc_value)")
    assert r.status == "ok" and r.stdout == value[::-1] + "\n", r
    text = ""
    while True:
        msg = kc.get_iopub_msg(timeout=10)
        if msg["parent_header"].get("msg_id") != r.msg_id:
            continue
        if msg["msg_type"] == "stream":
            text += msg["content"]["text"]
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    assert text == value[::-1] + "\n"
