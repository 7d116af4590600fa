"""A stock jupyter_server 1.23 running with --gateway-url pointing at kgate, driven like a
browser through its own REST API and websocket (assertions are on jupyter_server's answers)."""

import http.client
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from conftest import DISPLAY_NAME, PYTHON, KernelWS, die_with_parent, free_port, wait_until

MARKER = "interop-" + uuid.uuid4().hex


class JupyterServer:
    def __init__(self, root, gateway_url, extra_args=()):
        self.root = Path(root)
        self.port = free_port()
        self.notebook_dir = self.root / "nbroot"
        (self.notebook_dir / "nb").mkdir(parents=True)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("JUPYTER", "KERNEL_", "PYTHON", "KGATE_"))}
        env.update({
            "JUPYTER_PLATFORM_DIRS": "1",
            "JUPYTER_NO_CONFIG": "1",
            "JUPYTER_RUNTIME_DIR": str(self.root / "runtime"),
            "JUPYTER_CONFIG_DIR": str(self.root / "config"),
            "JUPYTER_DATA_DIR": str(self.root / "data"),
            "JUPYTER_PATH": str(self.root / "share"),
            "KERNEL_INTEROP_MARKER": MARKER,
        })
        self.args = [PYTHON, "-m", "jupyter_server", "--allow-root", "--no-browser",
                     f"--port={self.port}", "--ServerApp.port_retries=0", "--ServerApp.ip=127.0.0.1",
                     "--ServerApp.token=", "--ServerApp.password=",
                     "--ServerApp.disable_check_xsrf=True", f"--gateway-url={gateway_url}", *extra_args]
        self.log_path = self.root / "jupyter_server.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.args, env=env, cwd=str(self.notebook_dir),
                                     stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT,
                                     preexec_fn=lambda: die_with_parent(signal.SIGKILL))
        self.url = f"http://127.0.0.1:{self.port}"

    def log_tail(self, n=60):
        self.log.flush()
        lines = self.log_path.read_text(errors="replace").splitlines()[-n:]
        return "jupyter_server log:\n" + "\n".join(lines)

    def wait_ready(self, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"jupyter_server exited with {self.proc.returncode}\n{self.log_tail()}")
            try:
                status, _, _ = self.rest("GET", "/api", timeout=2)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"jupyter_server not answering after {timeout}s\n{self.log_tail()}")

    def http(self, method, path, body=None, timeout=60):
        headers = {}
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.headers, resp.read()
        finally:
            conn.close()

    def rest(self, method, path, body=None, timeout=60):
        status, headers, data = self.http(method, path, body, timeout)
        try:
            js = json.loads(data) if data else None
        except ValueError:
            js = data
        return status, headers, js

    def ws(self, kernel_id, session_id):
        """Browser-like websocket to jupyter_server, usable once this returns.

        No subprotocol is offered: the 1.23 relay selects none and websocket-client would
        abort. The 1.23 relay drops messages that arrive before its own websocket to the
        gateway is up (GatewayWebSocketClient.on_message waits on a Future that _connect
        replaces), so like a browser we repeat kernel_info_request until one is answered."""
        ws = KernelWS(f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels"
                      f"?session_id={session_id}", session_id=session_id, timeout=30)
        deadline = time.monotonic() + 30
        while True:
            mid = ws.request("kernel_info_request")
            try:
                ws.wait_reply(mid, "kernel_info_reply", timeout=1)
                break
            except TimeoutError:
                if time.monotonic() > deadline:
                    ws.close()
                    raise AssertionError("no kernel_info_reply through jupyter_server's relay "
                                         f"within 30s\n{self.log_tail()}")
        ws.backlog.clear()
        return ws

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def jserver(kgate, tmp_path_factory):
    js = JupyterServer(tmp_path_factory.mktemp("jupyter_server"), kgate.url)
    try:
        js.wait_ready()
        yield js
    finally:
        js.stop()


def parent_id(msg):
    return msg.get("parent_header", {}).get("msg_id")


def test_kernelspecs_via_server(jserver):
    status, _, body = jserver.rest("GET", "/api/kernelspecs")
    assert status == 200, (status, body, jserver.log_tail())
    assert body["default"] == "python3", body
    assert "python3" in body["kernelspecs"], body
    spec = body["kernelspecs"]["python3"]
    assert spec["spec"]["display_name"] == DISPLAY_NAME, \
        f"jupyter_server did not take the kernelspec from kgate: {spec!r}"
    status, _, one = jserver.rest("GET", "/api/kernelspecs/python3")
    assert status == 200, (status, one)
    assert one["spec"]["display_name"] == DISPLAY_NAME
    status, _, missing = jserver.rest("GET", "/api/kernelspecs/no-such-spec")
    assert status == 404, (status, missing)


def test_kernelspec_resource_via_server(jserver, logo_png):
    status, _, data = jserver.http("GET", "/kernelspecs/python3/logo-64x64.png")
    assert status == 200, (status, data[:200], jserver.log_tail())
    assert data == logo_png


def test_kernel_lifecycle_via_server(kgate, jserver):
    # -- start (with a notebook path: the relay turns it into KERNEL_WORKING_DIR)
    status, hdrs, model = jserver.rest("POST", "/api/kernels",
                                       {"name": "python3", "path": "nb/Untitled.ipynb"})
    assert status == 201, (status, model, jserver.log_tail())
    kid = model["id"]
    kgate._kernels.add(kid)
    assert hdrs.get("Location") == f"/api/kernels/{kid}", hdrs.get("Location")
    assert kgate.kernel_model(kid)["id"] == kid, "kernel id not passed through from kgate"

    # -- list: jupyter_server parses every model's last_activity with strptime
    status, _, listing = jserver.rest("GET", "/api/kernels")
    assert status == 200, (status, listing, jserver.log_tail())
    assert kid in [k["id"] for k in listing], listing
    status, _, one = jserver.rest("GET", f"/api/kernels/{kid}")
    assert status == 200, (status, one)

    session = uuid.uuid4().hex
    ws = jserver.ws(kid, session)
    try:
        r = ws.execute("print(6*7)", timeout=60)
        assert r.status == "ok" and r.stdout == "42\n", r

        out = ws.run("import os\nprint(os.getcwd())\nprint(os.environ.get('KERNEL_INTEROP_MARKER'))")
        cwd, marker = out.splitlines()
        assert os.path.realpath(cwd) == os.path.realpath(str(jserver.notebook_dir / "nb")), out
        assert marker == MARKER, out

        # -- interrupt through the server
        ws.run("interop_state = 'before restart'")
        r = ws.execute_async("import time\ntime.sleep(60)", stop_on_error=False)
        ws.wait_for(lambda m: m.get("msg_type") == "execute_input" and parent_id(m) == r.msg_id,
                    15, what="execute_input of the sleep cell")
        time.sleep(0.5)
        status, _, body = jserver.rest("POST", f"/api/kernels/{kid}/interrupt", {})
        assert status == 204, (status, body, jserver.log_tail())
        ws.collect(r, 15)
        assert r.status == "error" and r.error and r.error["ename"] == "KeyboardInterrupt", r
        assert ws.run("print(interop_state)") == "before restart\n"
    finally:
        ws.close()

    # -- restart through the server
    status, _, body = jserver.rest("POST", f"/api/kernels/{kid}/restart", {})
    assert status == 200, (status, body, jserver.log_tail())
    assert body["id"] == kid
    ws = jserver.ws(kid, uuid.uuid4().hex)
    try:
        r = ws.execute("interop_state", timeout=60, stop_on_error=False)
        assert r.status == "error" and r.error["ename"] == "NameError", f"state survived restart: {r!r}"
        assert ws.run("print('alive after restart')") == "alive after restart\n"
    finally:
        ws.close()

    # -- delete through the server
    status, _, body = jserver.rest("DELETE", f"/api/kernels/{kid}")
    assert status == 204, (status, body, jserver.log_tail())
    kgate._kernels.discard(kid)
    assert wait_until(lambda: kgate.rest("GET", f"/api/kernels/{kid}")[0] == 404, 10), \
        "kernel still exists on kgate after DELETE through jupyter_server"
    assert wait_until(lambda: not kgate.connection_file(kid).exists(), 5)
    status, _, listing = jserver.rest("GET", "/api/kernels")
    assert status == 200 and kid not in [k["id"] for k in listing], (status, listing)
