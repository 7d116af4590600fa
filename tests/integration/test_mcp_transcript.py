"""Transcript tests for kgate-mcp's protocol layer: JSON-RPC errors, EOF and a clean stdout.

They drive the real binary over its stdin and stdout: malformed lines, unknown methods, bad
params, an unknown tool and requests before initialize. Each of these must get the right JSON-RPC
error (or answer), and the server must go on serving afterwards. They also check that EOF on
stdin ends the process promptly with exit code 0, and that stdout carries nothing but JSON-RPC
lines. None of this needs a gateway: only initialize, ping, server/discover, tools/list and
errors are used.

The binary is $KGATE_MCP_BIN; else translator/kgate-mcp in the build tree of $KGATE_BIN (which
CTest sets); else <repo>/build/translator/kgate-mcp:

    KGATE_MCP_BIN=build/translator/kgate-mcp /usr/bin/python3 -m pytest -q tests/integration/test_mcp_transcript.py
"""

import json
import os
import queue
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import _LIVE_DAEMONS, die_with_parent

REPO = Path(__file__).resolve().parents[2]
REPLY_TIMEOUT = 5.0
EXIT_TIMEOUT = 1.0  # "exit promptly on stdin EOF"
TOOLS = {"connect", "execute", "poll_job", "list_kernels", "stop_kernel", "restart", "interrupt", "server_status",
         "verify"}
TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
MODERN = "2026-07-28"

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602
UNSUPPORTED_PROTOCOL_VERSION = -32022


@pytest.fixture(scope="session")
def mcp_bin():
    binary = os.environ.get("KGATE_MCP_BIN")
    if not binary and os.environ.get("KGATE_BIN"):  # <build>/gateway/kgate -> <build>/translator/kgate-mcp
        binary = str(Path(os.environ["KGATE_BIN"]).resolve().parent.parent / "translator" / "kgate-mcp")
    if not binary:
        binary = str(REPO / "build" / "translator" / "kgate-mcp")
    binary = os.path.abspath(binary)
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        pytest.fail(f"kgate-mcp not found at {binary}: build it, or set KGATE_MCP_BIN.", pytrace=False)
    return binary


def owner_token_env(env):
    """What the owner's kgate-mcp needs to reach the test kgate at env's KGATE_URL, as it would
    on a real machine: nothing but the XDG_STATE_HOME that kgate keeps its own token under (the
    translator finds it there). A kgate whose state dir is elsewhere (--state-dir) has its
    token passed in KGATE_TOKEN; a kgate with a given token is the test's to pass."""
    if "KGATE_TOKEN" in env:
        return {}
    for kg in _LIVE_DAEMONS:
        if kg.url and env.get("KGATE_URL", "").rstrip("/") == kg.url and kg.own_token_file:
            state_home = kg.env.get("XDG_STATE_HOME")
            if state_home and kg.own_token_file == Path(state_home) / "kgate" / "token":
                return {"XDG_STATE_HOME": state_home}
            return {"KGATE_TOKEN": kg.token}
    return {}


class Mcp:
    """One kgate-mcp process. It records every stdout line, and replies are looked up by id."""

    def __init__(self, binary, home, env_extra=None):
        home.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        for key in ("KGATE_TOKEN", "KGATE_URL"):
            env.pop(key, None)
        # Nothing here should reach a gateway. If something tries, it finds none.
        env["KGATE_URL"] = "http://127.0.0.1:9"
        env["XDG_CONFIG_HOME"] = str(home / "config")
        env.update(env_extra or {})
        env.update(owner_token_env(env))
        self.stderr_path = home / "stderr.log"
        self._stderr = open(self.stderr_path, "wb")
        self.started = time.monotonic()
        self.proc = subprocess.Popen([binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, env=env, cwd=str(home),
                                     preexec_fn=die_with_parent)
        self.raw_lines = []     # every stdout line, as bytes, without its b"\n"
        self.messages = []      # the ones that parsed
        self.trailing = b""     # bytes after the last newline, at EOF
        self._lock = threading.RLock()
        self._arrived = threading.Condition(self._lock)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        buf = b""
        while True:
            chunk = self.proc.stdout.read1(65536)
            if not chunk:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            with self._arrived:
                for line in lines:
                    self.raw_lines.append(line)
                    try:
                        self.messages.append(json.loads(line.decode("utf-8")))
                    except (UnicodeDecodeError, ValueError):
                        pass
                self._arrived.notify_all()
        with self._arrived:
            self.trailing = buf
            self._arrived.notify_all()

    # -- sending

    def send_raw(self, data):
        if isinstance(data, str):
            data = data.encode("utf-8")
        self.proc.stdin.write(data if data.endswith(b"\n") else data + b"\n")
        self.proc.stdin.flush()

    def send(self, msg):
        self.send_raw(json.dumps(msg))

    def notify(self, method, params=None):
        msg = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)

    def request(self, id_, method, params=None):
        msg = {"jsonrpc": "2.0", "id": id_, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        return self.reply(id_)

    # -- receiving

    def _replies(self, id_):
        return [m for m in self.messages
                if isinstance(m, dict) and "method" not in m and "id" in m
                and m["id"] == id_ and type(m["id"]) is type(id_)]

    def wait(self, pred, timeout=REPLY_TIMEOUT):
        deadline = time.monotonic() + timeout
        with self._arrived:
            while True:
                found = pred()
                if found:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._arrived.wait(left)

    def reply(self, id_, nth=0, timeout=REPLY_TIMEOUT):
        got = self.wait(lambda: len(self._replies(id_)) > nth and self._replies(id_)[nth], timeout)
        assert got, f"no reply to id {id_!r}; stdout so far:\n{self.stdout_text()}\nstderr:\n{self.stderr_text()}"
        return got

    def null_id_errors(self):
        with self._lock:
            return [m for m in self.messages if isinstance(m, dict) and "error" in m and m.get("id") is None]

    def ping(self, id_):
        r = self.request(id_, "ping")
        assert r.get("result") == {}, r
        return r

    # -- ending

    def close(self, timeout=EXIT_TIMEOUT):
        """Closes stdin; returns (exit code, seconds it took to exit)."""
        start = time.monotonic()
        self.proc.stdin.close()
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"kgate-mcp did not exit within {timeout} s of stdin EOF\nstderr:\n{self.stderr_text()}")
        took = time.monotonic() - start
        self._reader.join(timeout=5)
        return rc, took

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()

    def stdout_text(self):
        with self._lock:
            return "\n".join(line.decode("utf-8", "replace") for line in self.raw_lines)

    def stderr_text(self):
        self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")

    def assert_stdout_is_protocol(self):
        """Every stdout line is one JSON-RPC 2.0 object: a reply or a notification."""
        with self._lock:
            lines, trailing = list(self.raw_lines), self.trailing
        assert trailing == b"", f"stdout ended with a partial line: {trailing[:200]!r}"
        for line in lines:
            text = line.decode("utf-8")  # raises on anything but UTF-8
            msg = json.loads(text)
            assert isinstance(msg, dict), line
            assert msg.get("jsonrpc") == "2.0", line
            if "method" in msg:
                assert "id" not in msg, f"the server sent a request: {line!r}"
            else:
                assert "id" in msg and (("result" in msg) != ("error" in msg)), line


@pytest.fixture
def mcp(mcp_bin, tmp_path):
    started = []

    def start():
        p = Mcp(mcp_bin, tmp_path / f"mcp{len(started)}")
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()


def expect_error(reply, code, text=None):
    assert "error" in reply and "result" not in reply, reply
    assert reply["error"]["code"] == code, reply
    assert isinstance(reply["error"]["message"], str) and reply["error"]["message"], reply
    if text is not None:
        assert text in reply["error"]["message"], reply


def modern_meta(version=MODERN, capabilities=True):
    meta = {"io.modelcontextprotocol/protocolVersion": version,
            "io.modelcontextprotocol/clientInfo": {"name": "transcript-test", "version": "1"}}
    if capabilities:
        meta["io.modelcontextprotocol/clientCapabilities"] = {}
    return meta


def initialize(p, version="2025-11-25"):
    r = p.request(0, "initialize", {"protocolVersion": version, "capabilities": {"roots": {}},
                                    "clientInfo": {"name": "transcript-test", "version": "1"}})
    p.notify("notifications/initialized")
    return r


# --------------------------------------------------------------------------
# The handshake and the tool list
# --------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["2025-11-25", "2025-06-18", "2025-03-26"])
def test_initialize_echoes_supported_versions(mcp, version):
    p = mcp()
    r = initialize(p, version)
    res = r["result"]
    assert res["protocolVersion"] == version
    assert res["serverInfo"]["name"] == "kgate-mcp"
    assert isinstance(res["serverInfo"]["version"], str) and res["serverInfo"]["version"]
    assert "tools" in res["capabilities"]
    p.ping(1)
    assert p.close()[0] == 0
    p.assert_stdout_is_protocol()


def test_initialize_with_an_unknown_version_gets_the_newest(mcp):
    p = mcp()
    assert initialize(p, "2099-01-01")["result"]["protocolVersion"] == "2025-11-25"
    assert p.close()[0] == 0


def test_tools_list(mcp):
    p = mcp()
    initialize(p)
    tools = p.request(1, "tools/list")["result"]["tools"]
    names = [t["name"] for t in tools]
    assert set(names) == TOOLS, names
    for t in tools:
        assert TOOL_NAME_RE.match(t["name"]), t["name"]
        assert isinstance(t.get("description"), str) and t["description"], t["name"]
        assert t["inputSchema"]["type"] == "object", t["name"]
        assert "outputSchema" not in t, f"{t['name']}: an outputSchema makes clients show images as text"
    # What the model reads first stays short (the details are in the README).
    for name in ("connect", "execute"):
        desc = next(t["description"] for t in tools if t["name"] == name)
        assert len(desc) <= 700, (name, len(desc))
    # The same order every time.
    assert [t["name"] for t in p.request(2, "tools/list")["result"]["tools"]] == names
    assert p.close()[0] == 0
    p.assert_stdout_is_protocol()


def test_requests_before_initialize_are_answered(mcp):
    """Requests before initialize are served (Claude Code and the inspector differ here)."""
    p = mcp()
    p.ping("early-ping")
    tools = p.request("early-list", "tools/list")["result"]["tools"]
    assert {t["name"] for t in tools} == TOOLS
    expect_error(p.request("early-call", "tools/call", {"name": "no_such_tool", "arguments": {}}),
                 INVALID_PARAMS, "Unknown tool: no_such_tool")
    initialize(p)
    p.ping("after")
    assert p.close()[0] == 0
    p.assert_stdout_is_protocol()


# --------------------------------------------------------------------------
# Malformed input: the right error, and the server goes on
# --------------------------------------------------------------------------

MALFORMED_LINES = [
    b"this is not json",
    b"{",
    b'{"jsonrpc":"2.0","id":1,"method":"ping"',
    b'{"jsonrpc":"2.0","id":1,"method":"ping"} and more',
    b"{'jsonrpc':'2.0'}",
    b'"\xff\xfe"',                       # not UTF-8
    b'{"jsonrpc":"2.0","id":1,"method":"p\xc3"}',
    b"\x00\x01\x02",
    b"[" * 100000 + b"]" * 100000,        # nested far too deep
]


def test_malformed_lines_get_parse_errors(mcp):
    p = mcp()
    initialize(p)
    for i, line in enumerate(MALFORMED_LINES):
        before = len(p.null_id_errors())
        p.send_raw(line)
        got = p.wait(lambda: len(p.null_id_errors()) > before and p.null_id_errors()[before])
        assert got, f"no error for {line[:60]!r}; stderr:\n{p.stderr_text()}"
        expect_error(got, PARSE_ERROR)
        assert got["id"] is None
        p.ping(f"alive-{i}")
    assert p.close()[0] == 0
    p.assert_stdout_is_protocol()


def test_blank_lines_are_skipped(mcp):
    p = mcp()
    p.send_raw(b"\n\n   \n\t\r\n")
    p.ping(1)
    assert len(p.messages) == 1, p.stdout_text()
    assert p.close()[0] == 0


INVALID_REQUESTS = [
    (b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]', "batches are not supported"),
    (b"[]", "batches are not supported"),
    (b"42", None),
    (b"null", None),
    (b'{"jsonrpc":"2.0","id":true,"method":"ping"}', "id"),
    (b'{"jsonrpc":"2.0","id":null,"method":"ping"}', "id"),
    (b'{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}', "id"),
    (b'{"jsonrpc":"2.0","method":42}', "method"),
]


def test_invalid_requests_get_invalid_request(mcp):
    p = mcp()
    initialize(p)
    for i, (line, text) in enumerate(INVALID_REQUESTS):
        before = len(p.null_id_errors())
        p.send_raw(line)
        got = p.wait(lambda: len(p.null_id_errors()) > before and p.null_id_errors()[before])
        assert got, f"no error for {line!r}"
        expect_error(got, INVALID_REQUEST, text)
        p.ping(f"alive-{i}")
    # Errors that can name the request's id do.
    p.send({"id": "no-version", "method": "ping"})
    expect_error(p.reply("no-version"), INVALID_REQUEST, "jsonrpc")
    p.send({"jsonrpc": "1.0", "id": "old-version", "method": "ping"})
    expect_error(p.reply("old-version"), INVALID_REQUEST, "jsonrpc")
    p.send({"jsonrpc": "2.0", "id": "no-method"})
    expect_error(p.reply("no-method"), INVALID_REQUEST, "method")
    p.ping("end")
    assert p.close()[0] == 0
    p.assert_stdout_is_protocol()


def test_unknown_methods(mcp):
    p = mcp()
    initialize(p)
    for i, method in enumerate(["resources/list", "prompts/list", "completion/complete", "tools/execute",
                                "sampling/createMessage"]):
        expect_error(p.request(f"m{i}", method, {}), METHOD_NOT_FOUND, method)
    p.ping("alive")
    assert p.close()[0] == 0
    p.assert_stdout_is_protocol()


def test_bad_params(mcp):
    p = mcp()
    initialize(p)
    expect_error(p.request("array-params", "tools/list", [1, 2]), INVALID_PARAMS, "params")
    expect_error(p.request("string-params", "ping", "x"), INVALID_PARAMS, "params")
    expect_error(p.request("no-name", "tools/call", {"arguments": {}}), INVALID_PARAMS, "name")
    expect_error(p.request("number-name", "tools/call", {"name": 7}), INVALID_PARAMS, "name")
    expect_error(p.request("array-args", "tools/call", {"name": "execute", "arguments": ["1+1"]}),
                 INVALID_PARAMS, "arguments")
    expect_error(p.request("string-args", "tools/call", {"name": "execute", "arguments": "1+1"}),
                 INVALID_PARAMS, "arguments")
    r = p.request("unknown-tool", "tools/call", {"name": "no_such_tool", "arguments": {}})
    expect_error(r, INVALID_PARAMS)
    assert r["error"]["message"] == "Unknown tool: no_such_tool"
    expect_error(p.request("bad-init", "initialize", {"protocolVersion": 20251125}), INVALID_PARAMS)
    p.ping("alive")
    assert p.close()[0] == 0
    p.assert_stdout_is_protocol()


def test_notifications_get_no_reply(mcp):
    p = mcp()
    initialize(p)
    p.notify("notifications/initialized")
    p.notify("notifications/roots/list_changed")
    p.notify("notifications/no_such_thing", {"x": 1})
    p.notify("notifications/cancelled", {"requestId": "never-sent"})
    p.notify("notifications/cancelled", {})
    p.send({"jsonrpc": "2.0", "id": "r", "result": {}})  # a response to nothing: ignored
    p.ping("alive")
    assert len(p.messages) == 2, p.stdout_text()  # initialize and the ping
    assert p.close()[0] == 0
    p.assert_stdout_is_protocol()


# --------------------------------------------------------------------------
# The modern era (2026-07-28)
# --------------------------------------------------------------------------

def test_server_discover(mcp):
    p = mcp()
    r = p.request("server-discover-probe-1", "server/discover", {"_meta": modern_meta()})
    res = r["result"]
    assert res["resultType"] == "complete"
    assert MODERN in res["supportedVersions"] and "2025-11-25" in res["supportedVersions"]
    assert "tools" in res["capabilities"]
    assert res["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "kgate-mcp"
    assert isinstance(res["ttlMs"], int) and res["ttlMs"] >= 0
    assert res["cacheScope"] in ("public", "private")
    # Short instructions, in both eras: when to use the kernel tools (Claude Code defers them).
    text = res["instructions"]
    assert 0 < len(text) <= 600 and "execute" in text and "poll_job" in text, text
    # A dual-era client may go on with initialize on the same process.
    init = initialize(p)["result"]
    assert init["protocolVersion"] == "2025-11-25"
    assert init["instructions"] == text
    assert p.close()[0] == 0
    p.assert_stdout_is_protocol()


def test_modern_requests(mcp):
    p = mcp()
    res = p.request(1, "tools/list", {"_meta": modern_meta()})["result"]
    assert res["resultType"] == "complete"
    assert {t["name"] for t in res["tools"]} == TOOLS
    assert isinstance(res["ttlMs"], int) and res["cacheScope"] in ("public", "private")
    assert res["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "kgate-mcp"

    r = p.request(2, "tools/list", {"_meta": modern_meta("2099-12-31")})
    expect_error(r, UNSUPPORTED_PROTOCOL_VERSION)
    assert r["error"]["data"]["requested"] == "2099-12-31"
    assert MODERN in r["error"]["data"]["supported"]
    expect_error(p.request(3, "tools/list", {"_meta": modern_meta(capabilities=False)}), INVALID_PARAMS,
                 "clientCapabilities")
    r = p.request(4, "tools/call", {"name": "no_such_tool", "arguments": {}, "_meta": modern_meta()})
    expect_error(r, INVALID_PARAMS, "Unknown tool: no_such_tool")
    p.ping("alive")
    assert p.close()[0] == 0
    p.assert_stdout_is_protocol()


# --------------------------------------------------------------------------
# EOF
# --------------------------------------------------------------------------

def test_eof_at_once_exits_zero(mcp):
    p = mcp()
    rc, took = p.close()
    assert rc == 0, p.stderr_text()
    assert took < EXIT_TIMEOUT
    assert p.raw_lines == [] and p.trailing == b""


def test_eof_after_a_session_exits_zero(mcp):
    p = mcp()
    initialize(p)
    p.request(1, "tools/list")
    p.send_raw(b"garbage")
    p.send_raw(b'{"jsonrpc":"2.0","id":2,"method":"ping"}')  # then EOF with no wait for the reply
    rc, took = p.close()
    assert rc == 0, p.stderr_text()
    assert took < EXIT_TIMEOUT
    assert p.reply(2, timeout=0)["result"] == {}   # sent before the exit
    p.assert_stdout_is_protocol()


def test_eof_in_the_middle_of_a_line(mcp):
    p = mcp()
    p.proc.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"pi')
    p.proc.stdin.flush()
    rc, took = p.close()
    assert rc == 0 and took < EXIT_TIMEOUT
    # The unfinished line is a message of its own, and a malformed one.
    assert len(p.messages) == 1
    expect_error(p.messages[0], PARSE_ERROR)
    p.assert_stdout_is_protocol()


def test_a_long_transcript(mcp):
    """Garbage and good requests interleaved; every request is answered once, in order."""
    p = mcp()
    initialize(p)
    expected = []
    for i in range(300):
        if i % 3 == 0:
            p.send_raw(f"garbage {i} {{".encode())
        elif i % 3 == 1:
            p.send({"jsonrpc": "2.0", "id": i, "method": "no/such/method"})
            expected.append((i, METHOD_NOT_FOUND))
        else:
            p.send({"jsonrpc": "2.0", "id": i, "method": "ping"})
            expected.append((i, None))
    p.ping("end")
    for id_, code in expected:
        [r] = p._replies(id_)
        if code is None:
            assert r["result"] == {}
        else:
            expect_error(r, code)
    assert len(p.null_id_errors()) == 100
    assert p.close()[0] == 0
    p.assert_stdout_is_protocol()
