# kgate's half of the session kernel (docs/dev/kernel-side.md): what kgate installs into every ipykernel it
# launches, as one silent execute before anyone else is served (src/kernel/lifecycle.cpp install_kernel_side).
#
# kgate runs this file with exec() in a namespace of its own (nothing lands in the user's), then
# calls install(host). It patches the running kernel's handler tables, so it works with any
# kernel class derived from ipykernel's Kernel (6.x). What it adds:
# - the host: kgate's session id (KGATE_HOST_SESSION, set at launch; install() refuses another).
#   Requests whose header session is the host's, or starts with it and a ".", are kgate's.
# - silent_echo: a silent execute_request with code, from any other session, is echoed as
#   execute_input (ipykernel echoes none), so kgate records it as the user's cell. Empty silent
#   requests (qtconsole's prompt number, user_expressions) are not cells and are not echoed.
# - shutdown_guard: a shutdown_request from any other session is refused with an error reply;
#   the kernel lives on, and a kgate_event {event: "shutdown_refused"} on iopub tells kgate who
#   tried.
# - stop: a custom control request, kgate_request {op: "interrupt", request: msg_id}, from the
#   host only. Under the lock a cell's end takes, it checks that the cell whose execute_request
#   is `request` still runs its code, and only then sends SIGINT to the main thread (not the
#   process group): the stop lands in that cell, or in the lock wait that ends it (where it is
#   absorbed), never in the next cell. A stale id stops nothing, and the reply names what runs.
# - tasks: start_task(code), sent by kgate for the agent's execute(background=true), runs the
#   code on a worker thread in the user's namespace, one task at a time. The task is announced
#   on iopub (kgate_event task_start, then task_end with how it ended, after an iopub error with
#   the traceback when it raised, as a cell's), and what the task thread prints goes out as
#   stream messages under the starting request, so kgate files it under the task. The stop above raises KeyboardInterrupt in the task's thread
#   (PyThreadState_SetAsyncExc) when `request` names the task.
# - run_async: the cell magic %%run_async, for a person (qtconsole, a notebook): the rest of the
#   cell becomes a background task, as above, with that cell's origin. A magic, so nothing is
#   added to the user's namespace.
# - close: kgate_request {op: "close", wait_ms}, from the host only, sent before kgate shuts the
#   kernel down or restarts it: the cell and the task that run are stopped as above, and the
#   reply waits (up to wait_ms) for them to end, so their finally blocks run and the
#   shutdown_request after it ends the process normally, atexit handlers and all.
# - ipc_pipe: on a kernel kgate put on ipc, ipykernel's IOPub "pipe" (a PULL socket on a 127.0.0.1
#   TCP port, where forked subprocesses send their output, each message led by 16 random bytes) is
#   moved beside the kernel's own ipc sockets (<ip>-pipe), so the kernel has no TCP port left.
# A part that cannot be installed is reported off, with the reason; the others still work.
#
# ipykernel internals relied on (ipykernel 6.17 on Debian 12, and later 6.x):
# - Kernel.shell_handlers and Kernel.control_handlers: dicts of msg_type -> handler(stream,
#   ident, parent), looked up per message, whose result is awaited when it is awaitable;
# - Kernel._publish_execute_input(code, parent, execution_count) and Kernel._topic(name);
# - Kernel.session.send(stream, msg_type, content, parent, ident=...) and Kernel.iopub_socket;
# - Kernel.control_msg_types is read only at construction: kgate_request goes straight into
#   control_handlers; Kernel.get_parent("shell") (the request a cell runs for);
# - InteractiveShell.register_magic_function (the %%run_async cell magic);
# - IPython's pre_execute and post_execute events, which bracket every run_cell, silent or not;
# - SIGINT raises KeyboardInterrupt in the main thread while a request is handled (ipykernel's
#   pre_handler_hook), and a blocked threading.Lock.acquire is interrupted by it;
# - a control handler's awaitable result is awaited on the control thread's asyncio loop (the
#   close waits there with asyncio.sleep; control requests are handled one at a time).
# - Kernel.iopub_thread (IOPubThread): its io_loop, _pipe_in (a ZMQStream), _pipe_port, and
#   _setup_pipe_out(), which a forked child calls to connect to the pipe; IPKernelApp's
#   transport and ip.
import asyncio
import ctypes
import inspect
import json
import os
import signal
import sys
import threading
import time
import traceback

VERSION = 3  # 2: the close, %%run_async, report()'s task, a task's error as an iopub error; 3: ipc_pipe
MODULE = "kgate_kernel_side"

_state = None  # set by install(): {"host", "kernel", "features", "off"}


class _Json:
    """A user_expressions value whose text/plain (its repr) is JSON, for kgate to parse."""

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return json.dumps(self.value)


def _session_of(parent):
    header = parent.get("header") if isinstance(parent, dict) else None
    return header.get("session", "") if isinstance(header, dict) else ""


def is_host(session):
    host = _state["host"] if _state else ""
    return bool(host) and isinstance(session, str) and (session == host or session.startswith(host + "."))


async def _call(handler, stream, ident, parent):
    result = handler(stream, ident, parent)
    if inspect.isawaitable(result):
        result = await result
    return result


def _publish(kernel, content, parent):
    kernel.session.send(kernel.iopub_socket, "kgate_event", content, parent=parent,
                        ident=kernel._topic("kgate_event"))


def _guard_shutdown(kernel, channel, original):
    async def shutdown_request(stream, ident, parent):
        session = _session_of(parent)
        if is_host(session):
            return await _call(original, stream, ident, parent)
        header = parent.get("header") or {}
        content = parent.get("content") or {}
        restart = bool(content.get("restart", False)) if isinstance(content, dict) else False
        kernel.session.send(stream, "shutdown_reply", {
            "status": "error", "restart": restart, "ename": "PermissionError",
            "evalue": "kgate owns this kernel: shut it down or restart it through kgate "
                      "(DELETE or POST .../restart on /api/kernels/{id}), not with a shutdown_request",
            "traceback": []}, parent, ident=ident)
        _publish(kernel, {"event": "shutdown_refused", "channel": channel, "session": session,
                          "username": header.get("username", ""), "restart": restart,
                          "time": time.time()}, parent)
    return shutdown_request


def _echo_silent(kernel, original):
    async def execute_request(stream, ident, parent):
        content = parent.get("content") or {}
        code = content.get("code") if isinstance(content, dict) else None
        if (isinstance(content, dict) and content.get("silent") and isinstance(code, str) and code.strip()
                and not is_host(_session_of(parent))):
            kernel._publish_execute_input(code, parent, kernel.execution_count)
        return await _call(original, stream, ident, parent)
    return execute_request


# The stop (kgate_request, op "interrupt"). _cell is the msg_id of the execute_request whose
# code runs on the main thread, from pre_execute to post_execute, under _lock.
_lock = threading.Lock()
_cell = None
_ended = None  # the msg_id of the last cell that ended


def _cell_begins():
    global _cell
    parent = _state["kernel"].get_parent("shell") if _state else None
    msg_id = parent.get("header", {}).get("msg_id") if isinstance(parent, dict) else None
    with _lock:
        _cell = msg_id


def _cell_ends():
    # A stop sent as the cell ends lands here at the latest (it was sent under _lock, which this
    # waits for): absorbed, so it never reaches the next cell.
    global _cell, _ended
    while True:
        try:
            with _lock:
                _ended, _cell = _cell, None
            return
        except KeyboardInterrupt:
            continue


# The background task: {"request", "thread"}, under _lock. _local.parent is set in its thread.
_task = None
_local = threading.local()


def _route(kernel, name):
    # A task thread's writes go out under its starting request; every other thread's as before.
    stream = getattr(sys, name, None)
    original = getattr(stream, "write", None)
    if original is None:
        return False

    def write(text):
        parent = getattr(_local, "parent", None)
        if parent is None:
            return original(text)
        if text:
            kernel.session.send(kernel.iopub_socket, "stream", {"name": name, "text": text}, parent=parent,
                                ident=kernel._topic("stream"))
        return len(text)
    stream.write = write
    return True


def _task_body(kernel, compiled, parent, request):
    global _task
    _local.parent = parent
    end = {"event": "task_end", "request": request, "status": "ok"}
    error = None
    try:
        exec(compiled, _state["shell"].user_ns)
    except KeyboardInterrupt:
        end.update(status="interrupted", ename="KeyboardInterrupt", evalue="")
        error = {"ename": "KeyboardInterrupt", "evalue": "",
                 "traceback": ["KeyboardInterrupt: the background task was stopped"]}
    except BaseException as e:  # noqa: BLE001 (the task's own error, reported as its end)
        end.update(status="error", ename=type(e).__name__, evalue=str(e))
        error = {"ename": type(e).__name__, "evalue": str(e),
                 "traceback": traceback.format_exception(type(e), e, e.__traceback__)[1:]}
    finally:
        _local.parent = None
        while True:  # a stop that comes as the task ends lands here: absorbed
            try:
                with _lock:
                    _task = None
                break
            except KeyboardInterrupt:
                continue
        if error:  # as a cell's: the person's console shows it, kgate records it (bounded)
            kernel.session.send(kernel.iopub_socket, "error", error, parent=parent, ident=kernel._topic("error"))
        _publish(kernel, end, parent)


def start_task(code):
    """Runs `code` on a worker thread as kgate's background task (the starting cell returns)."""
    global _task
    kernel = _state["kernel"]
    parent = kernel.get_parent("shell")
    request = parent["header"]["msg_id"]
    compiled = compile(code, "<background task>", "exec")
    with _lock:
        if _task is not None:
            raise RuntimeError("a background task already runs (one at a time); stop it or wait for it")
        thread = threading.Thread(target=_task_body, args=(kernel, compiled, parent, request),
                                  name="kgate-task", daemon=True)
        _task = {"request": request, "thread": thread}
    _publish(kernel, {"event": "task_start", "request": request, "code": code}, parent)
    thread.start()


def _run_async(line, cell):
    """%%run_async: runs the rest of the cell as a background task, as kgate-mcp's
    execute(background=true) does: a worker thread in the user's namespace, its prints under this
    cell, one task at a time; the cell returns at once. The task is a job of its own in kgate's
    records, with this cell's origin; stop it from the observe page (or kgate's interrupt)."""
    if line.strip():
        raise ValueError("%%run_async takes no arguments: put the code on the lines below it")
    if not cell.strip():
        raise ValueError("%%run_async needs code on the lines below it")
    start_task(cell)


def _stop_locked(request, main):
    """Stops `request` if it is what runs (the cell, or the task); under _lock. Whether it did."""
    if request and request == _cell:
        signal.pthread_kill(main, signal.SIGINT)
        return True
    if request and _task and request == _task["request"] and _task["thread"].ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(_task["thread"].ident),
                                                   ctypes.py_object(KeyboardInterrupt))
        return True
    return False


def _about_to_run(kernel, request):
    """Whether `request` is the execute_request the shell handles now, but whose code has not
    begun: ipykernel publishes its execute_input (which kgate takes as the cell's start) before
    IPython's pre_execute, so a stop can arrive in between."""
    parent = kernel.get_parent("shell") if hasattr(kernel, "get_parent") else None
    msg_id = parent.get("header", {}).get("msg_id") if isinstance(parent, dict) else None
    return bool(request) and msg_id == request and request not in (_cell, _ended)


# How long a stop waits for a cell that is about to run to begin (it is a few ms at most).
ABOUT_TO_RUN_WAIT = 2.0


def _running():
    cell, task = _cell, _task  # read once: the close reads them without _lock
    return [r for r in (cell, task["request"] if task else None) if r]


async def _close(content, main):
    # The graceful close before kgate stops the kernel: the cell and the task that run are stopped
    # as a stop would, then this waits (up to wait_ms) for both to end, so their finally blocks
    # run and the shutdown_request that follows ends the process normally (atexit handlers run).
    # A SIGTERM or SIGKILL, which come when the main thread stays busy, run neither.
    try:
        wait = min(max(float(content.get("wait_ms", 2000)), 0.0), 60000.0) / 1000.0
    except (TypeError, ValueError):
        wait = 2.0
    begun = time.monotonic()
    with _lock:
        stopped = [r for r in _running() if _stop_locked(r, main)]
    while _running() and time.monotonic() - begun < wait:
        await asyncio.sleep(0.02)
    return {"status": "ok", "stopped": stopped, "still_running": _running(),
            "waited_ms": int((time.monotonic() - begun) * 1000)}


def _stop(kernel):
    main = threading.main_thread().ident

    async def kgate_request(stream, ident, parent):
        content = parent.get("content") or {}
        if not isinstance(content, dict):
            content = {}
        op = content.get("op")
        if not is_host(_session_of(parent)):
            reply = {"status": "error", "refusal": "not_host", "message": "only kgate may send kgate_request"}
        elif op == "interrupt":
            request = content.get("request")
            until = time.monotonic() + ABOUT_TO_RUN_WAIT
            while True:
                with _lock:
                    if _stop_locked(request, main):
                        reply = {"status": "ok", "interrupted": request}
                        break
                    running = _running()
                if _about_to_run(kernel, request) and time.monotonic() < until:
                    await asyncio.sleep(0.005)
                    continue
                reply = {"status": "error", "refusal": "not_running", "running": running[0] if running else None}
                break
        elif op == "close":
            reply = await _close(content, main)
        elif op == "hello":
            reply = {"status": "ok", "version": VERSION, "running": _cell}
        else:
            reply = {"status": "error", "refusal": "unknown_op", "message": "unknown op %r" % (op,)}
        kernel.session.send(stream, "kgate_reply", reply, parent, ident=ident)
    return kgate_request


def _pipe_to_ipc(kernel):
    """Moves ipykernel's IOPub pipe from its TCP port to an ipc socket beside the kernel's own;
    "" when done, else why not."""
    try:
        from ipykernel.kernelapp import IPKernelApp
    except ImportError:
        return "no ipykernel.kernelapp"
    if not IPKernelApp.initialized():
        return "the kernel was not started by IPKernelApp"
    app = IPKernelApp.instance()
    if getattr(app, "transport", "tcp") != "ipc":
        return "the kernel is on tcp"
    thread = getattr(kernel, "iopub_thread", None)
    stream = getattr(thread, "_pipe_in", None)
    port = getattr(thread, "_pipe_port", None)
    if stream is None or port is None or not hasattr(thread, "_setup_pipe_out") or not hasattr(thread, "io_loop"):
        return "ipykernel's IOPub thread has no pipe of the shape kgate knows"
    path = app.ip + "-pipe"
    done, failed = threading.Event(), []

    def move():  # on the IOPub thread, which owns the socket
        try:
            stream.socket.bind("ipc://" + path)
            stream.socket.unbind("tcp://127.0.0.1:%i" % port)
        except Exception as e:  # noqa: BLE001 (reported, the pipe stays as it was)
            failed.append(e)
        done.set()

    thread.io_loop.add_callback(move)
    if not done.wait(5):
        return "the IOPub thread did not run the move within 5 s"
    if failed:
        return "cannot move the IOPub pipe: %s" % failed[0]

    def setup_pipe_out():  # what a forked child connects with (ipykernel's, on the ipc path)
        import zmq

        ctx = zmq.Context()
        out = ctx.socket(zmq.PUSH)
        out.linger = 3000
        out.connect("ipc://" + path)
        return ctx, out

    thread._setup_pipe_out = setup_pipe_out
    return ""


def report():
    s = _state or {}
    task = _task  # read once
    return _Json({"version": VERSION, "features": sorted(s.get("features", [])), "off": s.get("off", {}),
                  "task": task["request"] if task else None})


def install(host):
    global _state
    if _state is not None:
        if host != _state["host"]:
            raise PermissionError("kgate's kernel side is already installed for another host")
        return report()
    launched_for = os.environ.get("KGATE_HOST_SESSION", "")
    if launched_for and launched_for != host:
        raise PermissionError("this kernel was launched for another host (KGATE_HOST_SESSION)")
    from IPython import get_ipython

    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    if kernel is None or not isinstance(getattr(kernel, "shell_handlers", None), dict):
        raise RuntimeError("not an ipykernel kernel: no shell_handlers to patch")
    features, off = [], {}
    _state = {"host": host, "kernel": kernel, "shell": shell, "features": features, "off": off}

    def need(*names):
        missing = [n for n in names if not hasattr(kernel, n)]
        return "ipykernel lacks " + ", ".join(missing) if missing else ""

    why = need("session", "iopub_socket", "_topic", "control_handlers")
    if not why:
        for table, channel in ((kernel.shell_handlers, "shell"), (kernel.control_handlers, "control")):
            if "shutdown_request" in table:
                table["shutdown_request"] = _guard_shutdown(kernel, channel, table["shutdown_request"])
        features.append("shutdown_guard")
    else:
        off["shutdown_guard"] = why
    why = need("_publish_execute_input", "execution_count")
    if not why and "execute_request" in kernel.shell_handlers:
        kernel.shell_handlers["execute_request"] = _echo_silent(kernel, kernel.shell_handlers["execute_request"])
        features.append("silent_echo")
    else:
        off["silent_echo"] = why or "ipykernel has no execute_request handler"
    why = need("get_parent", "control_handlers", "session")
    events = getattr(shell, "events", None)
    if not why and events is None:
        why = "IPython has no events"
    if not why and not hasattr(signal, "pthread_kill"):
        why = "no signal.pthread_kill on this platform"
    if not why:
        events.register("pre_execute", _cell_begins)
        events.register("post_execute", _cell_ends)
        kernel.control_handlers["kgate_request"] = _stop(kernel)
        features.append("stop")
        features.append("close")
    else:
        off["stop"] = why
        off["close"] = "needs the stop"
    if "stop" not in features:
        off["tasks"] = "needs the stop"
    elif not hasattr(ctypes, "pythonapi"):
        off["tasks"] = "no ctypes.pythonapi (PyThreadState_SetAsyncExc)"
    elif not (_route(kernel, "stdout") and _route(kernel, "stderr")):
        off["tasks"] = "sys.stdout or sys.stderr cannot be routed per thread"
    else:
        features.append("tasks")
    if "tasks" not in features:
        off["run_async"] = "needs the tasks"
    elif not callable(getattr(shell, "register_magic_function", None)):
        off["run_async"] = "IPython has no register_magic_function"
    else:
        shell.register_magic_function(_run_async, magic_kind="cell", magic_name="run_async")
        features.append("run_async")
    why = _pipe_to_ipc(kernel)
    if why:
        off["ipc_pipe"] = why
    else:
        features.append("ipc_pipe")
    return report()
