#!/usr/bin/env python3
"""Writes the seed corpus of each fuzz target into tests/fuzz/corpus/<target>/.

Run it again after changing it (`python3 tests/fuzz/make_corpus.py`); the output is committed.
The libFuzzer runs in scripts/sanitize.sh add what they find to a scratch copy, not here.
"""
import hashlib
import json
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CORPUS = HERE / "corpus"


def write(target, items):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    for old in d.iterdir():
        old.unlink()
    for name, data in items:
        if isinstance(data, str):
            data = data.encode()
        (d / name).write_bytes(data)


def header(msg_type, msg_id="0d6c1b4cbb3f4fb0a1c2d3e4f5a6b7c8"):
    return {"msg_id": msg_id, "msg_type": msg_type, "session": "6f0c2a9e4d2b4b8e9a1c3d5e7f901234",
            "username": "fuzz", "version": "5.3", "date": "2026-01-01T00:00:00.000000Z"}


EXECUTE = {"code": "print(1 + 1)", "silent": False, "store_history": True, "user_expressions": {},
           "allow_stdin": True, "stop_on_error": True}


# ---- wire: frames for FuzzedDataProvider ------------------------------------------------
# ConsumeRandomLengthString ends a string at a backslash followed by any other byte ("\\\\" is
# one backslash); the integers and bools are taken from the end of the input.
def fdp_strings(frames):
    out = b""
    for f in frames:
        out += f.replace(b"\\", b"\\\\") + b"\\\x00"
    return out


def wire_seed(frames, fix=True, validate=True, limit=60000):
    tail = struct.pack(">H", limit - 1) + bytes([1 if validate else 0, 1 if fix else 0])
    return fdp_strings(frames) + tail


def wire_items():
    h = json.dumps(header("execute_request")).encode()
    reply = json.dumps(header("execute_reply", "aa" * 16)).encode()
    yield "execute_request", wire_seed([b"<IDS|MSG>", b"", h, b"{}", b"{}", json.dumps(EXECUTE).encode()])
    yield "routed_reply", wire_seed([b"client-1", b"\x00k\x8bEg", b"<IDS|MSG>", b"", reply, h, b"{}",
                                     b'{"status": "ok", "execution_count": 1}'])
    yield "buffers", wire_seed([b"<IDS|MSG>", b"", json.dumps(header("comm_msg")).encode(), b"{}", b"{}",
                                b'{"comm_id": "c", "data": {}}', b"\x00\x01\x02", b""])
    yield "bad_signature", wire_seed([b"<IDS|MSG>", b"00" * 32, h, b"{}", b"{}", b"{}"], fix=False)
    yield "no_delimiter", wire_seed([b"a", b"b", b"c"])
    yield "deep_json", wire_seed([b"<IDS|MSG>", b"", b"[" * 600 + b"]" * 600, b"{}", b"{}", b"{}"])
    vectors = json.loads((ROOT / "tests" / "data" / "wire_vectors.json").read_text())
    import base64
    for i, case in enumerate(vectors.get("cases", [])[:8]):
        frames = [base64.b64decode(f) for f in case.get("frames_b64", [])]
        yield f"vector_{i}", wire_seed(frames, fix=False)


# ---- websocket frames ------------------------------------------------------------------------
def legacy_json(channel, msg_type, content, buffers=False):
    m = {"header": header(msg_type), "parent_header": {}, "metadata": {}, "content": content,
         "channel": channel}
    if buffers:
        m["buffers"] = []
    return json.dumps(m)


def legacy_binary(msg, buffers):
    parts = [json.dumps(msg).encode()] + list(buffers)
    offsets = [4 * (len(parts) + 1)]
    for p in parts[:-1]:
        offsets.append(offsets[-1] + len(p))
    return struct.pack("!%dI" % (len(parts) + 1), len(parts), *offsets) + b"".join(parts)


def v1(channel, hdr, parent, metadata, content, buffers=()):
    segs = [channel.encode()] + [json.dumps(x).encode() for x in (hdr, parent, metadata, content)] + list(buffers)
    n = len(segs) + 1
    offsets = [8 * (1 + n)]
    for s in segs:
        offsets.append(offsets[-1] + len(s))
    return struct.pack("<%dQ" % (n + 1), n, *offsets) + b"".join(segs)


def ws_items():
    yield "legacy_execute", legacy_json("shell", "execute_request", EXECUTE)
    yield "legacy_kernel_info", legacy_json("shell", "kernel_info_request", {}, buffers=True)
    yield "legacy_stdin", legacy_json("stdin", "input_reply", {"value": "x"})
    yield "legacy_control", legacy_json("control", "interrupt_request", {})
    comm = {"header": header("comm_msg"), "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"comm_id": "c1", "data": {"x": 1}}}
    yield "legacy_binary", legacy_binary(comm, [b"\x00\x01\x02\x03", b"buffer two"])
    yield "v1_execute", v1("shell", header("execute_request"), {}, {}, EXECUTE)
    yield "v1_buffers", v1("shell", header("comm_msg"), {}, {}, {"comm_id": "c1", "data": {}}, [b"\xff" * 8, b""])
    yield "v1_control", v1("control", header("shutdown_request"), {}, {}, {"restart": False})
    yield "v1_bad_offsets", struct.pack("<3Q", 2, 24, 9999) + b"shell"


# ---- HTTP requests ----------------------------------------------------------------------------
# The first byte is the harness's mode: bit 0 the server with a token, bit 1 a non-loopback peer,
# bit 2 the Unix socket.
def http(method, target, body=b"", headers=(), mode=0, host="127.0.0.1:8787"):
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"] + list(headers)
    if body or method in ("POST", "PATCH", "PUT"):
        lines.append(f"Content-Length: {len(body)}")
        lines.append("Content-Type: application/json")
    return bytes([mode]) + ("\r\n".join(lines) + "\r\n\r\n").encode() + body


KID = "5e0d1b0c-7c1f-4d4e-9a51-0d2b3c4d5e6f"


def http_items():
    tok = ["Authorization: token fuzz-token"]
    yield "api", http("GET", "/api")
    yield "status", http("GET", "/api/status")
    yield "kernels", http("GET", "/api/kernels")
    yield "kernels_token", http("GET", "/api/kernels", headers=tok, mode=1)
    yield "kernels_query_token", http("GET", "/api/kernels?token=fuzz-token", mode=1)
    yield "kernels_bad_token", http("GET", "/api/kernels", headers=["Authorization: token nope"], mode=1)
    yield "kernel", http("GET", f"/api/kernels/{KID}")
    yield "post_kernel", http("POST", "/api/kernels", {"name": "python3", "env": {"LANG": "C"}, "path": "sub"})
    yield "post_kernel_cwd", http("POST", "/api/kernels", {"cwd": "/tmp", "kgate_cull_idle_timeout": 30})
    yield "post_kernel_bad", http("POST", "/api/kernels", b"{not json")
    yield "delete_kernel", http("DELETE", f"/api/kernels/{KID}")
    yield "interrupt", http("POST", f"/api/kernels/{KID}/interrupt")
    yield "restart", http("POST", f"/api/kernels/{KID}/restart")
    yield "kernelspecs", http("GET", "/api/kernelspecs")
    yield "kernelspec", http("GET", "/api/kernelspecs/python3")
    yield "kernelspec_resource", http("GET", "/kernelspecs/python3/logo-64x64.png")
    yield "observe", http("GET", "/observe")
    yield "foreign_origin", http("POST", "/api/kernels", {}, headers=["Origin: http://evil.example"])
    yield "rebinding_host", http("GET", "/api/kernels", host="evil.example:8787",
                                 headers=["Origin: http://evil.example:8787"])
    yield "unix_peer", http("GET", "/api/kernels", host="localhost", mode=4)
    yield "percent_path", http("GET", "/api/kernels/%2e%2e/%41?x=%zz")
    yield "chunked", (bytes([0]) + b"POST /api/kernels HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
                      b"Content-Type: application/json\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
    yield "upgrade", http("GET", f"/api/kernels/{KID}/channels?session_id=s",
                          headers=["Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Version: 13",
                                   "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="])
    # kgate's own API (docs/records.md, docs/dev/records.md)
    for path in ("/api/kgate/kernels", f"/api/kgate/kernels/{KID}", f"/api/kgate/kernels/{KID}/digest?agent=a1",
                 f"/api/kgate/kernels/{KID}/notebook", "/api/kgate/jobs?kernel=x&wait=0.01", "/api/kgate/jobs/3",
                 "/api/kgate/jobs/3?wait=0.01", "/api/kgate/pool", "/api/kgate/kernelspecs",
                 "/api/kgate/kernelspecs/python3", "/api/kgate/agent"):
        yield "kgate_" + hashlib.sha1(path.encode()).hexdigest()[:8], http("GET", path)
    yield "kgate_execute", http("POST", f"/api/kgate/kernels/{KID}/execute",
                                {"code": "1+1", "agent": "a1", "wait": 0.01, "origin": "host"})
    yield "kgate_restart", http("POST", f"/api/kgate/kernels/{KID}/restart", {"agent": "a1"})
    yield "kgate_ack", http("POST", f"/api/kgate/kernels/{KID}/digest/ack", {"agent": "a1", "through": 4})
    yield "kgate_interrupt", http("POST", "/api/kgate/jobs/3/interrupt", {"agent": "a1"})


# ---- MCP JSON-RPC -------------------------------------------------------------------------------
def rpc(*msgs):
    return "".join((m if isinstance(m, str) else json.dumps(m)) + "\n" for m in msgs)


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "fuzz", "version": "1"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def jsonrpc_items():
    yield "session", rpc(INIT, INITIALIZED, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                         {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                          "params": {"name": "echo", "arguments": {"x": 1}, "_meta": {"progressToken": 7}}})
    yield "errors", rpc(INIT, {"jsonrpc": "2.0", "id": "a", "method": "tools/call",
                               "params": {"name": "echo", "arguments": {"bad": 1}}},
                        {"jsonrpc": "2.0", "id": "b", "method": "tools/call", "params": {"name": "echo", "arguments": {"fail": 1}}},
                        {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "nope"}})
    yield "cancel", rpc(INIT, {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "echo", "arguments": {}}},
                        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5}})
    yield "modern", rpc({"jsonrpc": "2.0", "id": 1, "method": "server/discover",
                         "params": {"_meta": {"protocolVersion": "2026-07-28"}}},
                        {"jsonrpc": "2.0", "id": 2, "method": "tools/list",
                         "params": {"_meta": {"protocolVersion": "2026-07-28", "clientInfo": {"name": "c", "version": "2"}}}})
    yield "garbage", rpc("{", "[]", '[{"jsonrpc":"2.0","id":1,"method":"ping"}]', "null", '{"jsonrpc":"1.0"}',
                         {"jsonrpc": "2.0", "id": {"x": 1}, "method": "ping"}, {"jsonrpc": "2.0", "id": 9, "method": "ping"},
                         {"jsonrpc": "2.0", "id": 10, "result": {}})
    yield "bad_version", rpc({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "1999-01-01"}})


# ---- kernel.json, connection files, TOML ----------------------------------------------------
def kernel_json_items():
    for spec in sorted((ROOT / "tests" / "data" / "kernelspecs").rglob("kernel.json")):
        yield "spec_" + spec.parent.name, spec.read_bytes()
    yield "debian_python3", json.dumps({"argv": ["/usr/bin/python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                                        "display_name": "Python 3 (ipykernel)", "language": "python",
                                        "metadata": {"debugger": True}, "env": {"A": "${HOME}/x"},
                                        "interrupt_mode": "signal"}, indent=1)
    yield "connection", json.dumps({"shell_port": 50001, "iopub_port": 50002, "stdin_port": 50003,
                                    "control_port": 50004, "hb_port": 50005, "ip": "127.0.0.1",
                                    "key": "a0436f6c-1916-498b-8eb9-e81ab9368e84", "transport": "tcp",
                                    "signature_scheme": "hmac-sha256", "kernel_name": "python3"}, indent=1)
    yield "connection_ipc", json.dumps({"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4,
                                        "hb_port": 5, "ip": "/tmp/kgate-ipc", "key": "", "transport": "ipc",
                                        "signature_scheme": "hmac-sha512"})


def toml_items():
    yield "kgate_toml", (ROOT / "config" / "kgate.toml").read_bytes()
    yield "gateways_toml", (ROOT / "config" / "gateways.toml").read_bytes()
    yield "gateways_small", ('[gateways.lab]\nurl = "https://lab.example:8787"\ntoken_env = "LAB_TOKEN"\n'
                             'verify = false\nca_file = "/etc/ssl/lab.pem"\n\n[gateways.sock]\nurl = "unix:///run/kgate.sock"\n')
    yield "limits", "[limits]\nmax_kernels = 0\nclient_queue_bytes = 1\n[pool]\nsize = 2\n[pool.kernels]\npython3 = 1\n"


# ---- job records: kernel messages for the record path ---------------------------------------
# A step is an op byte and a `who` byte (taken from the end) and one string (from the front); the
# record limits are taken from the very end first.  ops: 0-5 iopub stream, error, execute_result,
# execute_input, status and an execute_reply with the string as their content; 6-11 the same as
# well-formed messages with the string in their text fields; 12 an agent's submit, 13 a client's
# silent request, 14 a restart / death / cull, 15 every read.  who: the request (index into
# r0 r1 r2 and those submitted), bit 7 kgate's own session.
def kernel_bytes(obj):
    """Content as ipykernel packs it: a str's '\\udcXX' goes out as the raw byte XX."""
    return json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogateescape")


def record_seed(steps, output=64, code=64, budget=4096, jobs=16, unseen=16, marks=4):
    consumed = []
    for value, width in ((output - 1, 2), (code - 1, 2), (budget - 1, 2), (jobs - 1, 1), (unseen - 1, 1),
                         (marks - 1, 1)):
        consumed += list(value.to_bytes(width, "big"))  # the first byte taken is the high one
    strings = []
    for op, who, text in steps:
        consumed += [op, who]
        strings.append(text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape"))
    return fdp_strings(strings) + bytes(reversed(consumed))


BAD = "out \udcff \x1b\u00e9 \x1b[1;31mred\x1b[0m \udce4\udcb8 \x1b]8;;http://x/\u00e9\x07link\x1b \U0001f600"


def record_items():
    r0 = 0
    yield "foreign_cell_raw", record_seed([
        (4, r0, kernel_bytes({"execution_state": "busy"})),
        (3, r0, kernel_bytes({"code": "raise ValueError('\\x1b\\u00e9 bad')", "execution_count": 1})),
        (0, r0, kernel_bytes({"name": "stdout", "text": BAD})),
        (2, r0, kernel_bytes({"data": {"text/plain": "res \udcc3"}, "execution_count": 1})),
        (1, r0, kernel_bytes({"ename": "ValueError", "evalue": "\x1b\u00e9 \udce9 bad",
                              "traceback": ["\x1b[0;31mValueError\x1b[0m: \x1b\u00e9 \udce9 bad"]})),
        (5, r0, kernel_bytes({"status": "error", "ename": "ValueError", "evalue": "\udcff"})),
        (4, r0, kernel_bytes({"execution_state": "idle"})),
        (15, 40, ""),
    ])
    # An agent's cell: its request is the fourth (index 3), in kgate's session.
    yield "agent_cell", record_seed([
        (12, 0, "print('\u00e9')"),
        (10, 0x83, ""),
        (9, 0x83, "print('\u00e9')"),
        (6, 0x83, BAD),
        (0x16, 0x83, "err \udcc3\x1b"),
        (8, 0x83, "\udcf0\udc9f\udc98"),
        (7, 0x83, BAD),
        (11, 0x83, "\x1b\u00e9"),
        (0x1A, 0x83, ""),
        (15, 3, ""),
    ], output=16, code=8)
    yield "silent_and_restart", record_seed([
        (13, 1, "x = '\udcff'"),
        (10, 1, ""),
        (6, 1, "a" * 40 + "\u00e9" * 20 + "\udce9"),
        (14, 0, "restarted \udcff"),
        (0x1D, 2, b'{"code": "y", "silent": true}'),
        (0x2E, 2, "culled"),
        (15, 7, ""),
    ], output=8, budget=64, jobs=2, unseen=1)


if __name__ == "__main__":
    write("wire", wire_items())
    write("ws_codec", ws_items())
    write("http", http_items())
    write("jsonrpc", jsonrpc_items())
    write("kernel_json", kernel_json_items())
    write("toml", toml_items())
    write("record", record_items())
    for d in sorted(CORPUS.iterdir()):
        print(f"{d.name}: {len(list(d.iterdir()))} seeds")
