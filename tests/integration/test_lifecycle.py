"""Kernel lifecycle: interrupt, restart, death, delete, daemon shutdown."""

import json
import os
import queue
import signal
import stat
import time

from jupyter_client import BlockingKernelClient

from conftest import assert_kernel_model, pid_alive, wait_until


def parent_id(msg):
    return msg.get("parent_header", {}).get("msg_id")


def kernel_getpid(ws):
    return int(ws.run("import os; print(os.getpid())").strip())


def kc_run(kc, code, timeout=30):
    """Run code through a BlockingKernelClient; return (reply_content, stdout)."""
    out = []

    def hook(msg):
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            out.append(msg["content"]["text"])

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    return reply["content"], "".join(out)


def kc_resync(kc, timeout=15):
    """Wait until kc's shell gets replies and its iopub SUB is subscribed again (ZMQ drops
    what a PUB sends before a reconnected SUB's subscription arrives: the slow joiner)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg_id = kc.kernel_info()
        try:
            while True:
                reply = kc.get_shell_msg(timeout=2)
                if reply["parent_header"].get("msg_id") == msg_id:
                    break
            end = time.monotonic() + 1
            while time.monotonic() < end:
                msg = kc.get_iopub_msg(timeout=max(0.01, end - time.monotonic()))
                if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status":
                    return
        except queue.Empty:
            continue
    raise AssertionError(f"client attached before the restart got no shell reply + iopub "
                         f"within {timeout}s after it")


def test_interrupt(kgate, kernel, ws_clients):
    ws = kgate.connect(kernel)
    ws_clients.append(ws)
    r = ws.execute_async("import time\ntime.sleep(60)\nprint('not interrupted')",
                         stop_on_error=False)
    ws.wait_for(lambda m: m.get("msg_type") == "execute_input" and parent_id(m) == r.msg_id, 10,
                what="execute_input of the sleep cell")
    time.sleep(0.5)  # be inside time.sleep
    t0 = time.monotonic()
    status, _, body = kgate.rest("POST", f"/api/kernels/{kernel}/interrupt")
    assert status == 204, (status, body)
    err = ws.wait_for(lambda m: parent_id(m) == r.msg_id and (
        m.get("msg_type") == "error" or
        (m.get("msg_type") == "execute_reply" and m["content"].get("status") == "error")),
        10, what="KeyboardInterrupt after POST interrupt")
    elapsed = time.monotonic() - t0
    assert err["content"]["ename"] == "KeyboardInterrupt", err["content"]
    assert elapsed <= 1.0, f"KeyboardInterrupt arrived {elapsed:.2f}s after POST interrupt"
    r.add(err)
    ws.collect(r, 10)
    assert r.status == "error" and "not interrupted" not in r.stdout, r
    # the kernel survived and kept its state
    assert ws.run("print(time.time() > 0)") == "True\n"


def test_restart(kgate, kernel, ws_clients):
    ws = kgate.connect(kernel)
    ws_clients.append(ws)
    ws.run("restart_marker = 'still here'")
    pid1 = kernel_getpid(ws)
    assert pid1 in kgate.children(), "kernel is not a child of kgate"

    cf = kgate.connection_file(kernel)
    info1 = json.loads(cf.read_text())
    kc = BlockingKernelClient()
    kc.load_connection_file(str(cf))
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=30)
        content, out = kc_run(kc, "print('kc before', restart_marker)")
        assert content["status"] == "ok" and out == "kc before still here\n", (content, out)

        t0 = time.monotonic()
        status, _, model = kgate.rest("POST", f"/api/kernels/{kernel}/restart", {})
        assert status == 200, (status, model)
        assert_kernel_model(model, kernel)
        assert time.monotonic() - t0 < 30

        assert cf.is_file(), "connection file gone after restart"
        assert stat.S_IMODE(cf.stat().st_mode) == 0o600
        info2 = json.loads(cf.read_text())
        for key in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port", "ip",
                    "key", "transport", "signature_scheme"):
            assert info2.get(key) == info1.get(key), f"{key} changed on restart: {info1} -> {info2}"

        # fresh websocket: a new process, state gone
        with kgate.connect(kernel) as ws2:
            pid2 = kernel_getpid(ws2)
            assert pid2 != pid1, "restart did not start a new process"
            r = ws2.execute("restart_marker", stop_on_error=False)
            assert r.status == "error" and r.error["ename"] == "NameError", r
        assert wait_until(lambda: not pid_alive(pid1), 5), f"old kernel pid {pid1} still alive/zombie"
        assert kgate.kernel_pid(kernel) == pid2

        # the client attached by connection file before the restart keeps working
        kc_resync(kc)
        content, out = kc_run(kc, "print('kc after', 'restart_marker' in globals())")
        assert content["status"] == "ok" and out == "kc after False\n", (content, out)
    finally:
        kc.stop_channels()


def test_kill_9_reports_dead(kgate, kernel, ws_clients):
    a = kgate.connect(kernel)
    b = kgate.connect(kernel)
    ws_clients += [a, b]
    pid = kernel_getpid(a)
    assert pid in kgate.children(), f"kernel pid {pid} not a child of kgate {kgate.children()}"
    b.wait_reply(b.request("kernel_info_request"))
    cf = kgate.connection_file(kernel)

    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    for ws in (a, b):
        ws.wait_for(lambda m: m.get("channel") == "iopub" and m.get("msg_type") == "status"
                    and m["content"].get("execution_state") == "dead", 10, what="iopub status dead")
        elapsed = time.monotonic() - t0
        assert elapsed <= 3.0, f"status dead arrived {elapsed:.2f}s after kill -9"

    state = kgate.kernel_model(kernel)["execution_state"]
    assert state == "dead", f"GET /api/kernels/{kernel} execution_state={state!r} after kill -9"
    assert wait_until(lambda: not pid_alive(pid), 3), f"killed kernel {pid} not reaped"

    status = kgate.delete_kernel(kernel, check=False)
    assert status == 204, f"DELETE of a dead kernel -> {status}"
    assert wait_until(lambda: not cf.exists(), 5), "connection file remains after DELETE"


def test_delete(kgate, kernel):
    cf = kgate.connection_file(kernel)
    assert cf.is_file()
    pid = kgate.kernel_pid(kernel)
    status, _, body = kgate.rest("DELETE", f"/api/kernels/{kernel}")
    kgate._kernels.discard(kernel)
    assert status == 204, (status, body)
    status, _, body = kgate.rest("GET", f"/api/kernels/{kernel}")
    assert status == 404, (status, body)
    assert body["message"] == f"Kernel does not exist: {kernel}", body
    assert wait_until(lambda: not cf.exists(), 5), f"{cf} remains after DELETE"
    assert wait_until(lambda: not pid_alive(pid), 10), f"kernel process {pid} still running after DELETE"
    _, _, listing = kgate.rest("GET", "/api/kernels")
    assert kernel not in [m["id"] for m in listing]
    status, _, _ = kgate.rest("DELETE", f"/api/kernels/{kernel}")
    assert status == 404, f"second DELETE -> {status}"


STUBBORN_SETUP = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)"
STUBBORN_CELL = """
while True:
    try:
        time.sleep(100)
    except BaseException:
        pass
"""


def test_delete_stubborn_kernel(kgate, kernel, ws_clients):
    """A busy kernel that ignores SIGTERM and swallows KeyboardInterrupt is still removed."""
    ws = kgate.connect(kernel)
    ws_clients.append(ws)
    ws.run(STUBBORN_SETUP)
    pid = kgate.kernel_pid(kernel)
    ws.execute_async(STUBBORN_CELL)
    time.sleep(0.3)
    t0 = time.monotonic()
    status, _, body = kgate.rest("DELETE", f"/api/kernels/{kernel}", timeout=30)
    kgate._kernels.discard(kernel)
    assert status == 204, (status, body)
    assert wait_until(lambda: not pid_alive(pid), 10), \
        f"stubborn kernel {pid} still alive {time.monotonic() - t0:.1f}s after DELETE"
    assert kgate.rest("GET", f"/api/kernels/{kernel}")[0] == 404
    assert not kgate.connection_file(kernel).exists()


def test_delete_preferring_respond_async_answers_202_as_the_stop_begins(kgate, kernel, ws_clients):
    """`Prefer: respond-async` (RFC 7240): 202 at once, and the kernel goes down after it, as
    kgate-mcp's end needs (it must exit before Claude Code's SIGKILL, 500 ms after SIGINT)."""
    ws = kgate.connect(kernel)
    ws_clients.append(ws)
    ws.run(STUBBORN_SETUP)  # so its stop takes seconds: SIGTERM is ignored, SIGKILL ends it
    pid = kgate.kernel_pid(kernel)
    ws.execute_async(STUBBORN_CELL)
    time.sleep(0.3)
    t0 = time.monotonic()
    status, _, body = kgate.rest("DELETE", f"/api/kernels/{kernel}", headers={"Prefer": "wait=5, respond-async"})
    took = time.monotonic() - t0
    kgate._kernels.discard(kernel)
    assert status == 202 and body is None, (status, body)
    assert pid_alive(pid), "202 came after the kernel was down"
    assert wait_until(lambda: not pid_alive(pid), 15), f"kernel {pid} still alive after the 202"
    assert wait_until(lambda: kgate.rest("GET", f"/api/kernels/{kernel}")[0] == 404, 5)
    status, _, body = kgate.rest("DELETE", f"/api/kernels/{kernel}", headers={"Prefer": "respond-async"})
    assert status == 404 and body["message"] == f"Kernel does not exist: {kernel}", (status, body)
    print(f"202 in {took * 1000:.0f} ms")


def test_sigint_stops_every_kernel(kgate_factory):
    """^C (SIGINT) stops kgate and its kernels (SIGTERM leaves them for the next kgate:
    test_readopt.py), bounded even with a kernel that ignores SIGTERM."""
    kg = kgate_factory()
    kernels = [kg.start_kernel()["id"] for _ in range(2)]
    pids = [kg.kernel_pid(k) for k in kernels]
    files = [kg.connection_file(k) for k in kernels]
    assert all(f.is_file() for f in files)
    ws = kg.connect(kernels[0])   # an open websocket must not block shutdown
    busy = kg.connect(kernels[1])  # a busy kernel that ignores SIGTERM must not either
    try:
        assert ws.run("print('alive')") == "alive\n"
        busy.run(STUBBORN_SETUP)
        busy.execute_async(STUBBORN_CELL)
        time.sleep(0.3)
        t0 = time.monotonic()
        code = kg.stop(timeout=10, sig=signal.SIGINT, sweep=False)
        elapsed = time.monotonic() - t0
    finally:
        ws.close()
        busy.close()
    assert code in (0, -signal.SIGINT), f"kgate exited with {code} after SIGINT\n{kg.log_tail()}"
    assert elapsed <= 10
    alive = [p for p in pids if pid_alive(p)]
    for p in alive:
        os.kill(p, signal.SIGKILL)
    assert not alive, f"kernel processes {alive} survived kgate's shutdown"
    left = sorted(p.name for p in kg.runtime_dir.glob("kernel-*.json"))
    assert not left, f"connection files left in the runtime dir: {left}"
