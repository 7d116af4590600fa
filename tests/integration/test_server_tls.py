"""kgate serving https and wss (`kgate serve --certfile F --keyfile F`).

A self-signed certificate (127.0.0.1 and localhost) made here: REST over https and a kernel
websocket over wss with a client that trusts it; kgate-mcp refuses it by default (a named
certificate error in the tool reply), works with `verify = false` and with `ca_file`; a plain
http client on the TLS port gets a 400 naming https and the server goes on serving, also while
a client that never starts its handshake holds a connection; the bind rules (a non-loopback
--ip needs a token, TLS or not); clear startup errors for a key that does not match, a missing
file, and only one of the two.

    KGATE_BIN=build/gateway/kgate KGATE_MCP_BIN=build/translator/kgate-mcp \\
        /usr/bin/python3 -m pytest -q tests/integration/test_server_tls.py
"""

import functools
import http.client
import json
import re
import shutil
import socket
import ssl
import subprocess

import pytest
import websocket

from conftest import Kgate, make_jupyter_env
from test_mcp_tls import finish, start_mcp, tool
from test_mcp_transcript import mcp_bin  # noqa: F401 (a fixture)

TOKEN = "kgate-server-tls-token-5e2a"
HTTPS_RE = re.compile(r"listening on https://([^\s/:]+|\[[^\]]+\]):(\d+)/")
WARNING = "the connection is encrypted but not authenticated"


def make_cert(d, name):
    """A self-signed certificate for 127.0.0.1 and localhost: (cert.pem, key.pem)."""
    key, crt = d / f"{name}-key.pem", d / f"{name}-cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(crt), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    return crt, key


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """Two unrelated self-signed certificates: {"a": (cert, key), "b": (cert, key)}."""
    if not shutil.which("openssl"):
        pytest.skip("no openssl command to make a certificate")
    d = tmp_path_factory.mktemp("server_tls_cert")
    return {"a": make_cert(d, "a"), "b": make_cert(d, "b")}


class TlsKgate(Kgate):
    """A kgate with --certfile/--keyfile; it counts as started once it logged
    `listening on https://HOST:PORT/`, and http() speaks https trusting `cafile`."""

    LISTEN_PATTERN = HTTPS_RE

    def __init__(self, binary, root, cert, key, **kw):
        kw["extra_args"] = ["--certfile", str(cert), "--keyfile", str(key)] + list(kw.get("extra_args", ()))
        super().__init__(binary, root, **kw)
        self.cafile = str(cert)

    def start(self, timeout=10.0):
        super().start(timeout)
        self.url = f"https://127.0.0.1:{self.port}"
        self.ws_base = f"wss://127.0.0.1:{self.port}"
        return self

    def context(self):
        return ssl.create_default_context(cafile=self.cafile)

    def _connection(self, timeout):
        return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=self.context())

    def connect(self, kernel_id, session_id=None, **kw):
        """A wss KernelWS that trusts the certificate."""
        real = websocket.create_connection
        websocket.create_connection = functools.partial(real, sslopt={"ca_certs": self.cafile})
        try:
            return super().connect(kernel_id, session_id=session_id, **kw)
        finally:
            websocket.create_connection = real


@pytest.fixture(scope="module")
def kgate_tls(kgate_bin, tmp_path_factory, certs):
    kg = TlsKgate(kgate_bin, tmp_path_factory.mktemp("kgate_tls"), *certs["a"], token=TOKEN).start()
    try:
        yield kg
    finally:
        kg.cleanup_kernels()
        kg.stop()


@pytest.fixture(scope="module")
def config_home(tmp_path_factory, kgate_tls, certs):
    """gateways.toml naming the https kgate three ways."""
    home = tmp_path_factory.mktemp("server_tls_xdg")
    (home / "kgate").mkdir()
    url = f"https://127.0.0.1:{kgate_tls.port}"
    (home / "kgate" / "gateways.toml").write_text(
        f'[gateways.strict]\nurl = "{url}"\ntoken = "{TOKEN}"\n\n'
        f'[gateways.insecure]\nurl = "{url}/"\ntoken = "{TOKEN}"\nverify = false\n\n'
        f'[gateways.pinned]\nurl = "{url}"\ntoken = "{TOKEN}"\nca_file = "{certs["a"][0]}"\n')
    return home


def serve_fails(kgate_bin, tmp_path, *args, timeout=15):
    """`kgate serve ARGS` that must refuse to start: (exit code, stderr)."""
    env = make_jupyter_env(tmp_path)
    p = subprocess.run([kgate_bin, "serve", "--port", "0", *args], env=env, cwd=str(tmp_path),
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    err = p.stderr.decode(errors="replace")
    assert "listening on" not in err, err
    return p.returncode, err


# --------------------------------------------------------------------------------------------
# https and wss

def test_https_rest_and_wss_execute(kgate_tls):
    assert any("listening on https://127.0.0.1:" in ln for ln in kgate_tls.log_lines), kgate_tls.log_tail()
    status, hdrs, body = kgate_tls.rest("GET", "/api")
    assert status == 200 and "version" in body, (status, body)
    status, _, _ = kgate_tls.rest("GET", "/api/kernels", auth=False)
    assert status == 401
    kid = kgate_tls.start_kernel()["id"]
    with kgate_tls.connect(kid) as ws:
        assert ws.ws.sock.version() in ("TLSv1.2", "TLSv1.3"), ws.ws.sock.version()
        assert ws.run("print('over wss', 6 * 7)") == "over wss 42\n"
    assert kgate_tls.delete_kernel(kid) == 204


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # offering TLS 1.0/1.1 is the point
def test_old_tls_versions_are_refused(kgate_tls):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(kgate_tls.cafile)
    try:
        ctx.minimum_version = ssl.TLSVersion.TLSv1
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")  # so that it is kgate, not this client, that refuses
    except (ValueError, AttributeError):
        pytest.skip("this Python's OpenSSL cannot offer TLS 1.1")
    with socket.create_connection(("127.0.0.1", kgate_tls.port), timeout=10) as raw:
        with pytest.raises(ssl.SSLError):
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1"):
                pass
    assert kgate_tls.rest("GET", "/api")[0] == 200


def test_plain_http_on_the_tls_port_gets_a_400_and_the_server_goes_on(kgate_tls):
    with socket.create_connection(("127.0.0.1", kgate_tls.port), timeout=10) as s:
        s.sendall(b"GET /api/kernels HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break  # kgate closes after the answer
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), data
    assert "use https://127.0.0.1/api/kernels" in json.loads(body)["message"], body
    # Bytes that are neither TLS nor HTTP: closed, no crash.
    with socket.create_connection(("127.0.0.1", kgate_tls.port), timeout=10) as s:
        s.sendall(b"\x00\x01\x02garbage\r\n\r\n")
        s.settimeout(10)
        try:
            while s.recv(65536):
                pass
        except ConnectionResetError:
            pass
    assert kgate_tls.proc.poll() is None
    assert kgate_tls.rest("GET", "/api")[0] == 200


def test_a_silent_client_does_not_hold_up_others(kgate_tls):
    """The handshake waits on the Asio thread without blocking it: while one connection says
    nothing, others are served."""
    with socket.create_connection(("127.0.0.1", kgate_tls.port), timeout=10):
        for _ in range(3):
            assert kgate_tls.rest("GET", "/api", timeout=5)[0] == 200


# --------------------------------------------------------------------------------------------
# kgate-mcp against the https kgate

def test_kgate_mcp_refuses_the_self_signed_certificate_by_default(mcp_bin, tmp_path, config_home, kgate_tls):
    m = start_mcp(mcp_bin, tmp_path, config_home)
    try:
        _, text = tool(m, "connect", host="strict")  # a reply, not a crash
        assert (f"TLS: certificate verify failed for 127.0.0.1:{kgate_tls.port} (self-signed certificate): "
                "set ca_file, or verify = false in gateways.toml for [gateways.strict]") in text, text
        m.ping(999)
    finally:
        err = finish(m, TOKEN)
    assert WARNING not in err, err


@pytest.mark.parametrize("name", ["insecure", "pinned"])
def test_kgate_mcp_executes_over_https(mcp_bin, tmp_path, config_home, kgate_tls, name):
    m = start_mcp(mcp_bin, tmp_path, config_home)
    try:
        is_error, text = tool(m, "connect", host=name)
        assert not is_error and "created kernel" in text, text
        is_error, text = tool(m, "execute", code="print('over tls')\n6*7")
        assert not is_error and "over tls" in text and "42" in text, text
        is_error, text = tool(m, "stop_kernel")
        assert "stopped kernel" in text, text
    finally:
        err = finish(m, TOKEN)
    assert (WARNING in err) == (name == "insecure"), err
    status, _, body = kgate_tls.rest("GET", "/api/kernels")
    assert status == 200 and body == [], body


# --------------------------------------------------------------------------------------------
# Bind rules and startup errors

def test_non_loopback_with_tls_still_needs_a_token(kgate_bin, tmp_path, certs):
    cert, key = certs["a"]
    rc, err = serve_fails(kgate_bin, tmp_path, "--ip", "0.0.0.0", "--no-token", "--certfile", str(cert), "--keyfile", str(key))
    assert rc != 0 and "refusing to listen on 0.0.0.0 without a token" in err, (rc, err)


def test_non_loopback_with_token_and_tls_starts(kgate_bin, tmp_path, certs):
    kg = TlsKgate(kgate_bin, tmp_path, *certs["a"], ip="0.0.0.0", token=TOKEN).start()
    try:
        assert any("listening on https://0.0.0.0:" in ln for ln in kg.log_lines), kg.log_tail()
        assert kg.rest("GET", "/api/kernelspecs")[0] == 200
        assert kg.rest("GET", "/api/kernelspecs", auth=False)[0] == 401
        assert not any("clear text" in ln for ln in kg.log_lines), kg.log_tail()
    finally:
        kg.stop()


def test_a_key_that_does_not_match_the_certificate(kgate_bin, tmp_path, certs):
    rc, err = serve_fails(kgate_bin, tmp_path, "--certfile", str(certs["a"][0]), "--keyfile", str(certs["b"][1]))
    assert rc != 0, err
    assert f"keyfile {certs['b'][1]} does not match the certificate in certfile {certs['a'][0]}" in err, err


def test_missing_and_unpaired_files(kgate_bin, tmp_path, certs):
    cert, key = certs["a"]
    rc, err = serve_fails(kgate_bin, tmp_path, "--certfile", str(tmp_path / "nope.pem"), "--keyfile", str(key))
    assert rc != 0 and f"cannot read certfile {tmp_path / 'nope.pem'}: No such file or directory" in err, err
    rc, err = serve_fails(kgate_bin, tmp_path, "--certfile", str(cert))
    assert rc != 0 and "TLS needs both a certfile and a keyfile; only the certfile was given" in err, err
    rc, err = serve_fails(kgate_bin, tmp_path, "--certfile", str(key), "--keyfile", str(key))
    assert rc != 0 and f"certfile {key} is not a PEM certificate" in err, err
