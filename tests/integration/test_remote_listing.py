"""Remote kernel listing: `kgate kernels --host NAME|URL [--json]` and
kgate-mcp's `list_kernels(host)` list the kernelspecs, kernels and sessions of a second kgate
(with a token) and of a stock jupyter_server, with the token taken from gateways.toml. A wrong
token, an unknown name, a dead port and a TLS server each give a clear message, and the token is
never printed.

    KGATE_BIN=build/gateway/kgate KGATE_MCP_BIN=build/translator/kgate-mcp \\
        /usr/bin/python3 -m pytest -q tests/integration/test_remote_listing.py
"""

import json
import re
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time

import pytest

from conftest import DISPLAY_NAME, _module_daemon, free_port
from test_mcp_stock import TOKEN as STOCK_TOKEN, StockServer
from test_mcp_transcript import Mcp, mcp_bin  # noqa: F401 (mcp_bin is a fixture)

TOKEN = "remote-listing-token-5c2e91"
WRONG = "remote-listing-wrong-0b7d44"
TOKENS = (TOKEN, WRONG, STOCK_TOKEN)


@pytest.fixture(scope="module")
def gw2(kgate_bin, tmp_path_factory):
    """A second kgate with a token, on a port of its own, with one running kernel."""
    yield from _module_daemon(kgate_bin, tmp_path_factory, token=TOKEN)


@pytest.fixture(scope="module")
def gw2_kernel(gw2):
    return gw2.start_kernel()["id"]


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    js = StockServer(tmp_path_factory.mktemp("stock_listing"))
    try:
        js.wait_ready()
        yield js
    finally:
        js.stop()


@pytest.fixture(scope="module")
def stock_session(stock):
    """A session (and so a running kernel) on the stock server: (session id, kernel id, path)."""
    status, _, body = stock.http("POST", "/api/sessions", {"path": "nb/listing.ipynb", "name": "listing.ipynb",
                                                           "type": "notebook", "kernel": {"name": "python3"}})
    assert status == 201, (status, body, stock.log_tail())
    model = json.loads(body)
    yield model["id"], model["kernel"]["id"], "nb/listing.ipynb"
    stock.http("DELETE", f"/api/sessions/{model['id']}")


@pytest.fixture(scope="module")
def config_home(tmp_path_factory, gw2, stock):
    """$XDG_CONFIG_HOME with a gateways.toml naming both servers (and one with a wrong token)."""
    home = tmp_path_factory.mktemp("xdg")
    (home / "kgate").mkdir()
    (home / "kgate" / "gateways.toml").write_text(
        f'[gateways.gw2]\nurl = "{gw2.url}"\ntoken_env = "GW2_TOKEN"\n\n'
        f'[gateways.gw2bad]\nurl = "{gw2.url}/"\ntoken_env = "GW2_BAD_TOKEN"\n\n'
        f'[gateways.js]\nurl = "{stock.url}"\ntoken = "{STOCK_TOKEN}"\n\n'
        f'[gateways.jsbad]\nurl = "{stock.url}"\ntoken = "{WRONG}"\n')
    return home


def cli_env(config_home, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KGATE_", "JUPYTER"))}
    env.update({"XDG_CONFIG_HOME": str(config_home), "GW2_TOKEN": TOKEN, "GW2_BAD_TOKEN": WRONG,
                # no kgate's own token of this user's: a real ~/.local/state/kgate/token stays out
                "XDG_STATE_HOME": str(config_home / "no-state")})
    env.update(extra)
    return env


def kernels(kgate_bin, config_home, *args, timeout=40, **env):
    """Runs `kgate kernels ARGS`: (exit code, stdout, stderr, seconds)."""
    start = time.monotonic()
    p = subprocess.run([kgate_bin, "kernels", *args], env=cli_env(config_home, **env), capture_output=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    took = time.monotonic() - start
    out, err = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    for t in TOKENS:
        assert t not in out and t not in err, f"a token was printed:\nstdout:\n{out}\nstderr:\n{err}"
    return p.returncode, out, err, took


# --------------------------------------------------------------------------------------------
# A second kgate with a token

def test_second_kgate_by_name(kgate_bin, config_home, gw2, gw2_kernel):
    rc, out, err, _ = kernels(kgate_bin, config_home, "--host", "gw2")
    assert rc == 0, (rc, out, err)
    assert f"gateway gw2: {gw2.url}" in out and "(kgate)" in out, out
    assert "kernelspecs (default: python3):" in out and DISPLAY_NAME in out, out
    line = next((l for l in out.splitlines() if gw2_kernel in l), None)
    assert line and "python3" in line and "idle" in line and "connections=" in line, out
    assert re.search(r"age \d+ s", line) and re.search(r"idle \d+ s", line), line  # kgate's extension model
    assert "sessions: none" in out, out  # kgate serves the sessions API; there are none yet
    assert err == "", err


def test_second_kgate_json(kgate_bin, config_home, gw2, gw2_kernel):
    rc, out, err, _ = kernels(kgate_bin, config_home, "--host", "gw2", "--json")
    assert rc == 0, (rc, out, err)
    j = json.loads(out)
    assert j["url"] == gw2.url and j["name"] == "gw2" and j["kgate"] is True, j
    assert j["sessions_supported"] is True and j["sessions"] == [] and j["errors"] == [], j
    assert j["default_kernelspec"] == "python3", j
    assert {"name": "python3", "display_name": DISPLAY_NAME, "language": "python", "default": True} in j["kernelspecs"], j
    k = next(k for k in j["kernels"] if k["id"] == gw2_kernel)
    assert k["name"] == "python3" and k["execution_state"] in ("idle", "busy") and isinstance(k["connections"], int), k
    assert "claim" in k and "running_job" in k and k["last_activity"], k
    assert k["age_seconds"] >= 0 and k["idle_seconds"] >= 0 and k["cull_after_seconds"] is None, k


def test_second_kgate_by_url_takes_the_token_gateways_toml_pairs_with_it(kgate_bin, config_home, gw2, gw2_kernel):
    rc, out, err, _ = kernels(kgate_bin, config_home, "--host", gw2.url + "/")
    assert rc == 0 and gw2_kernel in out, (rc, out, err)


def test_a_url_host_gets_no_kgate_token(kgate_bin, config_home, gw2):
    """$KGATE_TOKEN is the default gateway's: a URL nobody paired a token with gets none."""
    url = gw2.url.replace("127.0.0.1", "localhost")
    rc, out, err, _ = kernels(kgate_bin, config_home, "--host", url, KGATE_TOKEN=TOKEN)
    assert rc == 1, (rc, out, err)
    assert "requires a token (HTTP 401) and none was sent: a URL given as host gets no token" in err, err


def test_default_gateway_is_kgate_url(kgate_bin, config_home, gw2, gw2_kernel):
    rc, out, err, _ = kernels(kgate_bin, config_home, KGATE_URL=gw2.url, KGATE_TOKEN=TOKEN)
    assert rc == 0 and gw2_kernel in out and out.startswith(f"gateway {gw2.url}"), (rc, out, err)


def test_wrong_token_is_refused_clearly(kgate_bin, config_home, gw2):
    rc, out, err, _ = kernels(kgate_bin, config_home, "--host", "gw2bad")
    assert rc == 1, (rc, out, err)
    assert out == "", out
    assert f"the gateway at {gw2.url}/ refused the token (HTTP 401)" in err, err
    assert "token_env of [gateways.gw2bad] in gateways.toml" in err, err
    assert len(err.strip().splitlines()) == 1, f"one message, not one per endpoint:\n{err}"


def test_wrong_token_json_prints_nothing_on_stdout(kgate_bin, config_home):
    rc, out, err, _ = kernels(kgate_bin, config_home, "--host", "gw2bad", "--json")
    assert rc == 1 and out == "" and "refused the token (HTTP 401)" in err, (rc, out, err)


def test_missing_token_says_none_was_sent(kgate_bin, config_home, gw2):
    rc, out, err, _ = kernels(kgate_bin, config_home, KGATE_URL=gw2.url)
    assert rc == 1, (rc, out, err)
    assert "requires a token (HTTP 401) and none was sent" in err and "KGATE_TOKEN" in err, err


def test_unknown_name_lists_known_names(kgate_bin, config_home):
    rc, out, err, _ = kernels(kgate_bin, config_home, "--host", "nosuch")
    assert rc == 2, (rc, out, err)
    assert "unknown gateway 'nosuch'" in err, err
    assert "known gateways: gw2, gw2bad, js, jsbad" in err, err


def test_unset_token_env_is_a_bad_host(kgate_bin, config_home):
    rc, out, err, _ = kernels(kgate_bin, config_home, "--host", "gw2", GW2_TOKEN="")
    assert rc == 2 and "$GW2_TOKEN, which is not set" in err, (rc, out, err)


def test_https_dead_port_cannot_reach(kgate_bin, config_home):
    """https URLs are accepted (tests/integration/test_mcp_tls.py covers real TLS); a dead port
    is named like an http one."""
    port = free_port()
    rc, out, err, took = kernels(kgate_bin, config_home, "--host", f"https://127.0.0.1:{port}")
    assert rc == 1, (rc, out, err)
    assert f"cannot reach https://127.0.0.1:{port}: connection refused" in err, err
    assert took < 5, f"took {took:.1f} s"


def test_dead_port_cannot_reach(kgate_bin, config_home):
    port = free_port()
    rc, out, err, took = kernels(kgate_bin, config_home, "--host", f"http://127.0.0.1:{port}")
    assert rc == 1, (rc, out, err)
    assert f"cannot reach http://127.0.0.1:{port}: connection refused" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert took < 5, f"took {took:.1f} s"


def test_silent_server_times_out_within_the_bound(kgate_bin, config_home):
    """A server that accepts and never answers: the listing ends on its own deadline."""
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(16)
    try:
        port = lst.getsockname()[1]
        rc, out, err, took = kernels(kgate_bin, config_home, "--host", f"http://127.0.0.1:{port}")
    finally:
        lst.close()
    assert rc == 1, (rc, out, err)
    assert f"cannot reach http://127.0.0.1:{port}: no answer within" in err, err
    assert took < 18, f"took {took:.1f} s"


def test_not_json_is_said(kgate_bin, config_home, tmp_path):
    """A web server that is not Jupyter: HTML bodies are named as such."""
    (tmp_path / "api").mkdir()
    for name in ("kernelspecs", "kernels", "sessions"):
        (tmp_path / "api" / name).write_text("<!DOCTYPE html><html>not jupyter</html>")
    port = free_port()
    srv = subprocess.Popen(["/usr/bin/python3", "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                           cwd=str(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def up():
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return True
            except OSError:
                return False
        deadline = time.monotonic() + 10
        while not up() and time.monotonic() < deadline:
            time.sleep(0.1)
        rc, out, err, _ = kernels(kgate_bin, config_home, "--host", f"http://127.0.0.1:{port}")
    finally:
        srv.terminate()
        srv.wait(10)
    assert rc == 1 and out == "", (rc, out, err)
    assert "GET api/kernels on" in err and "not JSON" in err and "<!DOCTYPE html>" in err, err


@pytest.fixture
def tls_server(tmp_path):
    """An https server (self-signed) on a free port: the address of a TLS-speaking listener."""
    if not shutil.which("openssl"):
        pytest.skip("no openssl command to make a certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True, timeout=60)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(16)
    lst.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = lst.accept()
            except OSError:
                continue
            conn.settimeout(3)
            try:
                with ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1024)
            except (OSError, ssl.SSLError):
                pass
            finally:
                conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield lst.getsockname()[1]
    stop.set()
    t.join(5)
    lst.close()


def test_http_url_at_a_tls_server_names_tls(kgate_bin, config_home, tls_server):
    rc, out, err, took = kernels(kgate_bin, config_home, "--host", f"http://127.0.0.1:{tls_server}")
    assert rc == 1, (rc, out, err)
    assert "speaks TLS" in err and "https" in err, err
    assert took < 10, f"took {took:.1f} s"


# --------------------------------------------------------------------------------------------
# A stock jupyter_server

def test_stock_server_lists_specs_kernel_and_session(kgate_bin, config_home, stock, stock_session):
    _, kernel_id, path = stock_session
    rc, out, err, _ = kernels(kgate_bin, config_home, "--host", "js")
    assert rc == 0, (rc, out, err)
    assert "without kgate's extensions" in out, out
    assert "kernelspecs (default: python3):" in out, out
    line = next((l for l in out.splitlines() if kernel_id in l and "session" in l), None)
    assert line and f"session {path}" in line, out
    assert "sessions (1):" in out and f"{path}  notebook  kernel {kernel_id}" in out, out

    rc, out, err, _ = kernels(kgate_bin, config_home, "--host", "js", "--json")
    assert rc == 0, (rc, out, err)
    j = json.loads(out)
    assert j["kgate"] is False and j["sessions_supported"] is True and j["errors"] == [], j
    assert any(s["name"] == "python3" for s in j["kernelspecs"]), j
    k = next(k for k in j["kernels"] if k["id"] == kernel_id)
    assert k["sessions"] == [path] and "claim" not in k, k
    s = next(s for s in j["sessions"] if s["kernel"] == kernel_id)
    assert s["path"] == path and s["type"] == "notebook" and s["name"] == "listing.ipynb", s


def test_stock_server_wrong_token(kgate_bin, config_home, stock):
    rc, out, err, _ = kernels(kgate_bin, config_home, "--host", "jsbad")
    assert rc == 1 and out == "", (rc, out, err)
    assert f"the gateway at {stock.url} refused the token (HTTP 40" in err, err
    assert "[gateways.jsbad]" in err, err


# --------------------------------------------------------------------------------------------
# kgate-mcp's list_kernels(host)

def test_mcp_list_kernels_host(mcp_bin, tmp_path, config_home, gw2, gw2_kernel, stock, stock_session):  # noqa: F811
    home = tmp_path / "mcp"
    m = Mcp(mcp_bin, home, env_extra={"XDG_CONFIG_HOME": str(config_home), "GW2_TOKEN": TOKEN,
                                      "GW2_BAD_TOKEN": WRONG})
    try:
        init = m.request(1, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                           "clientInfo": {"name": "remote-test", "version": "0"}})
        assert "result" in init, init
        m.notify("notifications/initialized")

        def call(id_, **args):
            m.send({"jsonrpc": "2.0", "id": id_, "method": "tools/call",
                    "params": {"name": "list_kernels", "arguments": args}})
            r = m.reply(id_, timeout=30)
            assert "result" in r, r
            return "\n".join(b.get("text", "") for b in r["result"]["content"])

        text = call(2, host="gw2")
        assert gw2_kernel in text and DISPLAY_NAME in text and "(kgate)" in text, text
        text = call(3, host="gw2bad")
        assert "refused the token (HTTP 401)" in text and "[gateways.gw2bad]" in text, text
        text = call(4, host="js")
        assert stock_session[1] in text and f"session {stock_session[2]}" in text, text
        text = call(5, host="nosuch")
        assert "unknown gateway 'nosuch'" in text and "known gateways: gw2, gw2bad, js, jsbad" in text, text
        m.assert_stdout_is_protocol()
        rc, _ = m.close(timeout=10)
        assert rc == 0
    finally:
        m.kill()
    log = m.stderr_path.read_text(errors="replace")
    for t in TOKENS:
        assert t not in log and t not in m.stdout_text(), "a token was logged or printed"
