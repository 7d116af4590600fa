"""A small Chrome DevTools Protocol driver for headless Chromium.

Only the standard library and Debian's python3-websocket (`websocket`, websocket-client):
no Playwright, no pip.

    with Chromium.launch(user_data_dir) as browser:
        page = browser.page()
        page.navigate("http://127.0.0.1:8787/observe?token=...")
        page.wait_for("document.body.dataset.ready === '1'")
        page.evaluate("document.title")
        page.screenshot("observe.png")

Chromium runs in its own process group and is SIGKILLed as a group by close(), which is
safe to call more than once and is also armed to run if the test process dies (PDEATHSIG).
"""

import base64
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import websocket  # python3-websocket

CHROMIUM = "/usr/bin/chromium"


class CDPError(Exception):
    """A protocol error reply, or an exception thrown by evaluated JavaScript."""


def _kill_with_parent():
    """preexec_fn: make Chromium's top process get SIGKILL when the test process dies."""
    import ctypes
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))


class Chromium:
    def __init__(self, proc, port, user_data_dir, log_path):
        self.proc = proc
        self.port = port
        self.user_data_dir = Path(user_data_dir)
        self.log_path = log_path
        self._pages = []
        self.tmpdir = None

    # ---- process --------------------------------------------------------------------

    @classmethod
    def launch(cls, user_data_dir, binary=CHROMIUM, timeout=30, window=(1280, 900), extra_args=()):
        user_data_dir = Path(user_data_dir)
        user_data_dir.mkdir(parents=True, exist_ok=True)
        port_file = user_data_dir / "DevToolsActivePort"
        if port_file.exists():
            port_file.unlink()
        log_path = user_data_dir / "chromium.log"
        args = [
            binary, "--headless=new", "--no-sandbox", "--disable-gpu",
            "--remote-debugging-port=0", f"--user-data-dir={user_data_dir}",
            "--no-first-run", "--no-default-browser-check", "--disable-extensions",
            "--disable-background-networking", "--disable-sync", "--disable-dev-shm-usage",
            "--disable-component-update", "--no-proxy-server", "--mute-audio", "--hide-scrollbars",
            f"--window-size={window[0]},{window[1]}",
            *extra_args, "about:blank",
        ]
        log = open(log_path, "wb")
        # Chromium's temporary files (org.chromium.Chromium.*) go in a directory of their own,
        # removed by close(); a short path, as its singleton socket's must fit in sun_path.
        tmp = tempfile.mkdtemp(prefix="kgate-cr-")
        env = dict(os.environ, TMPDIR=tmp)
        try:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                    start_new_session=True, preexec_fn=_kill_with_parent)
        finally:
            log.close()
        browser = cls(proc, None, user_data_dir, log_path)
        browser.tmpdir = tmp
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"chromium exited with code {proc.returncode} before it "
                                       f"wrote DevToolsActivePort\n{browser.log_tail()}")
                try:
                    lines = port_file.read_text().split("\n")
                    if lines and lines[0].strip().isdigit():
                        browser.port = int(lines[0].strip())
                        break
                except FileNotFoundError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"chromium wrote no DevToolsActivePort within {timeout}s\n"
                                       f"{browser.log_tail()}")
                time.sleep(0.05)
        except BaseException:
            browser.close()
            raise
        return browser

    def log_tail(self, n=40):
        try:
            lines = Path(self.log_path).read_text(errors="replace").splitlines()
        except OSError:
            return "(no chromium log)"
        return "chromium log (last %d lines):\n%s" % (min(n, len(lines)), "\n".join(lines[-n:]))

    def close(self):
        """Close the pages' sockets and SIGKILL Chromium's whole process group."""
        for p in self._pages:
            p.close()
        self._pages = []
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self.proc = None
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- HTTP endpoints (/json/...) ---------------------------------------------------

    def _json(self, method, path):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(method, path)
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                raise CDPError(f"{method} {path} -> {resp.status} {data[:200]!r}")
            return json.loads(data)
        finally:
            conn.close()

    def page(self):
        """A Page for the first page target (headless opens about:blank), else a new one."""
        targets = [t for t in self._json("GET", "/json/list") if t.get("type") == "page"]
        if not targets:
            targets = [self._json("PUT", "/json/new?about:blank")]
        page = Page(targets[0]["webSocketDebuggerUrl"])
        self._pages.append(page)
        return page


class Page:
    """One page target: commands, events, and helpers on top of Runtime.evaluate."""

    def __init__(self, ws_url, timeout=30):
        # Chromium refuses a DevTools websocket whose Origin it does not allow: send none.
        self.ws = websocket.create_connection(ws_url, timeout=timeout, suppress_origin=True)
        self._next_id = 0
        self._lock = threading.Lock()
        self.events = []            # every event received, in order: (method, params)
        self.exceptions = []        # Runtime.exceptionThrown details (uncaught JS errors)
        self.console = []           # (type, text) of console calls
        self.send("Page.enable")
        self.send("Runtime.enable")

    def close(self):
        try:
            self.ws.close(timeout=1)
        except Exception:
            pass

    def _on_event(self, msg):
        method, params = msg.get("method"), msg.get("params", {})
        self.events.append((method, params))
        if method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails", {})
            exc = d.get("exception", {})
            self.exceptions.append(exc.get("description") or d.get("text") or json.dumps(d)[:500])
        elif method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            self.console.append((params.get("type"), text))

    def send(self, method, params=None, timeout=30):
        with self._lock:
            self._next_id += 1
            msg_id = self._next_id
            self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params or {}}))
            deadline = time.monotonic() + timeout
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"CDP {method} got no reply within {timeout}s")
                self.ws.settimeout(remaining)
                try:
                    raw = self.ws.recv()
                except (websocket.WebSocketTimeoutException, socket.timeout):
                    raise TimeoutError(f"CDP {method} got no reply within {timeout}s")
                msg = json.loads(raw)
                if "method" in msg and "id" not in msg:
                    self._on_event(msg)
                    continue
                if msg.get("id") != msg_id:
                    continue
                if "error" in msg:
                    raise CDPError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def drain_events(self, seconds=0.0):
        """Read events that arrived without a command (e.g. exceptions) for up to seconds."""
        with self._lock:
            deadline = time.monotonic() + seconds
            while True:
                self.ws.settimeout(max(deadline - time.monotonic(), 0.001))
                try:
                    raw = self.ws.recv()
                except (websocket.WebSocketTimeoutException, socket.timeout):
                    return
                msg = json.loads(raw)
                if "method" in msg:
                    self._on_event(msg)

    # ---- helpers ----------------------------------------------------------------------

    def evaluate(self, expression, await_promise=True, timeout=30):
        """The value of a JavaScript expression (returned by value). Raises CDPError if it throws."""
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                           "awaitPromise": await_promise, "userGesture": True},
                      timeout=timeout)
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            desc = d.get("exception", {}).get("description") or d.get("text")
            raise CDPError(f"JavaScript threw evaluating {expression[:200]!r}: {desc}")
        return r.get("result", {}).get("value")

    def wait_for(self, expression, timeout=10, interval=0.1, message=None):
        """Poll expression until it is truthy; return its value. Raises AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        value = None
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{message or 'page condition not met'} within {timeout}s: "
                                     f"{expression} -> {value!r}")
            time.sleep(interval)

    def navigate(self, url, timeout=30):
        r = self.send("Page.navigate", {"url": url}, timeout=timeout)
        if r.get("errorText"):
            raise CDPError(f"navigating to {url}: {r['errorText']}")
        self.wait_for("document.readyState === 'complete'", timeout=timeout,
                      message=f"{url} did not finish loading")
        return r

    def click(self, selector):
        """Click the element matching a CSS selector (el.click()); raises if there is none."""
        ok = self.evaluate(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                           f" if (!e) return false; e.scrollIntoView({{block: 'center'}}); e.click();"
                           f" return true; }})()")
        if not ok:
            raise AssertionError(f"no element matches {selector!r} to click")

    def text(self, selector):
        """textContent of the first match, or None."""
        return self.evaluate(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                             f" return e ? e.textContent : null; }})()")

    def screenshot(self, path):
        r = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": False})
        data = base64.b64decode(r["data"])
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)
        return path
