"""Stock Jupyter web front ends (jupyter_server 1.23, Notebook 6) run with --gateway-url pointing
at kgate, and driven like a browser: their REST API and their websocket relay."""

import http.client
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

from conftest import KernelWS, die_with_parent


def private_env(root, **extra):
    """The test's environment without the user's Jupyter, kernel, Python and kgate settings, with
    every Jupyter dir under `root`; `extra` on top."""
    root = Path(root)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JUPYTER", "KERNEL_", "PYTHON", "KGATE_", "IPYTHON"))}
    env.update({
        "JUPYTER_PLATFORM_DIRS": "1",
        "JUPYTER_NO_CONFIG": "1",
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
        "JUPYTER_CONFIG_DIR": str(root / "config"),
        "JUPYTER_DATA_DIR": str(root / "data"),
        "JUPYTER_PATH": str(root / "share"),
        # JUPYTER_NO_CONFIG makes jupyter_core create a fresh jupyter-clean-cfg-* directory in
        # $TMPDIR at every lookup, and never remove it: keep them under the test's root.
        "TMPDIR": str(root / "tmp"),
    })
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    env.update(extra)
    return env


class FrontEnd:
    """One front-end process on a free port of 127.0.0.1, its output in root/<name>.log.
    Subclasses give the command line (`args(port)`), the environment and the cwd."""

    name = "front end"

    def __init__(self, root, args, env, cwd, token=None):
        self.root = Path(root)
        self.token = token
        self.args = args
        self.log_path = self.root / (self.name.replace(" ", "_") + ".log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.args, env=env, cwd=str(cwd), stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     preexec_fn=lambda: die_with_parent(signal.SIGKILL))
        self.url = f"http://127.0.0.1:{self.port}"

    def log_tail(self, n=60):
        self.log.flush()
        lines = self.log_path.read_text(errors="replace").splitlines()[-n:]
        return f"{self.name} log:\n" + "\n".join(lines)

    def wait_ready(self, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode}\n{self.log_tail()}")
            try:
                status, _, _ = self.rest("GET", "/api", timeout=2)
                if status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"{self.name} not answering after {timeout}s\n{self.log_tail()}")

    def http(self, method, path, body=None, timeout=60):
        headers = {"Authorization": f"token {self.token}"} if self.token else {}
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
        """A browser-like websocket to the relay, usable once this returns.

        No subprotocol is offered: jupyter_server 1.23's relay selects none and websocket-client
        would abort. The relays drop what arrives before their own websocket to the gateway is up
        (jupyter_server's GatewayWebSocketClient.on_message waits on a Future that _connect
        replaces), so like a browser we repeat kernel_info_request until one is answered."""
        query = f"?session_id={session_id}" + (f"&token={quote(self.token)}" if self.token else "")
        ws = KernelWS(f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels{query}",
                      session_id=session_id, timeout=30)
        deadline = time.monotonic() + 30
        while True:
            mid = ws.request("kernel_info_request")
            try:
                ws.wait_reply(mid, "kernel_info_reply", timeout=1)
                break
            except TimeoutError:
                if time.monotonic() > deadline:
                    ws.close()
                    raise AssertionError(f"no kernel_info_reply through {self.name}'s relay "
                                         f"within 30s\n{self.log_tail()}")
        ws.backlog.clear()
        return ws

    def stop(self, timeout=20):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode
