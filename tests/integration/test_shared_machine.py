"""A machine shared with other users (issue 42): another local user gets nothing from kgate's
TCP port without the token kgate makes for itself, the owner's own tools find that token with no
set-up, and kgate-mcp sends a token only to the gateway it belongs to and never into a kernel.

The other-uid tests run their client as `nobody` with setpriv; they need root (CI has it)."""

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time

import pytest

from conftest import WSClosed, wait_until
from test_mcp_tls import start_mcp, tool
from test_mcp_transcript import mcp_bin  # noqa: F401 (a fixture)

NOBODY = 65534

# Run as nobody: each (method, path) against 127.0.0.1:PORT without a token, then a websocket
# upgrade; prints {"http": {path: status}, "ws": status line, "token_file": errno or "read"}.
NOBODY_PROBE = r"""
import http.client, json, socket, sys
port, kid, token_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
out = {"http": {}}
for method, path, body in [("GET", "/api/kernels", None), ("POST", "/api/kernels", "{}"),
                           ("POST", "/api/kgate/kernels/" + kid + "/execute", '{"code": "1"}'),
                           ("POST", "/mcp", '{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}'),
                           ("GET", "/metrics", None), ("GET", "/observe", None),
                           ("GET", "/api/sessions", None)]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request(method, path, body=body, headers={"Content-Type": "application/json"})
    out["http"][method + " " + path] = c.getresponse().status
s = socket.create_connection(("127.0.0.1", port), timeout=10)
s.sendall(("GET /api/kernels/" + kid + "/channels HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
           "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n" % port).encode())
out["ws"] = s.recv(4096).split(b"\r\n")[0].decode()
try:
    open(token_file).read()
    out["token_file"] = "read"
except OSError as e:
    out["token_file"] = e.errno
print(json.dumps(out))
"""


def setpriv_nobody():
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as another uid")
    setpriv = shutil.which("setpriv")
    if not setpriv:
        pytest.skip("setpriv (util-linux) is not installed")
    return [setpriv, f"--reuid={NOBODY}", "--regid=nogroup", "--clear-groups"]


# --------------------------------------------------------------------------------------------
# 1. A token by default

def test_another_user_gets_401_everywhere_on_tcp(kgate, kernel):
    assert kgate.own_token_file is not None, kgate.log_tail()
    token = kgate.token
    assert len(token) == 64 and int(token, 16) >= 0, token
    st = os.stat(kgate.own_token_file)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid(), oct(st.st_mode)
    assert stat.S_IMODE(os.stat(kgate.own_token_file.parent).st_mode) == 0o700
    p = subprocess.run(setpriv_nobody() + ["/usr/bin/python3", "-c", NOBODY_PROBE, str(kgate.port), kernel,
                                           str(kgate.own_token_file)],
                       capture_output=True, timeout=60, cwd="/")
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    got = json.loads(p.stdout)
    assert set(got["http"].values()) == {401}, got
    assert got["ws"].startswith("HTTP/1.1 401"), got
    assert got["token_file"] == 13, got  # EACCES: the state dir is 0700
    # The owner, with the token, is served; the token never reaches the log.
    assert kgate.rest("GET", "/api/kernels")[0] == 200
    assert not any(token in ln for ln in kgate.log_lines if "observe page:" not in ln), kgate.log_tail()


def test_the_token_outlives_a_restart_and_the_observe_link_carries_it(kgate_factory, tmp_path):
    kg = kgate_factory()
    token, first_file = kg.token, kg.own_token_file
    line = wait_until(lambda: next((ln for ln in kg.log_lines if "observe page:" in ln), None), 5)
    assert f"{kg.url}/observe?token={token}" in line, line
    assert kg.http("GET", f"/observe?token={token}", auth=False)[0] == 200
    assert kg.http("GET", "/observe", auth=False)[0] == 401
    # The next kgate on the same state dir keeps the token: the owner's clients keep working.
    kg.stop()
    again = type(kg)(kg.binary, kg.root)
    again.start()
    try:
        assert again.own_token_file == first_file and again.token == token
    finally:
        again.stop()


def test_no_token_serves_everyone_and_says_so(kgate_factory):
    kg = kgate_factory(extra_args=["--no-token"])
    assert kg.token is None and kg.own_token_file is None
    assert kg.http("GET", "/api/kernels", auth=False)[0] == 200
    assert wait_until(lambda: any("warn" in ln and "every local user of this machine can run code" in ln
                                  for ln in kg.log_lines), 5), kg.log_tail()
    assert any("token OFF" in ln for ln in kg.log_lines), kg.log_tail()


def test_no_token_is_refused_off_loopback(kgate_bin, tmp_path):
    from conftest import make_jupyter_env
    p = subprocess.run([kgate_bin, "serve", "--ip", "0.0.0.0", "--port", "0", "--no-token"],
                       env=make_jupyter_env(tmp_path), capture_output=True, timeout=30, cwd=str(tmp_path))
    assert p.returncode == 2 and b"refusing to listen on 0.0.0.0 without a token" in p.stderr, p.stderr


def test_the_owners_kgate_kernels_finds_the_token(kgate, kgate_bin):
    env = dict(os.environ, KGATE_URL=kgate.url, XDG_STATE_HOME=kgate.env["XDG_STATE_HOME"])
    env.pop("KGATE_TOKEN", None)
    p = subprocess.run([kgate_bin, "kernels"], env=env, capture_output=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert kgate.token.encode() not in p.stdout + p.stderr
    # Another state home (no token of this kgate's): 401, and kgate kernels says none was sent.
    env["XDG_STATE_HOME"] = "/nonexistent-state-home"
    p = subprocess.run([kgate_bin, "kernels"], env=env, capture_output=True, timeout=30)
    assert p.returncode == 1 and b"none was sent" in p.stderr, p.stderr


# --------------------------------------------------------------------------------------------
# 4. kgate-mcp keeps its tokens to itself

class Listener:
    """A TCP listener on 127.0.0.1 that records the head of every request it gets (and answers
    nothing useful): where a token would go. With `as_nobody`, a process of uid nobody holds
    the port instead, and the head comes back on its stdout."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.heads = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with c:
                c.settimeout(5)
                data = b""
                try:
                    while b"\r\n\r\n" not in data:
                        chunk = c.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    self.heads.append(data.split(b"\r\n\r\n")[0].decode(errors="replace"))
                    c.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass

    def close(self):
        self.sock.close()


def test_a_url_host_gets_no_token(kgate, mcp_bin, tmp_path):  # noqa: F811
    home = tmp_path / "xdg"
    (home / "kgate").mkdir(parents=True)
    lst = Listener()
    secret = "kgate-token-for-the-default-gateway-only"
    # The owner's own token is under this XDG_STATE_HOME too: it goes to no listener but kgate.
    m = start_mcp(mcp_bin, tmp_path, home, KGATE_URL=kgate.url, KGATE_TOKEN=secret,
                  XDG_STATE_HOME=kgate.env["XDG_STATE_HOME"])
    try:
        tool(m, "connect", host=f"http://127.0.0.1:{lst.port}")
        assert wait_until(lambda: lst.heads, 10), "kgate-mcp never reached the listener"
        for head in lst.heads:
            assert "authorization" not in head.lower(), head
            assert secret not in head and kgate.token not in head, head
    finally:
        m.close(timeout=30)
        m.kill()
        lst.close()


# As nobody: listens on ADDRESS:PORT (0: any), prints the port, then prints repr() of every byte the
# first connection sends before it closes or goes quiet for 5 s, and answers a 404.
SQUAT_PORT = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(4)
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); c.settimeout(5); data = b""
try:
    while b"\r\n\r\n" not in data:
        chunk = c.recv(65536)
        if not chunk: break
        data += chunk
except OSError:
    pass
print(repr(data), flush=True)
try:
    c.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
except OSError:
    pass
"""


def test_nothing_goes_to_a_default_port_another_user_holds(kgate, mcp_bin, tmp_path):  # noqa: F811
    """The default gateway's port on 127.0.0.1 held by another user (kgate down, say): no byte
    goes there, not the token, nor a kernel's environment, cwd or code, and the owner is told who
    holds it."""
    squatter = subprocess.Popen(setpriv_nobody() + ["/usr/bin/python3", "-c", SQUAT_PORT, "127.0.0.1", "0"],
                                stdout=subprocess.PIPE, cwd="/")
    try:
        port = int(squatter.stdout.readline())
        home = tmp_path / "xdg"
        (home / "kgate").mkdir(parents=True)
        m = start_mcp(mcp_bin, tmp_path, home, KGATE_URL=f"http://127.0.0.1:{port}", KGATE_TOKEN="sq-secret-59",
                      API_KEY_OF_THE_OWNER="owner-env-secret-59", XDG_STATE_HOME=kgate.env["XDG_STATE_HOME"])
        try:
            is_error, text = tool(m, "execute", code="print('owner-code-59')")
            assert is_error, text
            assert f"uid {NOBODY} (nobody), not by you" in text and "sent it nothing" in text, text
        finally:
            m.close(timeout=30)
            m.kill()
        assert squatter.stdout.readline().decode().strip() == "b''"  # not one byte
    finally:
        squatter.kill()
        squatter.wait()


def test_another_users_listener_on_127_0_0_2_changes_nothing(kgate, mcp_bin, tmp_path):  # noqa: F811
    """Another user on the same port at another loopback address neither gets the owner's
    connection nor makes kgate-mcp withhold the owner's token from the owner's kgate."""
    squatter = subprocess.Popen(setpriv_nobody() + ["/usr/bin/python3", "-c", SQUAT_PORT, "127.0.0.2",
                                                    str(kgate.port)], stdout=subprocess.PIPE, cwd="/")
    try:
        assert int(squatter.stdout.readline()) == kgate.port
        home = tmp_path / "xdg"
        (home / "kgate").mkdir(parents=True)
        m = start_mcp(mcp_bin, tmp_path, home, KGATE_URL=kgate.url, XDG_STATE_HOME=kgate.env["XDG_STATE_HOME"])
        try:
            is_error, text = tool(m, "execute", code="print(6 * 7)")
            assert not is_error and "42" in text, text
        finally:
            m.close(timeout=30)
            m.kill()
    finally:
        squatter.kill()
        squatter.wait()


def test_a_kernel_gets_no_kgate_variable_nor_token_env(kgate, mcp_bin, tmp_path):  # noqa: F811
    home = tmp_path / "xdg"
    (home / "kgate").mkdir(parents=True)
    (home / "kgate" / "gateways.toml").write_text(
        '[gateways.other]\nurl = "http://127.0.0.1:9"\ntoken_env = "OTHER_GW_SECRET"\n')
    m = start_mcp(mcp_bin, tmp_path, home, KGATE_URL=kgate.url, KGATE_TOKEN=kgate.token,
                  OTHER_GW_SECRET="other-gateway-secret", KEEP_ME="kept")
    try:
        is_error, text = tool(m, "execute", code=(
            "import os\nprint(sorted(k for k in os.environ if k.startswith('KGATE_') and k != 'KGATE_HOST_SESSION'),"
            " 'OTHER_GW_SECRET' in os.environ, os.environ.get('KEEP_ME'))"))
        assert not is_error, text
        assert "[] False kept" in text, text
        assert kgate.token not in text and "other-gateway-secret" not in text, text
    finally:
        m.close(timeout=30)
        m.kill()


# --------------------------------------------------------------------------------------------
# 5. The host session cannot be claimed

def test_a_client_may_not_send_as_kgates_host_session(kgate, kernel, tmp_path):
    host = (kgate.own_token_file.parent / "host-session").read_text().strip()
    assert host.startswith("kgate-"), host
    marker = tmp_path / "ran"
    for session in (host, host + ".x"):
        ws = kgate.connect(kernel)
        try:
            msg = ws.make_msg("execute_request", {
                "code": f"open({str(marker)!r}, 'w').close()", "silent": True, "store_history": False,
                "user_expressions": {}, "allow_stdin": False, "stop_on_error": False})
            msg["header"]["session"] = session
            ws.send_msg(msg)
            with pytest.raises(WSClosed) as closed:
                ws.wait_for(lambda m: False, timeout=10, what="the close")
            assert "header.session may not be kgate's own session" in str(closed.value), closed.value
        finally:
            ws.close()
    # An ordinary client is served as ever, and the spoofed cells never ran.
    with kgate.connect(kernel) as ws:
        assert ws.run("print('ok')").strip() == "ok"
    assert not marker.exists()
    assert any("claiming kgate's own session" in ln for ln in kgate.log_lines), kgate.log_tail()


# --------------------------------------------------------------------------------------------
# 6. Bounds on the sessions API

def test_sessions_are_bounded(kgate, kernel):
    body = {"path": "p" * 4097, "type": "notebook", "kernel": {"id": kernel}}
    status, _, reply = kgate.rest("POST", "/api/sessions", body)
    assert status == 413 and "path is 4097 bytes; at most 4096" in reply["message"], (status, reply)
    body = {"path": "n.ipynb", "name": "x" * 5000, "type": "notebook", "kernel": {"id": kernel}}
    status, _, reply = kgate.rest("POST", "/api/sessions", body)
    assert status == 413 and "name is 5000 bytes" in reply["message"], (status, reply)
    assert kgate.rest("GET", "/api/sessions")[2] == []
    # The total: sessions of 12 KiB each until the 4 MiB cap refuses one.
    made, refused = [], None
    for i in range(400):
        body = {"path": f"{i:04d}" + "p" * 4092, "name": "n" * 4096, "type": "t" * 4096, "kernel": {"id": kernel}}
        status, _, reply = kgate.rest("POST", "/api/sessions", body)
        if status != 201:
            refused = (status, reply)
            break
        made.append(reply["id"])
    assert refused and refused[0] == 413 and "is their limit" in refused[1]["message"], refused
    assert len(made) == (4 << 20) // (3 * 4096), len(made)
    # PATCH is held to the same bounds; deleting one makes room again.
    status, _, reply = kgate.rest("PATCH", f"/api/sessions/{made[0]}", {"path": "q" * 4097})
    assert status == 413, (status, reply)
    assert kgate.rest("DELETE", f"/api/sessions/{made[0]}")[0] == 204
    assert kgate.rest("POST", "/api/sessions", body)[0] == 201
    # sessions.json is written off the HTTP thread, and within its bound.
    state = kgate.own_token_file.parent
    assert wait_until(lambda: (state / "sessions.json").exists()
                      and len(json.loads((state / "sessions.json").read_text())["sessions"]) == len(made), 10)
    assert (state / "sessions.json").stat().st_size < (4 << 20) + 200 * len(made)
    for sid in kgate.rest("GET", "/api/sessions")[2]:
        kgate.rest("DELETE", f"/api/sessions/{sid['id']}")


# --------------------------------------------------------------------------------------------
# 7. The small ones

def test_a_runtime_dir_of_another_user_is_refused(kgate_bin, tmp_path):
    from conftest import make_jupyter_env
    runtime = tmp_path / "theirs"
    runtime.mkdir(mode=0o700)
    os.chown(runtime, NOBODY, NOBODY) if os.geteuid() == 0 else pytest.skip("needs root to chown")
    p = subprocess.run([kgate_bin, "serve", "--port", "0", "--runtime-dir", str(runtime)],
                       env=make_jupyter_env(tmp_path), capture_output=True, timeout=30, cwd=str(tmp_path))
    assert p.returncode == 1, p.stderr
    assert f"{runtime}: owned by uid {NOBODY}, not by this user".encode() in p.stderr, p.stderr


def test_any_origin_needs_a_token(kgate_bin, tmp_path):
    from conftest import make_jupyter_env
    cfg = tmp_path / "kgate.toml"
    cfg.write_text('[server]\nallow_origins = ["*"]\ntoken = ""\n')
    p = subprocess.run([kgate_bin, "serve", "--port", "0", "--config", str(cfg)],
                       env=make_jupyter_env(tmp_path), capture_output=True, timeout=30, cwd=str(tmp_path))
    assert p.returncode == 2 and b'refusing allow_origins = ["*"] without a token' in p.stderr, p.stderr


# --------------------------------------------------------------------------------------------
# 2. Supervisors are trusted by their credentials only

# As nobody: binds the abstract names given (argv[1:]), prints "bound", then answers whoever
# connects to the first with argv's "pid ..." line (from $HELLO) and prints every line it is sent.
SQUATTER = r"""
import os, socket, sys, threading
socks = []
for name in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind("\0" + name); s.listen(8); socks.append(s)
print("bound", flush=True)
hello = os.environ.get("HELLO", "")
while hello:
    c, _ = socks[0].accept()
    c.sendall((hello + "\n").encode())
    def pump(c=c):
        for line in c.makefile():
            print("got", line.strip(), flush=True)
    threading.Thread(target=pump, daemon=True).start()
"""


def supervisor_of(kg, kid):
    entry = json.loads((kg.own_token_file.parent / "kernels" / f"{kid}.json").read_text())
    return entry


def test_supervisor_names_cannot_be_squatted(kgate_factory):
    """The names kgate used to give supervisors (<id>/<attempt>-<epoch>) were another user's to
    bind first, and a restart then failed with a dead kernel. Now a name has 128 random bits."""
    kg = kgate_factory()
    kid = kg.start_kernel()["id"]
    name = supervisor_of(kg, kid)["supervisor"]
    assert re.fullmatch(rf"kgate-supervise/{os.geteuid()}/{kid}/1-\d+-[0-9a-f]{{32}}", name), name
    base = name.rsplit("/", 1)[0]
    old_style = [f"{base}/{a}-{e}" for a in range(1, 4) for e in range(0, 8)]
    squatter = subprocess.Popen(setpriv_nobody() + ["/usr/bin/python3", "-c", SQUATTER] + old_style,
                                stdout=subprocess.PIPE, cwd="/", env={"HELLO": ""})
    try:
        assert squatter.stdout.readline().strip() == b"bound"
        status, _, body = kg.rest("POST", f"/api/kernels/{kid}/restart")
        assert status == 200, (status, body)
        with kg.connect(kid) as ws:
            assert ws.run("print(6 * 7)").strip() == "42"
        again = supervisor_of(kg, kid)["supervisor"]
        assert again != name and again not in old_style, again
    finally:
        squatter.kill()
        squatter.wait()


def test_a_fake_supervisor_is_refused_at_readoption(kgate_bin, tmp_path):
    """Another user binds a dead supervisor's name and answers with the kernel's pid and start
    time (read from /proc while it lived): the next kgate lists the kernel dead, says why, and
    sends the impostor nothing."""
    from conftest import Kgate
    kg = Kgate(kgate_bin, tmp_path / "kg").start()
    kid = kg.start_kernel()["id"]
    entry = supervisor_of(kg, kid)
    assert entry["supervisor_pid"] > 0 and entry["supervisor_pid"] != entry["pid"], entry
    kg.stop(sig=signal.SIGKILL, sweep=False)  # its kernels wait for the next kgate
    os.kill(entry["supervisor_pid"], signal.SIGKILL)  # and this one's supervisor dies, its kernel with it
    assert wait_until(lambda: not os.path.exists(f"/proc/{entry['pid']}"), 10)
    impostor = subprocess.Popen(setpriv_nobody() + ["/usr/bin/python3", "-c", SQUATTER, entry["supervisor"]],
                                stdout=subprocess.PIPE, cwd="/",
                                env={"HELLO": f"pid {entry['pid']} {entry['pid_start']}"})
    try:
        assert impostor.stdout.readline().strip() == b"bound"
        kg2 = Kgate(kgate_bin, tmp_path / "kg").start()
        try:
            model = kg2.kernel_model(kid)
            assert model["execution_state"] == "dead", model
            assert wait_until(lambda: any("error" in ln and "its supervisor's socket is held by pid" in ln
                                          and f"of uid {NOBODY}" in ln and "refused" in ln
                                          for ln in kg2.log_lines), 5), kg2.log_tail()
            t = time.monotonic()
            assert kg2.rest("DELETE", f"/api/kernels/{kid}")[0] == 204
            assert time.monotonic() - t < 5
        finally:
            kg2.stop()
        impostor.kill()
        out = impostor.stdout.read().decode()
        assert "got" not in out, f"kgate sent the impostor: {out!r}"
    finally:
        impostor.kill()
        impostor.wait()


# As nobody: binds the abstract name argv[1], listens with a backlog of 0 and fills it with its
# own connections, so that a connect() to the name cannot complete; accepts nothing.
SQUAT_FULL = r"""
import socket, sys, time
name = "\0" + sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(name); s.listen(0)
fill = []
for _ in range(8):
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); c.setblocking(False)
    try:
        c.connect(name)
    except BlockingIOError:
        break
    fill.append(c)
print("full", flush=True)
time.sleep(300)
"""


def test_a_squatted_name_with_a_full_backlog_does_not_hold_up_readoption(kgate_bin, tmp_path):
    """A dead supervisor's name bound by another user who accepts nothing: the next kgate gives it
    up after a short wait, lists that kernel dead saying why, and adopts the others."""
    from conftest import Kgate
    kg = Kgate(kgate_bin, tmp_path / "kg").start()
    lost, kept = kg.start_kernel()["id"], kg.start_kernel()["id"]
    entry = supervisor_of(kg, lost)
    kg.stop(sig=signal.SIGKILL, sweep=False)
    os.kill(entry["supervisor_pid"], signal.SIGKILL)
    assert wait_until(lambda: not os.path.exists(f"/proc/{entry['pid']}"), 10)
    squatter = subprocess.Popen(setpriv_nobody() + ["/usr/bin/python3", "-c", SQUAT_FULL, entry["supervisor"]],
                                stdout=subprocess.PIPE, cwd="/")
    try:
        assert squatter.stdout.readline().strip() == b"full"
        t0 = time.monotonic()
        kg2 = Kgate(kgate_bin, tmp_path / "kg").start()
        took = time.monotonic() - t0
        try:
            assert took < 5, took  # a blocking connect() waited as long as the squatter liked
            model = kg2.kernel_model(lost)
            assert model["execution_state"] == "dead", model
            assert any("did not accept a connection within 300 ms" in ln for ln in kg2.log_lines), kg2.log_tail()
            with kg2.connect(kept) as ws:
                assert ws.run("print(7 * 6)").strip() == "42"
            kg2.delete_kernel(kept)
            kg2.rest("DELETE", f"/api/kernels/{lost}")
        finally:
            kg2.stop()
    finally:
        squatter.kill()
        squatter.wait()
