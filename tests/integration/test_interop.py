"""A stock jupyter_server 1.23 running with --gateway-url pointing at kgate, driven like a
browser through its own REST API and websocket (assertions are on jupyter_server's answers)."""

import os
import time
import uuid
from pathlib import Path

import pytest

from conftest import DISPLAY_NAME, PYTHON, free_port, wait_until
from frontends import FrontEnd, private_env

MARKER = "interop-" + uuid.uuid4().hex


class JupyterServer(FrontEnd):
    """`python3 -m jupyter_server --gateway-url=...`, no token of its own, notebooks in nbroot/.
    `gateway_token`: kgate's, in $JUPYTER_GATEWAY_AUTH_TOKEN (GatewayClient.auth_token's variable:
    unlike the flag, not in argv for other users to read)."""

    name = "jupyter_server"

    def __init__(self, root, gateway_url, extra_args=(), gateway_token=None):
        root = Path(root)
        self.port = free_port()
        self.notebook_dir = root / "nbroot"
        (self.notebook_dir / "nb").mkdir(parents=True)
        args = [PYTHON, "-m", "jupyter_server", "--allow-root", "--no-browser",
                f"--port={self.port}", "--ServerApp.port_retries=0", "--ServerApp.ip=127.0.0.1",
                "--ServerApp.token=", "--ServerApp.password=",
                "--ServerApp.disable_check_xsrf=True", f"--gateway-url={gateway_url}", *extra_args]
        env = private_env(root, KERNEL_INTEROP_MARKER=MARKER)
        if gateway_token:
            env["JUPYTER_GATEWAY_AUTH_TOKEN"] = gateway_token
        super().__init__(root, args, env, self.notebook_dir)


@pytest.fixture(scope="module")
def jserver(kgate, tmp_path_factory):
    js = JupyterServer(tmp_path_factory.mktemp("jupyter_server"), kgate.url, gateway_token=kgate.token)
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
