"""TLS gateways, the client side: kgate-mcp and `kgate kernels --host` speak https:// and
wss:// to a stock jupyter_server that serves a self-signed certificate.

Certificates are checked by default, so that server is refused with a named error; `verify =
false` connects (encrypted, not authenticated: one warning on stderr); `ca_file` trusts the
certificate with the checks on; $KGATE_CA_FILE and KGATE_TLS_VERIFY=0 do the same for the
default gateway. An https:// URL at a plain http server says the TLS handshake failed and
suggests http://. The token is never printed.

    KGATE_BIN=build/gateway/kgate KGATE_MCP_BIN=build/translator/kgate-mcp \\
        /usr/bin/python3 -m pytest -q tests/integration/test_mcp_tls.py
"""

import http.client
import json
import os
import shutil
import ssl
import subprocess
import time

import pytest

from conftest import die_with_parent
from test_mcp_stock import TOKEN, StockServer
from test_mcp_transcript import Mcp, initialize, mcp_bin  # noqa: F401 (mcp_bin is a fixture)

WARNING = "the connection is encrypted but not authenticated"


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1: (cert.pem, key.pem)."""
    if not shutil.which("openssl"):
        pytest.skip("no openssl command to make a certificate")
    d = tmp_path_factory.mktemp("tls_cert")
    key, crt = d / "key.pem", d / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(crt),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return crt, key


class TlsStockServer(StockServer):
    """StockServer (a stock jupyter_server with TOKEN), restarted to serve https."""

    def __init__(self, root, crt, key):
        super().__init__(root)
        self.proc.kill()
        self.proc.wait()
        self.log.close()
        self.cafile = str(crt)
        self.args += [f"--certfile={crt}", f"--keyfile={key}"]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("JUPYTER", "KERNEL_", "PYTHON", "KGATE_"))}
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)  # jupyter-clean-cfg-* dirs go here
        env.update({"JUPYTER_PLATFORM_DIRS": "1", "JUPYTER_NO_CONFIG": "1", "TMPDIR": str(self.root / "tmp"),
                    "JUPYTER_RUNTIME_DIR": str(self.root / "runtime3"),
                    "JUPYTER_CONFIG_DIR": str(self.root / "config3"),
                    "JUPYTER_DATA_DIR": str(self.root / "data3")})
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, env=env, cwd=str(self.notebook_dir),
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     preexec_fn=lambda: die_with_parent())
        self.url = f"https://127.0.0.1:{self.port}"

    def http(self, method, path, body=None, timeout=60):
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout,
                                           context=ssl.create_default_context(cafile=self.cafile))
        try:
            conn.request(method, path, body=body, headers={"Authorization": f"token {TOKEN}"})
            r = conn.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            conn.close()


@pytest.fixture(scope="module")
def tls_stock(tmp_path_factory, cert):
    js = TlsStockServer(tmp_path_factory.mktemp("tls_stock"), *cert)
    try:
        js.wait_ready()
        yield js
    finally:
        js.stop()


@pytest.fixture(scope="module")
def plain_stock(tmp_path_factory):
    js = StockServer(tmp_path_factory.mktemp("plain_stock"))
    try:
        js.wait_ready()
        yield js
    finally:
        js.stop()


@pytest.fixture(scope="module")
def config_home(tmp_path_factory, tls_stock, plain_stock, cert):
    """$XDG_CONFIG_HOME/kgate/gateways.toml naming the https server three ways, and the plain
    http server by an https:// URL."""
    home = tmp_path_factory.mktemp("tls_xdg")
    (home / "kgate").mkdir()
    port = tls_stock.port
    (home / "kgate" / "gateways.toml").write_text(
        f'[gateways.strict]\nurl = "https://127.0.0.1:{port}"\ntoken = "{TOKEN}"\n\n'
        f'[gateways.insecure]\nurl = "https://127.0.0.1:{port}/"\ntoken = "{TOKEN}"\nverify = false\n\n'
        f'[gateways.pinned]\nurl = "https://127.0.0.1:{port}"\ntoken = "{TOKEN}"\nca_file = "{cert[0]}"\n\n'
        f'[gateways.plain]\nurl = "https://127.0.0.1:{plain_stock.port}"\ntoken = "{TOKEN}"\n')
    return home


def start_mcp(binary, tmp_path, config_home, **env):
    """kgate-mcp with config_home's gateways.toml, initialized."""
    extra = {"XDG_CONFIG_HOME": str(config_home)}
    extra.update(env)
    m = Mcp(binary, tmp_path / "mcp", env_extra=extra)
    initialize(m)
    m.next_id = 1
    return m


def tool(m, name, timeout=90, **args):
    """(isError, text) of a tools/call."""
    m.next_id += 1
    m.send({"jsonrpc": "2.0", "id": m.next_id, "method": "tools/call", "params": {"name": name, "arguments": args}})
    r = m.reply(m.next_id, timeout=timeout)
    assert "result" in r, r
    return r["result"].get("isError", False), "\n".join(b.get("text", "") for b in r["result"]["content"])


def finish(m, token=TOKEN):
    """Closes kgate-mcp: its stderr, after checking that `token` reached neither stdout nor stderr."""
    m.close(timeout=30)
    err, out = m.stderr_text(), m.stdout_text()
    m.kill()
    assert token not in out and token not in err, f"the token was printed:\nstdout:\n{out}\nstderr:\n{err}"
    return err


def test_default_verify_refuses_a_self_signed_certificate(mcp_bin, tmp_path, config_home, tls_stock):
    m = start_mcp(mcp_bin, tmp_path, config_home)
    try:
        _, text = tool(m, "connect", host="strict")  # a reply, not a crash
        assert (f"TLS: certificate verify failed for 127.0.0.1:{tls_stock.port} (self-signed certificate): "
                "set ca_file, or verify = false in gateways.toml for [gateways.strict]") in text, text
        m.ping(999)  # still serving
    finally:
        err = finish(m)
    assert WARNING not in err, err


def test_verify_false_connects_and_executes_over_wss(mcp_bin, tmp_path, config_home, tls_stock):
    m = start_mcp(mcp_bin, tmp_path, config_home)
    try:
        is_error, text = tool(m, "connect", host="insecure")
        assert not is_error and "created kernel" in text, text
        is_error, text = tool(m, "execute", code="1+1")  # a stock server: the cell goes over the wss channel
        assert not is_error and text == "2", text
        is_error, text = tool(m, "list_kernels")
        assert "<- current" in text, text
        is_error, text = tool(m, "stop_kernel")
        assert "stopped kernel" in text, text
    finally:
        err = finish(m)
    assert err.count(WARNING) == 1, f"one warning for the endpoint:\n{err}"
    assert "verify = false in [gateways.insecure]" in err, err
    status, _, body = tls_stock.http("GET", "/api/kernels")
    assert status == 200 and body.strip() == b"[]", body


def test_ca_file_trusts_the_certificate(mcp_bin, tmp_path, config_home, tls_stock):
    m = start_mcp(mcp_bin, tmp_path, config_home)
    try:
        is_error, text = tool(m, "connect", host="pinned")
        assert not is_error and "created kernel" in text, text
        is_error, text = tool(m, "execute", code="print('over tls')\n6*7")
        assert not is_error and "over tls" in text and "42" in text, text
        is_error, text = tool(m, "stop_kernel")
        assert "stopped kernel" in text, text
    finally:
        err = finish(m)
    assert WARNING not in err, err


def test_default_gateway_takes_the_environment(mcp_bin, tmp_path, config_home, tls_stock, cert):
    """KGATE_URL=https://...: refused by default, with $KGATE_CA_FILE or KGATE_TLS_VERIFY=0 listed."""
    base = {"KGATE_URL": tls_stock.url, "KGATE_TOKEN": TOKEN}
    m = start_mcp(mcp_bin, tmp_path / "a", config_home, **base)
    try:
        _, text = tool(m, "list_kernels")
        assert "certificate verify failed" in text and "KGATE_CA_FILE" in text, text
    finally:
        finish(m)
    for extra in ({"KGATE_CA_FILE": str(cert[0])}, {"KGATE_TLS_VERIFY": "0"}):
        m = start_mcp(mcp_bin, tmp_path / next(iter(extra)), config_home, **base, **extra)
        try:
            is_error, text = tool(m, "list_kernels")
            assert not is_error and "certificate" not in text and "kernels" in text, (extra, text)
        finally:
            err = finish(m)
        assert (WARNING in err) == ("KGATE_TLS_VERIFY" in extra), (extra, err)


def test_https_url_at_a_plain_http_server_names_the_handshake(mcp_bin, tmp_path, config_home, plain_stock):
    m = start_mcp(mcp_bin, tmp_path, config_home)
    try:
        start = time.monotonic()
        _, text = tool(m, "connect", host="plain")
        took = time.monotonic() - start
        assert f"TLS: handshake failed with 127.0.0.1:{plain_stock.port}" in text, text
        assert f"use http://127.0.0.1:{plain_stock.port}" in text, text
        assert took < 20, f"took {took:.1f} s"
    finally:
        finish(m)


# --------------------------------------------------------------------------------------------
# kgate kernels --host NAME (the same translator sources, in kgate)

def kernels(kgate_bin, config_home, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KGATE_", "JUPYTER"))}
    env["XDG_CONFIG_HOME"] = str(config_home)
    p = subprocess.run([kgate_bin, "kernels", *args], env=env, capture_output=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    out, err = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    assert TOKEN not in out and TOKEN not in err, f"the token was printed:\nstdout:\n{out}\nstderr:\n{err}"
    return p.returncode, out, err


@pytest.fixture(scope="module")
def tls_kernel(tls_stock):
    """A running kernel on the https server (its id)."""
    status, _, body = tls_stock.http("POST", "/api/kernels", json.dumps({"name": "python3"}).encode())
    assert status == 201, (status, body, tls_stock.log_tail())
    kid = json.loads(body)["id"]
    yield kid
    tls_stock.http("DELETE", f"/api/kernels/{kid}")


@pytest.mark.parametrize("name", ["insecure", "pinned"])
def test_kgate_kernels_lists_an_https_server(kgate_bin, config_home, tls_stock, tls_kernel, name):
    rc, out, err = kernels(kgate_bin, config_home, "--host", name)
    assert rc == 0, (rc, out, err)
    assert f"gateway {name}: https://127.0.0.1:{tls_stock.port}" in out and tls_kernel in out, out
    assert (WARNING in err) == (name == "insecure"), err


def test_kgate_kernels_names_the_certificate_failure(kgate_bin, config_home, tls_stock):
    rc, out, err = kernels(kgate_bin, config_home, "--host", "strict")
    assert rc == 1 and out == "", (rc, out, err)
    assert "certificate verify failed" in err and "[gateways.strict]" in err, err
