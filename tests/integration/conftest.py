"""Fixtures and helpers for the kgate black-box integration suite.

Run with Debian's interpreter (it has ipykernel, jupyter_client, jupyter_server,
websocket-client and pyzmq):

    KGATE_BIN=build/gateway/kgate /usr/bin/python3 -m pytest -q tests/integration

Every daemon gets an isolated Jupyter environment (runtime/data/path dirs under a
temporary directory) with a single test kernelspec "python3".
"""

import datetime
import http.client
import json
import os
import re
import signal
import socket
import struct
import subprocess
import threading
import time
import uuid
import zlib
from pathlib import Path
from urllib.parse import quote

import pytest

try:
    import websocket  # python3-websocket
    import jupyter_client  # noqa: F401
except ImportError as exc:  # pragma: no cover
    raise ImportError(f"{exc}: run this suite with /usr/bin/python3 (Debian's interpreter has "
                      "websocket-client, jupyter_client, ipykernel and jupyter_server)") from exc

PYTHON = "/usr/bin/python3"
V1_PROTOCOL = "v1.kernel.websocket.jupyter.org"
LISTEN_RE = re.compile(r"listening on http://([^\s/:]+|\[[^\]]+\]):(\d+)")
# The listening line names the file of kgate's own token (the default: no --token, no --no-token).
OWN_TOKEN_RE = re.compile(r"token kgate's own, in (\S+);")
MODEL_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
UUID4_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
STARTUP_TIMEOUT = 10.0
SHUTDOWN_TIMEOUT = 10.0
KERNEL_ARGV = [PYTHON, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
DISPLAY_NAME = "Python 3 (test)"


# --------------------------------------------------------------------------
# Small utilities
# --------------------------------------------------------------------------

def make_png(width=64, height=64):
    """A valid RGBA PNG with a deterministic gradient (not all-zero bytes)."""
    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    raw = bytearray()
    for y in range(height):
        raw.append(0)  # filter type: none
        for x in range(width):
            raw += bytes(((x * 4) & 0xFF, (y * 4) & 0xFF, ((x + y) * 2) & 0xFF, 0xFF))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(bytes(raw), 9)) + chunk(b"IEND", b""))


LOGO_PNG = make_png()


def die_with_parent(sig=signal.SIGTERM):
    """preexec_fn: signal the child when the test process dies (no orphans if pytest is
    killed, e.g. by a CTest timeout)."""
    import ctypes
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig))


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def utcnow_iso():
    return datetime.datetime.utcnow().strftime(MODEL_TIME_FORMAT)


def parse_model_time(value):
    """Parse a timestamp exactly like jupyter_server's GatewayClient does."""
    assert isinstance(value, str), f"timestamp is not a string: {value!r}"
    return datetime.datetime.strptime(value, MODEL_TIME_FORMAT)


def assert_kernel_model(model, kernel_id=None, name="python3"):
    assert isinstance(model, dict), f"kernel model is not an object: {model!r}"
    for key in ("id", "name", "last_activity", "execution_state", "connections"):
        assert key in model, f"kernel model lacks {key!r}: {model!r}"
    assert UUID4_RE.match(model["id"]), f"kernel id is not a dashed uuid4: {model['id']!r}"
    assert uuid.UUID(model["id"]).version == 4
    if kernel_id is not None:
        assert model["id"] == kernel_id, model
    if name is not None:
        assert model["name"] == name, model
    try:
        parse_model_time(model["last_activity"])
    except ValueError as exc:
        raise AssertionError(
            f"last_activity {model['last_activity']!r} does not match {MODEL_TIME_FORMAT}: {exc}")
    assert model["execution_state"] in (
        "starting", "idle", "busy", "restarting", "autorestarting", "dead", "unknown"), model
    assert isinstance(model["connections"], int) and not isinstance(model["connections"], bool), model


def pid_alive(pid):
    """True if pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # state is the field after the ")" that closes the command name
    state = stat[stat.rfind(")") + 2:].split()[0]
    return state not in ("Z", "X")


def runtime_files(kg):
    """The names in a daemon's runtime dir, without the warm pool's pool-<id>.json files and the
    .pool-<id>.json.<random>.tmp they are written through (the pool refills in the background:
    those come and go on their own) and without kgate's .kgate-owner-<id>.json files (one per
    kernel, pooled ones too, and the ..kgate-owner-<id>.json.<random>.tmp they are written through)
    and without the kernels' ipc sockets (<ip>-1 … -5, and -pipe, bound by the kernel a moment after
    it is ready: test_kernel_sockets.py checks them)."""
    ignored = ("pool-", ".pool-", ".kgate-owner-", "..kgate-owner-")
    return {n for n in os.listdir(kg.runtime_dir)
            if not n.startswith(ignored) and not re.search(r"-ipc-(\d+|pipe)$", n)}


def wait_until(pred, timeout, interval=0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def assert_interrupts_a_sleep(kg, kid, ws):
    """POST .../interrupt stops a running `time.sleep(60)` with KeyboardInterrupt, and the kernel
    runs the next cell (over the open KernelWS `ws`)."""
    pending = ws.execute_async("import time; time.sleep(60)", stop_on_error=False)
    time.sleep(1.0)
    status, _, _ = kg.rest("POST", f"/api/kernels/{kid}/interrupt")
    assert status == 204
    res = ws.collect(pending, timeout=20)
    assert res.status == "error" and res.error["ename"] == "KeyboardInterrupt", res
    assert ws.execute("1 + 1").status == "ok"


def children_of(pid):
    kids = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return kids
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.update(int(x) for x in f.read().split())
        except (FileNotFoundError, ProcessLookupError):
            pass
    return kids


def supervisors_of(root):
    """kgate-supervise processes (docs/dev/readoption.md) whose kernel's argv names a file under root."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        argv = cmdline_of(int(d))
        if argv and os.path.basename(argv[0]) == "kgate-supervise" and any(str(root) in a for a in argv):
            found.append(int(d))
    return found


def sweep_supervisors(root, timeout=10):
    """Stop the kernels a killed kgate left behind under root: SIGTERM to their supervisors,
    which stop their kernels and exit."""
    pids = supervisors_of(root)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    wait_until(lambda: not any(pid_alive(p) for p in pids), timeout)


def cmdline_of(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except (FileNotFoundError, ProcessLookupError):
        return []


class NotJSON:
    """Returned by rest() when a response body is not JSON."""

    def __init__(self, raw):
        self.raw = raw

    def __repr__(self):
        return f"NotJSON({self.raw[:300]!r})"


# --------------------------------------------------------------------------
# Jupyter message framing
# --------------------------------------------------------------------------

def new_header(msg_type, session, msg_id=None):
    return {
        "msg_id": msg_id or uuid.uuid4().hex,
        "msg_type": msg_type,
        "session": session,
        "username": "kgate-test",
        "version": "5.3",
        "date": datetime.datetime.utcnow().isoformat() + "Z",
    }


def encode_legacy_binary(msg, buffers):
    """Legacy jupyter_server binary frame: u32be nbufs, nbufs u32be offsets, JSON, buffers."""
    msg = {k: v for k, v in msg.items() if k != "buffers"}
    parts = [json.dumps(msg).encode("utf-8")] + [bytes(b) for b in buffers]
    nbufs = len(parts)
    offsets = [4 * (nbufs + 1)]
    for part in parts[:-1]:
        offsets.append(offsets[-1] + len(part))
    return struct.pack("!%dI" % (nbufs + 1), nbufs, *offsets) + b"".join(parts)


def decode_legacy_binary(data):
    assert len(data) >= 8, f"legacy binary frame too short: {data!r}"
    (nbufs,) = struct.unpack_from("!I", data, 0)
    assert 1 <= nbufs < 10000, f"implausible nbufs {nbufs} in legacy binary frame"
    offsets = list(struct.unpack_from("!%dI" % nbufs, data, 4))
    assert offsets[0] == 4 * (nbufs + 1), f"first offset {offsets[0]} != {4 * (nbufs + 1)}"
    assert offsets == sorted(offsets) and offsets[-1] <= len(data), offsets
    bounds = offsets + [len(data)]
    parts = [data[bounds[i]:bounds[i + 1]] for i in range(nbufs)]
    msg = json.loads(parts[0].decode("utf-8"))
    msg["buffers"] = parts[1:]
    return msg


def encode_v1(channel, header, parent_header, metadata, content, buffers=()):
    segments = [channel.encode("utf-8")] + [
        json.dumps(x).encode("utf-8") for x in (header, parent_header, metadata, content)
    ] + [bytes(b) for b in buffers]
    n_offsets = len(segments) + 1
    offsets = [8 * (1 + n_offsets)]
    for seg in segments:
        offsets.append(offsets[-1] + len(seg))
    return struct.pack("<%dQ" % (n_offsets + 1), n_offsets, *offsets) + b"".join(segments)


def decode_v1(data):
    assert len(data) >= 8, f"v1 frame too short: {data!r}"
    (n_offsets,) = struct.unpack_from("<Q", data, 0)
    assert 6 <= n_offsets < 10000, f"implausible v1 offset_number {n_offsets}"
    offsets = list(struct.unpack_from("<%dQ" % n_offsets, data, 8))
    assert offsets[0] == 8 * (n_offsets + 1), f"v1 first offset {offsets[0]} != {8 * (n_offsets + 1)}"
    assert offsets == sorted(offsets), f"v1 offsets not monotonic: {offsets}"
    assert offsets[-1] == len(data), f"v1 last offset {offsets[-1]} != frame length {len(data)}"
    segs = [data[offsets[i]:offsets[i + 1]] for i in range(n_offsets - 1)]
    channel = segs[0].decode("utf-8")
    header, parent, metadata, content = (json.loads(s.decode("utf-8")) for s in segs[1:5])
    return {
        "channel": channel,
        "header": header,
        "parent_header": parent,
        "metadata": metadata,
        "content": content,
        "buffers": segs[5:],
        "msg_id": header.get("msg_id"),
        "msg_type": header.get("msg_type"),
    }


# --------------------------------------------------------------------------
# Websocket client
# --------------------------------------------------------------------------

class WSClosed(Exception):
    pass


class ExecResult:
    def __init__(self, msg_id):
        self.msg_id = msg_id
        self.reply = None          # full execute_reply message
        self.iopub = []            # iopub messages with this parent, in order
        self.other = []            # non-iopub, non-reply messages with this parent
        self.stdout = ""
        self.stderr = ""
        self.error = None          # content of the iopub "error" message
        self.results = []          # execute_result / display_data contents
        self.saw_idle = False

    @property
    def status(self):
        return self.reply["content"]["status"] if self.reply else None

    def add(self, msg):
        ch, mt, content = msg.get("channel"), msg.get("msg_type"), msg.get("content", {})
        if ch == "shell" and mt == "execute_reply":
            self.reply = msg
        elif ch == "iopub":
            self.iopub.append(msg)
            if mt == "stream":
                if content.get("name") == "stdout":
                    self.stdout += content.get("text", "")
                else:
                    self.stderr += content.get("text", "")
            elif mt == "error":
                self.error = content
            elif mt in ("execute_result", "display_data"):
                self.results.append(content)
            elif mt == "status" and content.get("execution_state") == "idle":
                self.saw_idle = True
        else:
            self.other.append(msg)

    @property
    def done(self):
        return self.reply is not None and self.saw_idle

    def __repr__(self):
        return (f"ExecResult(status={self.status!r}, stdout={self.stdout[-500:]!r}, "
                f"stderr={self.stderr[-500:]!r}, error={self.error!r}, "
                f"iopub_types={[m.get('msg_type') for m in self.iopub]})")


class KernelWS:
    """A minimal Jupyter websocket client (legacy JSON / legacy binary / v1)."""

    def __init__(self, url, session_id=None, subprotocols=None, headers=None, origin=None,
                 suppress_origin=False, timeout=15, host=None):
        self.url = url
        self.session = session_id or uuid.uuid4().hex
        kwargs = {}
        if subprotocols:
            kwargs["subprotocols"] = list(subprotocols)
        if headers:
            kwargs["header"] = headers
        if origin:
            kwargs["origin"] = origin
        if suppress_origin:
            kwargs["suppress_origin"] = True
        if host:
            kwargs["host"] = host
        self.ws = websocket.create_connection(url, timeout=timeout, **kwargs)
        self.subprotocol = self.ws.getsubprotocol()
        self.v1 = self.subprotocol == V1_PROTOCOL
        self.backlog = []
        self.received = []       # every decoded message, in arrival order
        self.frame_log = []      # (opcode, length) of every data frame received
        self.closed = False

    # ---- sending -----------------------------------------------------------------

    def make_msg(self, msg_type, content, channel="shell", metadata=None, msg_id=None):
        return {
            "header": new_header(msg_type, self.session, msg_id),
            "parent_header": {},
            "metadata": metadata or {},
            "content": content,
            "channel": channel,
        }

    def send_msg(self, msg, buffers=None, binary_opcode=None):
        """Send a message dict. With buffers (legacy) a binary frame is used; binary_opcode
        overrides the websocket opcode used for a legacy binary frame."""
        if self.v1:
            frame = encode_v1(msg["channel"], msg["header"], msg["parent_header"],
                              msg["metadata"], msg["content"], buffers or ())
            self.ws.send(frame, opcode=websocket.ABNF.OPCODE_BINARY)
        elif buffers:
            frame = encode_legacy_binary(msg, buffers)
            self.ws.send(frame, opcode=binary_opcode or websocket.ABNF.OPCODE_BINARY)
        else:
            self.ws.send(json.dumps(msg))
        return msg["header"]["msg_id"]

    def request(self, msg_type, content=None, channel="shell", buffers=None, binary_opcode=None):
        msg = self.make_msg(msg_type, content or {}, channel)
        return self.send_msg(msg, buffers=buffers, binary_opcode=binary_opcode)

    # ---- receiving ---------------------------------------------------------------

    def _decode(self, opcode, data):
        self.frame_log.append((opcode, len(data)))
        if self.v1:
            assert opcode == websocket.ABNF.OPCODE_BINARY, (
                f"v1 protocol selected but server sent a non-binary frame (opcode {opcode}): {data[:200]!r}")
            msg = decode_v1(data)
        elif opcode == websocket.ABNF.OPCODE_TEXT:
            text = data.decode("utf-8") if isinstance(data, bytes) else data
            msg = json.loads(text)
            msg.setdefault("buffers", [])
        else:
            msg = decode_legacy_binary(data)
        msg["_opcode"] = opcode
        self.received.append(msg)
        return msg

    def _recv_frame(self, timeout):
        """Next data frame within timeout seconds. Control frames (pings are answered by
        websocket-client) are skipped without extending the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            self.ws.settimeout(max(remaining, 0.001))
            try:
                opcode, data = self.ws.recv_data(control_frame=True)
            except (websocket.WebSocketTimeoutException, socket.timeout):
                raise TimeoutError
            except (websocket.WebSocketConnectionClosedException, ConnectionError, OSError) as exc:
                self.closed = True
                raise WSClosed(str(exc))
            if opcode == websocket.ABNF.OPCODE_CLOSE:
                self.closed = True
                raise WSClosed(f"server closed the websocket: {data!r}")
            if opcode in (websocket.ABNF.OPCODE_PING, websocket.ABNF.OPCODE_PONG):
                continue
            return opcode, data

    def recv(self, timeout=10):
        """Next message (from the backlog first). Raises TimeoutError / WSClosed."""
        if self.backlog:
            return self.backlog.pop(0)
        opcode, data = self._recv_frame(timeout)
        return self._decode(opcode, data)

    def wait_for(self, pred, timeout=10, what="message"):
        """Return the first message (backlog first) matching pred; others go to the backlog."""
        for i, msg in enumerate(self.backlog):
            if pred(msg):
                return self.backlog.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"timed out after {timeout}s waiting for {what}; received so far: "
                    f"{[(m.get('channel'), m.get('msg_type'), m.get('content', {}).get('execution_state')) for m in self.received[-30:]]}")
            try:
                opcode, data = self._recv_frame(remaining)
            except TimeoutError:
                continue
            msg = self._decode(opcode, data)
            if pred(msg):
                return msg
            self.backlog.append(msg)

    def wait_reply(self, msg_id, msg_type=None, timeout=15, channel=None):
        def pred(m):
            return (m.get("parent_header", {}).get("msg_id") == msg_id
                    and m.get("channel") != "iopub"
                    and (msg_type is None or m.get("msg_type") == msg_type)
                    and (channel is None or m.get("channel") == channel))
        return self.wait_for(pred, timeout, what=f"reply {msg_type or ''} to {msg_id}")

    def drain(self, duration):
        """Collect every message arriving within duration seconds (and the backlog)."""
        out = list(self.backlog)
        self.backlog.clear()
        deadline = time.monotonic() + duration
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return out
            try:
                out.append(self._decode(*self._recv_frame(remaining)))
            except TimeoutError:
                return out

    def collect(self, result, timeout=30):
        """Feed messages whose parent is result.msg_id into result until it is done."""
        deadline = time.monotonic() + timeout
        while not result.done:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"execution did not finish within {timeout}s: {result!r}")
            msg = self.wait_for(lambda m: m.get("parent_header", {}).get("msg_id") == result.msg_id,
                                remaining, what=f"messages for execute {result.msg_id}")
            result.add(msg)
        return result

    def execute_async(self, code, allow_stdin=False, silent=False, stop_on_error=True):
        """Send an execute_request. Use stop_on_error=False for a cell expected to fail:
        otherwise ipykernel aborts requests that arrive shortly after the error."""
        msg_id = self.request("execute_request", {
            "code": code, "silent": silent, "store_history": not silent,
            "user_expressions": {}, "allow_stdin": allow_stdin, "stop_on_error": stop_on_error,
        })
        return ExecResult(msg_id)

    def execute(self, code, timeout=30, allow_stdin=False, stop_on_error=True):
        """Run code; returns ExecResult once execute_reply AND iopub idle arrived."""
        return self.collect(self.execute_async(code, allow_stdin=allow_stdin,
                                               stop_on_error=stop_on_error), timeout)

    def run(self, code, timeout=30):
        """execute() and assert success; returns stdout."""
        r = self.execute(code, timeout)
        assert r.status == "ok", f"cell failed: {code!r} -> {r!r}"
        return r.stdout

    # ---- closing ---------------------------------------------------------------

    def close_collecting(self, timeout=5):
        """Client-initiated close handshake that keeps the data frames the server sent
        before it answered our close frame (websocket-client's close() discards them).
        Returns the list of decoded messages received during the handshake."""
        got = []
        if self.closed:
            return got
        try:
            self.ws.send(struct.pack("!H", websocket.STATUS_NORMAL), websocket.ABNF.OPCODE_CLOSE)
        except (OSError, websocket.WebSocketException):
            self.closed = True
            return got
        deadline = time.monotonic() + timeout
        cont = self.ws.cont_frame
        try:
            while time.monotonic() < deadline:
                self.ws.settimeout(max(deadline - time.monotonic(), 0.01))
                try:
                    frame = self.ws.recv_frame()
                except (websocket.WebSocketTimeoutException, socket.timeout):
                    break
                if frame.opcode == websocket.ABNF.OPCODE_CLOSE:
                    break
                if frame.opcode in (websocket.ABNF.OPCODE_TEXT, websocket.ABNF.OPCODE_BINARY,
                                    websocket.ABNF.OPCODE_CONT):
                    cont.validate(frame)
                    cont.add(frame)
                    if cont.is_fire(frame):
                        opcode, fr = cont.extract(frame)
                        got.append(self._decode(opcode, fr.data))
        except (websocket.WebSocketConnectionClosedException, ConnectionError, OSError):
            pass
        finally:
            self.closed = True
            try:
                self.ws.shutdown()
            except Exception:
                pass
        return got

    def close(self):
        if not self.closed:
            self.closed = True
            try:
                self.ws.close(timeout=2)
            except Exception:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --------------------------------------------------------------------------
# The daemon under test
# --------------------------------------------------------------------------

_LIVE_DAEMONS = []


def make_jupyter_env(root):
    """Create the isolated Jupyter dirs + test kernelspec under root; return env dict."""
    root = Path(root)
    runtime = root / "runtime"
    data = root / "data"
    share = root / "share"
    spec_dir = share / "kernels" / "python3"
    for d in (runtime, data, spec_dir):
        d.mkdir(parents=True, exist_ok=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": KERNEL_ARGV,
        "display_name": DISPLAY_NAME,
        "language": "python",
    }, indent=1))
    (spec_dir / "logo-64x64.png").write_bytes(LOGO_PNG)
    # Files a path traversal would reach; their contents must never be served.
    (share / "kernels" / "secret.txt").write_text("KGATE-TRAVERSAL-SECRET-1\n")
    (share / "secret.txt").write_text("KGATE-TRAVERSAL-SECRET-2\n")
    (root / "secret.txt").write_text("KGATE-TRAVERSAL-SECRET-3\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JUPYTER_", "KERNEL_", "PYTHON", "KGATE_"))}
    env.update({
        "JUPYTER_RUNTIME_DIR": str(runtime),
        "JUPYTER_DATA_DIR": str(data),
        "JUPYTER_PATH": str(share),
        "HOME": os.environ.get("HOME", str(root)),
        # kgate's state directory is held by one kgate at a time: each daemon gets its own
        "XDG_STATE_HOME": str(root / "state"),
    })
    return env


class Kgate:
    LISTEN_PATTERN = LISTEN_RE

    def __init__(self, binary, root, token=None, ip="127.0.0.1", extra_args=(), config=None, port=0):
        """token=None: kgate's own token (read from the listening line's file once it listens);
        extra_args=["--no-token"] for none."""
        self.binary = binary
        self.root = Path(root)
        self.token = token
        self.own_token_file = None
        self.ip = ip
        self.env = make_jupyter_env(self.root)
        self.runtime_dir = self.root / "runtime"
        self.spec_dir = self.root / "share" / "kernels" / "python3"
        self.args = [binary, "serve", "--ip", ip, "--port", str(port)]
        if token is not None:
            self.args += ["--token", token]
        if config is not None:
            self.args += ["--config", str(config)]
        self.args += list(extra_args)
        self.proc = None
        self.port = None
        self.url = None
        self.host = "127.0.0.1"
        self.log_lines = []
        self._log_lock = threading.Lock()
        self._listening = threading.Event()
        self._kernels = set()

    # ---- process ----------------------------------------------------------------

    def _reader(self, stream, tag):
        with open(self.root / f"kgate-{tag}.log", "ab") as keep:  # kept for post-mortems
            for raw in iter(stream.readline, b""):
                keep.write(raw)
                keep.flush()
                self._line(raw, tag)
        stream.close()

    def _line(self, raw, tag):
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        with self._log_lock:
            self.log_lines.append(f"[{tag}] {line}")
        # A kgate on its own token: self.token is read from the file its listening line names
        # (before the line counts as started), so the helpers send it.
        t = OWN_TOKEN_RE.search(line)
        if t and self.token is None:
            self.own_token_file = Path(t.group(1))
            self.token = self.own_token_file.read_text().strip()
        self._on_line(line)

    def _on_line(self, line):
        """Started once the listener's line is logged (subclasses: other listeners)."""
        m = self.LISTEN_PATTERN.search(line)
        if m and self.port is None:
            self.port = int(m.group(2))
            self._listening.set()

    def start(self, timeout=STARTUP_TIMEOUT):
        self.proc = subprocess.Popen(self.args, env=self.env, cwd=str(self.root),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, preexec_fn=die_with_parent)
        for stream, tag in ((self.proc.stdout, "out"), (self.proc.stderr, "err")):
            threading.Thread(target=self._reader, args=(stream, tag), daemon=True).start()
        deadline = time.monotonic() + timeout
        while not self._listening.wait(0.05):
            if self.proc.poll() is not None:
                time.sleep(0.2)  # let the reader threads finish
                raise AssertionError(
                    f"kgate exited with code {self.proc.returncode} before listening; "
                    f"cmd={self.args}\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(
                    f"kgate did not log 'listening on http://HOST:PORT' within {timeout}s; "
                    f"cmd={self.args}\n{self.log_tail()}")
        self.url = f"http://{self.host}:{self.port}"
        self.ws_base = f"ws://{self.host}:{self.port}"
        _LIVE_DAEMONS.append(self)
        return self

    def log_tail(self, n=80):
        with self._log_lock:
            lines = self.log_lines[-n:]
        return "kgate log (last %d lines):\n%s" % (len(lines), "\n".join(lines))

    def stop(self, timeout=SHUTDOWN_TIMEOUT, sig=signal.SIGTERM, sweep=True):
        """Signal (SIGTERM: the kernels stay for the next kgate; SIGINT: they stop too) and
        wait; returns the exit code. Raises AssertionError (after SIGKILL) if the daemon does not
        exit within timeout.  With `sweep`, kernels that outlive it (SIGTERM, or kill -9: they
        wait orphan_timeout_seconds to be re-adopted) are then stopped through their
        supervisors, unless another live kgate of this root may hold them."""
        if self in _LIVE_DAEMONS:
            _LIVE_DAEMONS.remove(self)
        try:
            return self._stop(timeout, sig)
        finally:
            if sweep and not any(d.root == self.root and d.proc is not None and d.proc.poll() is None
                                 for d in _LIVE_DAEMONS):
                sweep_supervisors(self.root)

    def _stop(self, timeout, sig):
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        kids = self.children()
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            for pid in kids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            raise AssertionError(f"kgate did not exit within {timeout}s of SIGTERM\n{self.log_tail()}")

    def children(self):
        """kgate's kernel processes: its children, and for a kernel under kgate-supervise
        (docs/dev/readoption.md) the supervisor's children instead of the supervisor."""
        out = set()
        for pid, kids in self.supervised().items():
            out |= {pid} if kids is None else kids
        return out

    def supervised(self):
        """{child of kgate: its children if it is a kgate-supervise, else None}."""
        out = {}
        for pid in (children_of(self.proc.pid) if self.proc else set()):
            argv = cmdline_of(pid)
            sup = bool(argv) and os.path.basename(argv[0]) == "kgate-supervise"
            out[pid] = children_of(pid) if sup else None
        return out

    def kernel_pid(self, kernel_id, timeout=5):
        """pid of the kernel process: a child of kgate whose argv names its connection file
        (pool-<id>.json for a kernel handed out by the warm pool: the file was renamed after)."""
        needle = f"kernel-{kernel_id}.json"
        needles = (needle, f"pool-{kernel_id}.json")

        def find():
            for pid in self.children():
                if any(n in arg for arg in cmdline_of(pid) for n in needles):
                    return pid
            return None

        pid = wait_until(find, timeout)
        assert pid, (f"no child of kgate (pid {self.proc.pid}) has {needle} in its argv; "
                     f"children: {[(p, cmdline_of(p)) for p in self.children()]}")
        return pid

    # ---- HTTP -------------------------------------------------------------------

    def http(self, method, path, body=None, headers=None, auth=True, timeout=60):
        """Raw request; returns (status, headers, body_bytes). path is sent verbatim."""
        hdrs = dict(headers or {})
        if auth and self.token and not any(k.lower() == "authorization" for k in hdrs):
            hdrs["Authorization"] = f"token {self.token}"
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode("utf-8")
            if not any(k.lower() == "content-type" for k in hdrs):
                hdrs["Content-Type"] = "application/json"
        elif isinstance(body, str):
            body = body.encode("utf-8")
        conn = self._connection(timeout)
        try:
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.headers, data
        finally:
            conn.close()

    def _connection(self, timeout):
        """The HTTP connection http() uses (subclasses: https, a Unix socket)."""
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def rest(self, method, path, body=None, headers=None, auth=True, timeout=60):
        """JSON request; returns (status, headers, json_or_None). A non-JSON body comes
        back as a NotJSON object."""
        status, hdrs, data = self.http(method, path, body, headers, auth, timeout)
        if not data:
            return status, hdrs, None
        try:
            return status, hdrs, json.loads(data)
        except ValueError:
            return status, hdrs, NotJSON(data)

    # ---- kernels ----------------------------------------------------------------

    def start_kernel(self, body=None, timeout=60):
        if body is None:
            body = {"name": "python3"}
        status, hdrs, model = self.rest("POST", "/api/kernels", body, timeout=timeout)
        assert status == 201, f"POST /api/kernels {body!r} -> {status} {model!r}\n{self.log_tail()}"
        assert_kernel_model(model, name=None)
        self._kernels.add(model["id"])
        return model

    def delete_kernel(self, kernel_id, check=True):
        status, _, body = self.rest("DELETE", f"/api/kernels/{kernel_id}")
        self._kernels.discard(kernel_id)
        if check:
            assert status == 204, f"DELETE /api/kernels/{kernel_id} -> {status} {body!r}"
        return status

    def kernel_model(self, kernel_id):
        status, _, model = self.rest("GET", f"/api/kernels/{kernel_id}")
        assert status == 200, f"GET /api/kernels/{kernel_id} -> {status} {model!r}"
        return model

    def connection_file(self, kernel_id):
        return self.runtime_dir / f"kernel-{kernel_id}.json"

    def ws_url(self, kernel_id, session_id=None, token=None):
        url = f"{self.ws_base}/api/kernels/{kernel_id}/channels"
        query = []
        if session_id:
            query.append(f"session_id={quote(session_id)}")
        if token:
            query.append(f"token={quote(token)}")
        return url + ("?" + "&".join(query) if query else "")

    def connect(self, kernel_id, session_id=None, subprotocols=None, use_token=True, **kw):
        """Open a websocket to the kernel. With a token daemon the token goes in the query."""
        token = self.token if (use_token and self.token) else None
        return KernelWS(self.ws_url(kernel_id, session_id, token), session_id=session_id,
                        subprotocols=subprotocols, **kw)

    def cleanup_kernels(self):
        for kid in list(self._kernels):
            try:
                self.delete_kernel(kid, check=False)
            except Exception:
                pass


# --------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------

@pytest.fixture(scope="session")
def kgate_bin():
    binary = os.environ.get("KGATE_BIN")
    if not binary:
        pytest.fail("KGATE_BIN is not set. Run the suite as "
                    "`KGATE_BIN=/path/to/kgate /usr/bin/python3 -m pytest -q tests/integration`.",
                    pytrace=False)
    binary = os.path.abspath(binary)
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        pytest.fail(f"KGATE_BIN={binary} is not an executable file.", pytrace=False)
    return binary


@pytest.fixture(scope="session")
def logo_png():
    return LOGO_PNG


@pytest.fixture
def kgate_factory(kgate_bin, tmp_path_factory):
    """Start extra daemons inside one test: kgate_factory(token=..., ip=..., extra_args=...)."""
    started = []

    def factory(**kwargs):
        kg = Kgate(kgate_bin, tmp_path_factory.mktemp("kgate"), **kwargs)
        started.append(kg)
        return kg.start()

    yield factory
    errors = []
    for kg in started:
        try:
            kg.stop()
        except AssertionError as exc:
            errors.append(str(exc))
    assert not errors, "\n".join(errors)


def _module_daemon(kgate_bin, tmp_path_factory, **kwargs):
    kg = Kgate(kgate_bin, tmp_path_factory.mktemp("kgate"), **kwargs).start()
    try:
        yield kg
    finally:
        kg.cleanup_kernels()
        kg.stop()


@pytest.fixture(scope="module")
def kgate(kgate_bin, tmp_path_factory):
    """A module-scoped daemon on its own token (kgate.token: the helpers send it)."""
    yield from _module_daemon(kgate_bin, tmp_path_factory)


@pytest.fixture(scope="module")
def shared_kernel(kgate):
    """One kernel on the module daemon, shared by tests that don't disturb it."""
    model = kgate.start_kernel()
    yield model["id"]
    kgate.delete_kernel(model["id"], check=False)


@pytest.fixture
def kernel(kgate):
    """A fresh kernel for one test on the module daemon."""
    model = kgate.start_kernel()
    yield model["id"]
    if model["id"] in kgate._kernels:
        kgate.delete_kernel(model["id"], check=False)


@pytest.fixture
def ws_clients():
    """Collects KernelWS objects to close at teardown: ws_clients.append(ws)."""
    clients = []
    yield clients
    for c in clients:
        c.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and _LIVE_DAEMONS:
        for kg in _LIVE_DAEMONS:
            report.sections.append((f"kgate pid {kg.proc.pid} ({kg.url})", kg.log_tail(60)))
