"""A real qtconsole attached to a kgate kernel by its attach command, beside an agent.

The kernel's attach command (GET /api/kgate/kernels/{id}, and kgate-mcp's server_status) names
qtconsole from the first read when the kernel's interpreter has it. A qtconsole
RichJupyterWidget with a QtKernelClient loaded from the connection file that command names runs
under QT_QPA_PLATFORM=offscreen, in a subprocess of the interpreter the command names, with a Qt
event loop driven over its stdin and stdout. With it:

- a cell run from the widget (widget.execute) is recorded as a `user` job, with its code and
  output;
- the agent's next execute reply (the real kgate-mcp over stdio) names that job as run by the
  user;
- a widget with include_other_output shows the agent's output (the widget's own plain text), and
  a widget without it does not.
"""

import json
import os
import queue
import re
import shlex
import subprocess
import threading
import time

import pytest

from conftest import die_with_parent, wait_until
from test_mcp_transcript import Mcp, initialize, mcp_bin  # noqa: F401 (mcp_bin: a fixture)

REPLY = 90          # seconds a tool call may take (a busy machine)
WIDGET_EVENT = 60   # seconds to wait for one answer from the widget process
WIDGET_LIFE = 240   # the widget process ends itself after this, whatever happens

# The widget process: argv is the connection file, include_other_output (1 or 0) and its
# lifetime in seconds. It reads
# JSON commands from stdin ({"op": "execute", "code": ...}, {"op": "text"}, {"op": "quit"}) and
# writes JSON events to stdout, one a line: ready (the first prompt is shown), executed (the
# execute_reply of a cell it ran), text (its plain text) and error.
WIDGET_SCRIPT = r'''
import json, os, queue, sys, threading, traceback
os.environ["QT_QPA_PLATFORM"] = "offscreen"
from qtpy import QtCore, QtWidgets
from qtconsole.client import QtKernelClient
from qtconsole.rich_jupyter_widget import RichJupyterWidget

connection_file, include_other, life = sys.argv[1], sys.argv[2] == "1", float(sys.argv[3])

def emit(**event):
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()

app = QtWidgets.QApplication([])
kc = QtKernelClient(connection_file=connection_file)
kc.load_connection_file()
kc.start_channels()
widget = RichJupyterWidget(local_kernel=False)
widget.include_other_output = include_other
widget._existing, widget._may_close, widget._confirm_exit = True, False, False
widget.kernel_client = kc
widget.kernel_manager = None
widget.show()
widget.executed.connect(lambda msg: emit(event="executed", status=msg["content"]["status"],
                                         msg_id=msg["parent_header"].get("msg_id", "")))

commands = queue.Queue()
def read_stdin():
    for line in sys.stdin:
        commands.put(json.loads(line))
    commands.put({"op": "quit"})
threading.Thread(target=read_stdin, daemon=True).start()

def text():
    return widget._control.toPlainText()

ready = [False]
def tick():
    if not ready[0] and "In [" in text():
        ready[0] = True
        emit(event="ready")
    while True:
        try:
            cmd = commands.get_nowait()
        except queue.Empty:
            return
        try:
            if cmd["op"] == "execute":
                widget.execute(cmd["code"])
            elif cmd["op"] == "text":
                emit(event="text", text=text())
            elif cmd["op"] == "quit":
                kc.stop_channels()
                app.quit()
                return
        except Exception:
            emit(event="error", error=traceback.format_exc())

timer = QtCore.QTimer()
timer.timeout.connect(tick)
timer.start(20)
def expire():
    emit(event="error", error="the widget process lived its %g s" % life)
    app.exit(3)
QtCore.QTimer.singleShot(int(life * 1000), expire)
sys.exit(app.exec_())
'''


class Agent:
    """One conversation: a kgate-mcp process pointed at a kgate."""

    def __init__(self, binary, home, url):
        self.m = Mcp(binary, home, {"KGATE_URL": url})
        initialize(self.m)
        self.next_id = 0

    def ok(self, name, **args):
        """The text of a tools/call reply that is not an error."""
        self.next_id += 1
        self.m.send({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call",
                     "params": {"name": name, "arguments": args}})
        r = self.m.reply(self.next_id, timeout=REPLY)
        assert "result" in r, f"{name}{args}: not a tool result: {r}"
        text = "\n".join(b.get("text", "") for b in r["result"]["content"] if b.get("type") == "text")
        assert r["result"].get("isError") is not True, f"{name}{args} -> isError:\n{text}"
        return text


class Widget:
    """A qtconsole RichJupyterWidget in a process of `python` of its own, on `connection_file`."""

    def __init__(self, python, connection_file, include_other_output, script, log):
        env = dict(os.environ, QT_QPA_PLATFORM="offscreen", XDG_RUNTIME_DIR=str(log.parent))
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(
            [python, str(script), connection_file, "1" if include_other_output else "0", str(WIDGET_LIFE)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env,
            preexec_fn=die_with_parent)
        self.log_path = log
        self.events = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.events.put(json.loads(line))
        self.events.put({"event": "exited"})

    def send(self, **cmd):
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()

    def wait_event(self, kind, timeout=WIDGET_EVENT):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"the widget sent no {kind!r} within {timeout} s\n{self.stderr()}"
            try:
                e = self.events.get(timeout=left)
            except queue.Empty:
                continue
            assert e["event"] not in ("error", "exited"), f"widget: {e}\n{self.stderr()}"
            if e["event"] == kind:
                return e

    def text(self):
        self.send(op="text")
        return self.wait_event("text")["text"]

    def wait_text(self, needle, timeout=WIDGET_EVENT):
        """The widget's plain text once it contains `needle` (or the last one read, on timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            t = self.text()
            if needle in t or time.monotonic() > deadline:
                return t
            time.sleep(0.1)

    def stderr(self):
        self._log.flush()
        return "widget stderr:\n" + self.log_path.read_text(errors="replace")[-3000:]

    def close(self):
        if self.proc.poll() is None:
            try:
                self.send(op="quit")
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@pytest.fixture
def agents(mcp_bin, kgate, tmp_path):
    started = []

    def start():
        a = Agent(mcp_bin, tmp_path / f"agent{len(started)}", kgate.url)
        started.append(a)
        return a

    yield start
    for a in started:
        a.m.kill()


@pytest.fixture
def widgets(tmp_path):
    script = tmp_path / "widget.py"
    script.write_text(WIDGET_SCRIPT)
    started = []

    def start(argv, include_other_output):
        w = Widget(argv[0], argv[argv.index("--existing") + 1], include_other_output, script,
                   tmp_path / f"widget{len(started)}.log")
        started.append(w)
        return w

    yield start
    for w in started:
        w.close()


def attach_argv(kgate, kernel):
    status, _, model = kgate.rest("GET", f"/api/kgate/kernels/{kernel}")
    assert status == 200, model
    return model["attach_command"], shlex.split(model["attach_command"])


def test_attach_command_names_qtconsole_from_the_first_read(kgate, agents):
    # The test kernelspec runs /usr/bin/python3, which has qtconsole. The first read of a new
    # kgate's kernel model must already say so, and so must the agent's server_status.
    kernel = kgate.start_kernel()["id"]
    command, argv = attach_argv(kgate, kernel)
    assert argv[:3] == ["/usr/bin/python3", "-m", "qtconsole"], command
    assert argv[3:] == ["--existing", str(kgate.connection_file(kernel))], command
    agent = agents()
    agent.ok("connect", kernel=kernel)
    status = agent.ok("server_status")
    assert "attach a console: " + command in status, status
    assert "jupyter_console" not in status, status


def test_widget_cell_is_a_user_job_the_agent_is_told_of_and_sees_the_agents_output(
        kgate, agents, widgets):
    kernel = kgate.start_kernel()["id"]
    agent = agents()
    agent.ok("connect", kernel=kernel)
    command, argv = attach_argv(kgate, kernel)
    assert argv[1:3] == ["-m", "qtconsole"], command
    sharing = widgets(argv, include_other_output=True)
    private = widgets(argv, include_other_output=False)
    sharing.wait_event("ready")
    private.wait_event("ready")

    # A cell run from the widget: a user job with its code and output.
    code = "widget_value = 6 * 7\nprint('printed by the widget', widget_value)"
    sharing.send(op="execute", code=code)
    assert sharing.wait_event("executed")["status"] == "ok"
    assert "printed by the widget 42" in sharing.wait_text("printed by the widget 42"), sharing.text()

    def user_jobs():
        status, _, body = kgate.rest("GET", f"/api/kgate/jobs?kernel={kernel}")
        assert status == 200, body
        return [j for j in body["jobs"] if j["origin"] == "user" and j["status"] != "running"]

    jobs = wait_until(user_jobs, 10)
    assert len(jobs) == 1, (jobs, kgate.log_tail())
    job = jobs[0]
    assert job["code"] == code and job["status"] == "ok" and job["agent"] is None, job
    status, _, record = kgate.rest("GET", f"/api/kgate/jobs/{job['job']}")
    assert status == 200 and record["output"] == "printed by the widget 42\n", record

    # The agent's next reply names it as the user's, and the agent sees the widget's variable.
    reply = agent.ok("execute", code="print('printed by the agent', widget_value + 1)")
    assert "printed by the agent 43" in reply, reply
    assert re.search(r"run by the user since your last call: " + job["job"] + r" \(ok\)", reply), reply
    assert f"poll_job('{job['job']}')" in reply, reply

    # The widget that includes other clients' output shows the agent's; the other does not.
    text = sharing.wait_text("printed by the agent 43")
    assert "printed by the agent 43" in text, text
    assert "printed by the widget 42" in text, text
    # The other widget runs a cell after it: the kernel's iopub is in order, so by the end of
    # that cell it has had the agent's output too, and did not show it.
    private.send(op="execute", code="print('printed by the second widget')")
    assert private.wait_event("executed")["status"] == "ok"
    text = private.wait_text("printed by the second widget")
    assert "printed by the second widget" in text, text
    assert "printed by the agent 43" not in text and "printed by the widget 42" not in text, text
