"""kgate-mcp against a stock jupyter_server (not kgate): connect and execute still work over
the plain kernels API and websocket, and the reply says kgate's features are unavailable."""

import json
import os
import select
import subprocess
import time

import pytest

from conftest import PYTHON, die_with_parent, free_port
from test_interop import JupyterServer

TOKEN = "stock-token-7d1f"


def mcp_bin():
    path = os.environ.get("KGATE_MCP_BIN")
    if path:
        return path
    kgate = os.environ.get("KGATE_BIN", "")
    guess = os.path.join(os.path.dirname(os.path.dirname(kgate)), "translator", "kgate-mcp") if kgate else ""
    if guess and os.path.exists(guess):
        return guess
    return os.path.join(os.path.dirname(__file__), "..", "..", "build", "translator", "kgate-mcp")


class StockServer(JupyterServer):
    """jupyter_server running its own kernels, with a token."""

    def __init__(self, root):
        super().__init__(root, "unused")
        self.proc.kill()
        self.proc.wait()
        self.log.close()
        self.port = free_port()
        self.args = [a for a in self.args if not a.startswith("--gateway-url")
                     and not a.startswith("--port") and not a.startswith("--ServerApp.token")]
        self.args += [f"--port={self.port}", f"--ServerApp.token={TOKEN}"]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("JUPYTER", "KERNEL_", "PYTHON", "KGATE_"))}
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)  # jupyter-clean-cfg-* dirs go here
        env.update({"JUPYTER_PLATFORM_DIRS": "1", "JUPYTER_NO_CONFIG": "1", "TMPDIR": str(self.root / "tmp"),
                    "JUPYTER_RUNTIME_DIR": str(self.root / "runtime2"),
                    "JUPYTER_CONFIG_DIR": str(self.root / "config2"),
                    "JUPYTER_DATA_DIR": str(self.root / "data2")})
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, env=env, cwd=str(self.notebook_dir),
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     preexec_fn=lambda: die_with_parent())
        self.url = f"http://127.0.0.1:{self.port}"

    def http(self, method, path, body=None, timeout=60):
        import http.client
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        headers = {"Authorization": f"token {TOKEN}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()


class Mcp:
    def __init__(self, url, cfg_dir):
        env = dict(os.environ, KGATE_URL=url, KGATE_TOKEN=TOKEN, XDG_CONFIG_HOME=str(cfg_dir))
        self.proc = subprocess.Popen([mcp_bin(), "--log-level", "info"], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     preexec_fn=lambda: die_with_parent())
        self.next_id = 1
        self.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                    "clientInfo": {"name": "test", "version": "0"}})

    def request(self, method, params, timeout=60):
        rid = self.next_id
        self.next_id += 1
        self.proc.stdin.write((json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                                           "params": params}) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                line = self.proc.stdout.readline()
                assert line, "kgate-mcp closed stdout"
                msg = json.loads(line)
                if msg.get("id") == rid:
                    return msg
        raise AssertionError(f"no reply to {method} within {timeout}s")

    def tool(self, name, **args):
        msg = self.request("tools/call", {"name": name, "arguments": args})
        assert "result" in msg, msg
        return msg["result"], "\n".join(b.get("text", "") for b in msg["result"]["content"])

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        err = self.proc.stderr.read().decode(errors="replace")
        self.proc.stderr.close()
        self.proc.stdout.close()
        return err


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    js = StockServer(tmp_path_factory.mktemp("stock_server"))
    try:
        js.wait_ready()
        yield js
    finally:
        js.stop()


def test_connect_and_execute_on_a_stock_server(stock, tmp_path):
    m = Mcp(stock.url, tmp_path)
    try:
        res, text = m.tool("connect")
        assert not res["isError"], text
        assert "created kernel" in text and "not a kgate gateway" in text, text
        res, text = m.tool("execute", code="1+1")
        assert text == "2", text
        res, text = m.tool("execute", code="print('hello')\n1/0")
        assert "hello" in text and "ZeroDivisionError" in text and "\x1b[" not in text, text
        res, text = m.tool("list_kernels")
        assert "<- current" in text, text
        res, text = m.tool("stop_kernel")
        assert "stopped kernel" in text, text
    finally:
        err = m.close()
    assert TOKEN not in err, "the token was logged"
    status, _, body = stock.http("GET", "/api/kernels")
    assert status == 200 and json.loads(body) == [], body
