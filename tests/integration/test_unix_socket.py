"""kgate serving on a Unix socket (`kgate serve --unix [PATH]`, `--no-tcp`): the REST API and
the kernel websocket over the socket, the socket file's mode and its peer check (SO_PEERCRED:
only kgate's uid, or unix_allow_uids), a stale socket replaced and a live one refused, the file
removed at exit, and kgate-mcp / `kgate kernels` reaching kgate by a unix:///path URL.

The other-uid tests run a small client as `nobody` with setpriv; they need root.

    KGATE_BIN=build/gateway/kgate KGATE_MCP_BIN=build/translator/kgate-mcp \\
        /usr/bin/python3 -m pytest -q tests/integration/test_unix_socket.py
"""

import functools
import http.client
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import tempfile

import pytest
import websocket

from conftest import KernelWS, Kgate, LISTEN_RE, make_jupyter_env, wait_until
from test_mcp_tls import start_mcp, tool
from test_mcp_transcript import mcp_bin  # noqa: F401 (a fixture)

UNIX_RE = re.compile(r"listening on unix:(\S+)")


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a Unix socket; the Host header is localhost."""

    def __init__(self, path, timeout=60):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = str(path)

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.socket_path)
        self.sock = s


def unix_ws(path, url, **kw):
    """A KernelWS whose connection goes over the Unix socket at `path` (the URL's host is only
    the Host header)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(15)
    sock.connect(str(path))
    real = websocket.create_connection
    websocket.create_connection = functools.partial(real, socket=sock)
    try:
        return KernelWS(url, **kw)
    finally:
        websocket.create_connection = real


class UnixKgate(Kgate):
    """A kgate with --unix PATH (and maybe --no-tcp) whose http() goes over the socket.  It counts
    as started once it logged `listening on unix:PATH`."""

    def __init__(self, binary, root, sock=None, no_tcp=False, flags=True, extra_args=(), **kw):
        args = ["--unix"] + ([str(sock)] if sock else []) + (["--no-tcp"] if no_tcp else []) if flags else []
        super().__init__(binary, root, extra_args=args + list(extra_args), **kw)
        self.sock = str(sock) if sock else None
        self.no_tcp = no_tcp

    def _on_line(self, line):
        m = LISTEN_RE.search(line)
        if m and self.port is None:
            self.port = int(m.group(2))
        u = UNIX_RE.search(line)
        if u and not self._listening.is_set():
            self.sock = self.sock or u.group(1)
            self._listening.set()

    def _connection(self, timeout):
        return UnixHTTPConnection(self.sock, timeout=timeout)

    def ws(self, kernel_id, session_id=None, **kw):
        return unix_ws(self.sock, f"ws://localhost/api/kernels/{kernel_id}/channels", session_id=session_id, **kw)


@pytest.fixture
def unix_factory(kgate_bin, tmp_path_factory):
    """unix_factory(sock=..., no_tcp=..., env=..., start=True): UnixKgate daemons stopped at teardown."""
    started = []

    def factory(start=True, env=None, **kw):
        kg = UnixKgate(kgate_bin, tmp_path_factory.mktemp("kgate_unix"), **kw)
        kg.env.update(env or {})
        started.append(kg)
        return kg.start() if start else kg

    yield factory
    for kg in started:
        kg.cleanup_kernels()
        kg.stop()


@pytest.fixture
def public_dir():
    """A directory other users can traverse (pytest's tmp dirs are 0700)."""
    d = tempfile.mkdtemp(prefix="kgate-unix-", dir="/tmp")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def sock():
    """A socket path in a fresh private directory (pytest's tmp paths can pass the 107 bytes a
    socket path may have)."""
    d = tempfile.mkdtemp(prefix="kgs-", dir="/tmp")
    yield os.path.join(d, "kgate.sock")
    shutil.rmtree(d, ignore_errors=True)


def serve_fails(kgate_bin, tmp_path, *args, timeout=15):
    """Runs `kgate serve ARGS` that must refuse to start: (exit code, stderr)."""
    env = make_jupyter_env(tmp_path)
    p = subprocess.run([kgate_bin, "serve", "--port", "0", *args], env=env, cwd=str(tmp_path),
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    return p.returncode, p.stderr.decode(errors="replace")


# --------------------------------------------------------------------------------------------
# REST and websocket over the socket

def test_rest_and_websocket_over_the_socket(unix_factory, sock):
    kg = unix_factory(sock=sock, no_tcp=True)
    assert wait_until(lambda: any(f"listening on unix:{sock}" in ln for ln in kg.log_lines), 5), kg.log_tail()
    assert not any("listening on http" in ln for ln in kg.log_lines), kg.log_tail()
    assert stat.S_ISSOCK(os.lstat(sock).st_mode)
    assert stat.S_IMODE(os.lstat(sock).st_mode) == 0o600

    status, _, body = kg.rest("GET", "/api")
    assert status == 200 and "version" in body, (status, body)
    # A Unix client is local: the whole env of the POST reaches the kernel (env_policy auto).
    model = kg.start_kernel({"name": "python3", "env": {"KGATE_UNIX_TEST": "over-the-socket"}})
    with kg.ws(model["id"]) as ws:
        out = ws.run("import os; print(os.environ.get('KGATE_UNIX_TEST'), 6 * 7)")
    assert out == "over-the-socket 42\n", out
    status, _, body = kg.rest("GET", f"/api/kernels/{model['id']}")
    assert status == 200 and body["id"] == model["id"], (status, body)
    assert kg.delete_kernel(model["id"]) == 204
    status, _, body = kg.rest("GET", "/api/kernels")
    assert status == 200 and body == [], body

    assert kg.stop() == 0
    assert not os.path.lexists(sock), "the socket file was left behind at exit"


def test_host_and_origin_checks_apply_on_the_socket(unix_factory, sock):
    kg = unix_factory(sock=sock, ip="0.0.0.0", token="unix-tok")
    # A non-loopback TCP bind does no Host check, but the Unix socket is a local listener.
    status, _, body = kg.rest("GET", "/api/kernels", headers={"Host": "evil.example"})
    assert status == 403 and "Host evil.example is not allowed" in body["message"], (status, body)
    status, _, body = kg.rest("GET", "/api/kernels", headers={"Origin": "http://evil.example"})
    assert status == 403 and "Origin" in body["message"], (status, body)
    status, _, body = kg.rest("GET", "/api/kernels", auth=False)
    assert status == 401, (status, body)  # the token still applies on the socket
    status, _, body = kg.rest("GET", "/api/kernels")
    assert status == 200, (status, body)


def test_default_path_is_under_xdg_runtime_dir(unix_factory, tmp_path):
    xdg = tempfile.mkdtemp(prefix="kgx-", dir="/tmp")
    try:
        kg = unix_factory(env={"XDG_RUNTIME_DIR": xdg})
        expected = os.path.join(xdg, "kgate", "kgate.sock")
        assert kg.sock == expected, kg.log_tail()
        assert stat.S_IMODE(os.stat(os.path.join(xdg, "kgate")).st_mode) == 0o700
        assert stat.S_IMODE(os.lstat(expected).st_mode) == 0o600
        # The owner needs no token on the socket (its uid is checked)...
        status, _, _ = kg.rest("GET", "/api", auth=False)
        assert status == 200
        # ...and TCP is still served beside it, where kgate's own token is asked.
        for headers, want in (({}, 401), ({"Authorization": f"token {kg.token}"}, 200)):
            conn = http.client.HTTPConnection("127.0.0.1", kg.port, timeout=10)
            conn.request("GET", "/api", headers=headers)
            assert conn.getresponse().status == want
            conn.close()
        kg.stop()
        assert not os.path.lexists(expected)
    finally:
        shutil.rmtree(xdg, ignore_errors=True)


def test_default_path_without_xdg_runtime_dir_is_in_the_runtime_dir(unix_factory):
    kg = unix_factory(start=False)
    kg.env.pop("XDG_RUNTIME_DIR", None)
    if len(str(kg.runtime_dir / "kgate.sock")) >= 108:
        pytest.skip("the runtime dir's path is too long for a socket path")
    kg.start()
    assert kg.sock == str(kg.runtime_dir / "kgate.sock"), kg.log_tail()
    assert kg.rest("GET", "/api")[0] == 200


# --------------------------------------------------------------------------------------------
# The socket file: stale, live, not a socket

def test_stale_socket_is_replaced(unix_factory, sock):
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(sock)  # bound, never listening, closed: connect() is refused, the file stays
    dead.close()
    assert os.path.lexists(sock)
    kg = unix_factory(sock=sock)
    assert kg.rest("GET", "/api")[0] == 200


def test_live_socket_is_an_error(unix_factory, kgate_bin, tmp_path, sock):
    first = unix_factory(sock=sock)
    rc, err = serve_fails(kgate_bin, tmp_path, "--unix", sock)
    assert rc != 0, err
    assert f"another kgate is serving on {sock}" in err, err
    assert not UNIX_RE.search(err), err
    # The first one's socket is untouched.
    assert first.rest("GET", "/api")[0] == 200


def test_a_file_that_is_not_a_socket_is_an_error(kgate_bin, tmp_path, sock):
    path = sock
    with open(path, "w") as f:
        f.write("not a socket\n")
    rc, err = serve_fails(kgate_bin, tmp_path, "--unix", path)
    assert rc != 0 and f"{path} exists and is not a socket" in err, (rc, err)
    assert open(path).read() == "not a socket\n"


def test_no_tcp_needs_a_unix_socket(kgate_bin, tmp_path):
    rc, err = serve_fails(kgate_bin, tmp_path, "--no-tcp")
    assert rc != 0 and "nothing to listen on" in err, (rc, err)


def test_kgate_toml_keys(unix_factory, tmp_path, sock):
    cfg = tmp_path / "kgate.toml"
    cfg.write_text(f'[server]\nunix_socket = "{sock}"\ntcp = false\n')
    kg = unix_factory(flags=False, config=cfg)
    assert kg.sock == sock and kg.port is None, kg.log_tail()
    assert kg.rest("GET", "/api")[0] == 200
    bad = tmp_path / "bad.toml"
    bad.write_text('[server]\nunix_allow_uids = ["nobody"]\n')
    rc, err = serve_fails(kg.binary, tmp_path, "--config", str(bad))
    assert rc != 0 and "unix_allow_uids" in err, (rc, err)


# --------------------------------------------------------------------------------------------
# The peer check: another uid

NOBODY_CLIENT = r"""
import http.client, json, socket, sys
class C(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(sys.argv[1])
c = C("localhost", timeout=10)
try:
    c.request("GET", "/api/kernels")
except OSError as e:
    print(json.dumps({"errno": e.errno}))
    sys.exit(0)
r = c.getresponse()
print(json.dumps({"status": r.status, "body": r.read().decode(), "connection": r.getheader("Connection")}))
"""


def as_nobody(sock):
    """Runs NOBODY_CLIENT as uid nobody against `sock`: its JSON line."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as another uid")
    setpriv = shutil.which("setpriv")
    if not setpriv:
        pytest.skip("setpriv (util-linux) is not installed")
    p = subprocess.run([setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3", "-c",
                        NOBODY_CLIENT, sock], capture_output=True, timeout=30, cwd="/")
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    return json.loads(p.stdout.decode())


def test_another_uid_is_refused(unix_factory, public_dir):
    sock = os.path.join(public_dir, "kgate.sock")
    kg = unix_factory(sock=sock)
    # Mode 0600: the kernel refuses before kgate sees anything.
    got = as_nobody(sock)
    assert got == {"errno": 13}, got  # EACCES
    # World-writable, so the connection reaches kgate: its SO_PEERCRED check answers 403.
    os.chmod(sock, 0o666)
    got = as_nobody(sock)
    nobody = 65534
    assert got["status"] == 403, got
    body = json.loads(got["body"])
    assert body["reason"] == "Forbidden", body
    assert f"uid {nobody} may not use this kgate" in body["message"], body
    assert got["connection"] == "close", got
    assert wait_until(lambda: any(f"from uid {nobody}" in ln and "warn" in ln for ln in kg.log_lines), 5), \
        kg.log_tail()
    # kgate's own uid is still served.
    assert kg.rest("GET", "/api/kernels")[0] == 200


def test_unix_allow_uids_serves_a_listed_uid(unix_factory, public_dir, tmp_path):
    sock = os.path.join(public_dir, "kgate.sock")
    cfg = tmp_path / "kgate.toml"
    cfg.write_text("[server]\nunix_allow_uids = [65534]\n")
    unix_factory(sock=sock, config=cfg)
    os.chmod(sock, 0o666)
    got = as_nobody(sock)
    assert got["status"] == 200 and json.loads(got["body"]) == [], got


# --------------------------------------------------------------------------------------------
# Clients: kgate-mcp and `kgate kernels` with unix:///path

def test_kgate_mcp_executes_over_the_socket(unix_factory, mcp_bin, tmp_path, sock):  # noqa: F811
    kg = unix_factory(sock=sock, no_tcp=True)
    home = tmp_path / "xdg"
    (home / "kgate").mkdir(parents=True)
    m = start_mcp(mcp_bin, tmp_path, home, KGATE_URL=f"unix://{sock}")
    try:
        is_error, text = tool(m, "connect")
        assert not is_error and "created kernel" in text, text
        is_error, text = tool(m, "execute", code="print('via unix')\n6*7")
        assert not is_error and "via unix" in text and "42" in text, text
        is_error, text = tool(m, "list_kernels")
        assert f"unix://{sock}" in text and "<- current" in text, text
        is_error, text = tool(m, "stop_kernel")
        assert "stopped kernel" in text, text
    finally:
        m.close(timeout=30)
        m.kill()
    status, _, body = kg.rest("GET", "/api/kernels")
    assert status == 200 and body == [], body


def test_kgate_mcp_names_a_missing_socket(mcp_bin, tmp_path):  # noqa: F811
    home = tmp_path / "xdg"
    (home / "kgate").mkdir(parents=True)
    m = start_mcp(mcp_bin, tmp_path, home, KGATE_URL="unix:///nonexistent-kgate/kgate.sock")
    try:
        _, text = tool(m, "connect")  # a reply naming the path, not a crash
        assert ("cannot connect to unix:///nonexistent-kgate/kgate.sock: No such file or directory "
                "(is kgate serving with --unix?)") in text, text
    finally:
        m.close(timeout=30)
        m.kill()


def kernels_cmd(kgate_bin, tmp_path, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KGATE_", "JUPYTER"))}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg-empty")
    p = subprocess.run([kgate_bin, "kernels", *args], env=env, capture_output=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def test_kgate_kernels_lists_over_the_socket(unix_factory, kgate_bin, tmp_path, sock):
    kg = unix_factory(sock=sock, no_tcp=True)
    kid = kg.start_kernel()["id"]
    rc, out, err = kernels_cmd(kgate_bin, tmp_path, "--host", f"unix://{sock}")
    assert rc == 0, (rc, out, err)
    assert f"gateway unix://{sock} (kgate)" in out and kid in out, out
    rc, out, err = kernels_cmd(kgate_bin, tmp_path, "--host", "unix:///nonexistent-kgate/kgate.sock")
    assert rc == 1 and out == "", (rc, out, err)
    assert ("cannot connect to unix:///nonexistent-kgate/kgate.sock: No such file or directory "
            "(is kgate serving with --unix?)") in err, err
