#!/usr/bin/python3
"""Load benchmark: many kernels and many websocket clients at once, checking that no reply is lost,
crossed or duplicated; kgate beside jupyter_server in the same run.

usage: bench/load.sh [--kernels N] [--clients M] [--cells K] [--servers kgate,jupyter_server]
                     [--cell-timeout S] [--start-concurrency C] [--out FILE] [--strict-peer]
                     [--ipython-history] [--keep-tmp]

For each server in turn (kgate first, then jupyter_server, so each has the machine to itself):
start it with a token, start N kernels (C POSTs at a time), open M websocket clients spread
round-robin over the kernels (client i on kernel i mod N; every second client connects without
?session_id=, as a jupyter_server 1.23 relay does), let each client do one kernel_info round trip,
then start all clients at once: each runs K cells one after another, concurrently with the others.

Cell n of client c prints a token  L<c>-<n>-<12 hex nonce>  and returns it as its execute_result.
Each client checks every message it receives:
  lost        a cell whose execute_reply, iopub idle, stream or execute_result did not arrive
              within --cell-timeout (the run goes on with the next cell)
  crossed     a shell reply whose parent is not one of this client's requests (or names another
              session); a stream/execute_result of its own cell without exactly its token, or with
              someone else's; iopub of a cell run on another kernel; a token under the wrong parent
  duplicated  a second execute_reply, execute_result, execute_input or busy/idle status for one
              request, or the token twice in one cell's stream
The kernel's own stderr (an IPython warning) is counted as "kernel stderr", listed, and searched
for foreign tokens; only stdout must be exactly the cell's token.
Each server gets its own IPYTHONDIR with IPython's history off (--ipython-history leaves it on):
50 kernels sharing one history.sqlite block each other for sqlite's 5 s lock timeout.
iopub is broadcast in Jupyter: every client of a kernel also gets the iopub of the other clients'
cells on that kernel. Those are counted ("broadcast iopub") and checked against the cell that
sent them (same kernel, that cell's token), not counted as crossed.

Exit status: 0 kgate had no lost, crossed, duplicated or failed cell (jupyter_server's figures are
reported, and do not change it unless --strict-peer), 1 otherwise or a step failed, 2 usage,
130 interrupted. Raw JSON goes to bench/results/load-latest.json.

The client code (Registry, Client, run_load) is also used by bench/soak.py and
tests/integration/test_load.py.
"""
import argparse
import asyncio
import concurrent.futures
import ctypes
import json
import os
import re
import resource
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import types
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True   # no bench/__pycache__ left behind
import bench  # noqa: E402  (Server, kill_tree, sweep, rss_mb, cpu_s, finish, versions)

T0 = time.monotonic()


log = bench.logger("load", T0)


# ---------------------------------------------------------------- processes

def die_with_parent(sig=signal.SIGTERM):
    """preexec_fn: the child gets `sig` when the thread that spawned it ends (as in
    tests/integration/conftest.py), so a bench killed with SIGKILL leaves no server behind.
    Servers are spawned from the main thread only."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(sig))   # PR_SET_PDEATHSIG


class _Popen(subprocess.Popen):
    def __init__(self, *a, **kw):
        kw.setdefault("preexec_fn", die_with_parent)
        super().__init__(*a, **kw)


def use_pdeathsig():
    """bench.py spawns with start_new_session=True (its own process group) and no death signal;
    give every process it spawns PR_SET_PDEATHSIG(SIGTERM) as well, without touching bench.py."""
    sp = types.ModuleType("subprocess")
    sp.__dict__.update({k: v for k, v in vars(subprocess).items() if not k.startswith("__")})
    sp.Popen = _Popen
    bench.subprocess = sp


def copy_kgate(tmp):
    """Run a hard link to (else a copy of) the binary, so a relink during the run changes
    nothing: the linker writes a new file, and the link keeps the old one (the binary is
    hundreds of MB with its debug info, so a copy takes seconds)."""
    dst = os.path.join(tmp, "kgate")
    try:
        os.link(bench.KGATE_BIN, dst)
    except OSError:
        shutil.copy2(bench.KGATE_BIN, dst)
    bench.KGATE_BIN = dst
    return dst


def start_server(kind, tmp, label, extra=(), live=None, ipython_history=False, logf=None):
    """A bench.Server with its own IPYTHONDIR, where (unless ipython_history) IPython's history
    is off: dozens of kernels sharing one history.sqlite lock each other out for sqlite's 5 s
    timeout and print 'database is locked' on stderr, which measures sqlite, not the gateway."""
    s = bench.Server(kind, tmp, label, extra)
    ipdir = os.path.join(s.root, "ipython")
    os.makedirs(os.path.join(ipdir, "profile_default"), exist_ok=True)
    if not ipython_history:
        with open(os.path.join(ipdir, "profile_default", "ipython_kernel_config.py"), "w") as f:
            f.write("c.HistoryManager.enabled = False\n")
    s.env["IPYTHONDIR"] = ipdir
    if live is not None:
        live.append(s)
    logf = logf or log
    logf("starting %s on %s" % (label, s.url))
    ms = s.start()
    logf("%s answered GET /api after %.0f ms" % (label, ms))
    return s


def kernel_info_roundtrip(server, kernel_id, timeout=180):
    """Open a websocket to the kernel, do one kernel_info round trip, close: the kernel is up
    (jupyter_server answers POST /api/kernels before its kernel is, and keeps its model
    'starting' until a client connects)."""
    async def go():
        c = Client(0, server.url, server.token, kernel_id, Registry())
        await c.connect(timeout)
        try:
            await c.kernel_info(timeout)
        finally:
            await c.close()
    asyncio.run(go())


def children(pid):
    kids = set()
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except FileNotFoundError:
        return kids
    for tid in tasks:
        try:
            with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                kids.update(int(x) for x in f.read().split())
        except OSError:
            pass
    return kids


LOG_PROBLEM_RE = re.compile(r"^\S+ \S+ (warn|warning|error|critical) ")
LOG_KERNEL_RE = re.compile(r"kernel ([0-9a-f-]{36}): start failed")


def log_excerpt(path, limit=40):
    """kgate's warn/error lines, and every line about a kernel whose start failed (its launch,
    relaunches, the failure), from a server log: what to look at when a step went wrong."""
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    failed = set(LOG_KERNEL_RE.findall("\n".join(lines)))
    keep = [ln for ln in lines if LOG_PROBLEM_RE.match(ln) or any(k in ln for k in failed)]
    return "\n".join(keep[:limit]) + ("\n... (%d more)" % (len(keep) - limit) if len(keep) > limit else "")


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


# ---------------------------------------------------------------- the websocket client

TOKEN_RE = re.compile(r"L\d{4}-\d{3}-[0-9a-f]{12}")
MAX_DETAILS = 50          # anomalies kept verbatim per run


class Registry:
    """Every request any client of this run sent: msg_id -> Owner; and the anomaly counters."""

    def __init__(self):
        self.owners = {}
        self.counts = {"crossed": 0, "duplicated": 0, "late": 0, "unattributed": 0, "broadcast": 0,
                       "kernel_stderr": 0}
        self.details = []

    def anomaly(self, kind, text):
        self.counts[kind] += 1
        if len(self.details) < MAX_DETAILS:
            self.details.append("%s: %s" % (kind, text))


class Owner:
    __slots__ = ("client", "kernel", "session", "token")

    def __init__(self, client, kernel, session, token):
        self.client, self.kernel, self.session, self.token = client, kernel, session, token


class Cell:
    """One request in flight and what arrived for it."""
    __slots__ = ("msg_id", "n", "token", "reply_type", "t_send", "latency", "reply", "busy", "idle",
                 "inputs", "text", "stderr", "text_bytes", "result", "results", "error", "done", "timed_out",
                 "event", "keep_text")

    def __init__(self, msg_id, n, token, reply_type, keep_text=True):
        self.msg_id, self.n, self.token, self.reply_type = msg_id, n, token, reply_type
        self.t_send = self.latency = self.reply = self.result = self.error = None
        self.busy = self.idle = self.inputs = self.results = 0
        self.text, self.stderr, self.text_bytes, self.keep_text = "", "", 0, keep_text
        self.done = self.timed_out = False
        self.event = asyncio.Event()


def _text_of(msg):
    c = msg.get("content") or {}
    mt = msg.get("msg_type")
    if mt == "stream":
        return c.get("text", "")
    if mt in ("execute_result", "display_data"):
        return (c.get("data") or {}).get("text/plain", "")
    return ""


class Client:
    """One websocket client of /api/kernels/{id}/channels (legacy JSON protocol, tornado's
    asyncio websocket client), with the checks of the module docstring."""

    def __init__(self, cid, base_url, token, kernel_id, registry, with_session_id=True):
        self.cid, self.kernel, self.reg = cid, kernel_id, registry
        self.session = uuid.uuid4().hex
        ws = base_url.replace("http", "ws", 1) + "/api/kernels/%s/channels" % kernel_id
        self.url = ws + ("?session_id=%s" % self.session if with_session_id else "")
        self.token = token
        self.conn = None
        self.cells = {}
        self.closed = None          # why the connection ended, if it did
        self.received = 0
        self.reader = None

    async def connect(self, timeout=120):
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect
        headers = {"Authorization": "token " + self.token} if self.token else {}
        req = HTTPRequest(self.url, headers=headers, connect_timeout=timeout, request_timeout=timeout)
        self.conn = await websocket_connect(req, max_message_size=1 << 30)
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self):
        try:
            while True:
                m = await self.conn.read_message()
                if m is None:
                    self.closed = "closed by the server (code %s, %r)" % (self.conn.close_code, self.conn.close_reason)
                    break
                self.received += 1
                if isinstance(m, bytes):   # legacy binary: messages with buffers; none are expected
                    self.reg.anomaly("unattributed", "client %d: binary frame of %d bytes" % (self.cid, len(m)))
                    continue
                self._dispatch(json.loads(m))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - ends this client, reported
            self.closed = "reader failed: %s: %s" % (type(e).__name__, e)
        for c in self.cells.values():
            c.event.set()

    # ---- checks --------------------------------------------------------------------

    def _dispatch(self, msg):
        reg = self.reg
        ch = msg.get("channel")
        mt = msg.get("msg_type") or (msg.get("header") or {}).get("msg_type")
        parent = msg.get("parent_header") or {}
        pid = parent.get("msg_id")
        cell = self.cells.get(pid) if pid else None
        if ch != "iopub":
            if cell is None:
                o = reg.owners.get(pid)
                reg.anomaly("crossed", "%s %s for %s (msg %s) arrived at client %d on kernel %s"
                            % (ch, mt, "client %d on kernel %s" % (o.client, o.kernel) if o else "an unknown request",
                               pid, self.cid, self.kernel[:8]))
                return
            if parent.get("session") != self.session:
                reg.anomaly("crossed", "client %d: %s's parent session %s is not ours (%s)"
                            % (self.cid, mt, parent.get("session"), self.session))
            if mt != cell.reply_type:
                reg.anomaly("crossed", "client %d: %s on %s for a %s request" % (self.cid, mt, ch, cell.reply_type))
                return
            if cell.reply is not None:
                reg.anomaly("duplicated", "client %d cell %d: second %s" % (self.cid, cell.n, mt))
                return
            cell.reply = msg.get("content") or {}
            if cell.timed_out:
                reg.anomaly("late", "client %d cell %d: %s after the timeout" % (self.cid, cell.n, mt))
            self._maybe_done(cell)
            return
        if cell is None:
            self._foreign_iopub(pid, mt, msg)
            return
        if mt == "status":
            state = (msg.get("content") or {}).get("execution_state")
            if state == "idle":
                cell.idle += 1
                if cell.idle > 1:
                    reg.anomaly("duplicated", "client %d cell %d: second idle" % (self.cid, cell.n))
                    return
                if cell.timed_out:
                    reg.anomaly("late", "client %d cell %d: idle after the timeout" % (self.cid, cell.n))
                self._maybe_done(cell)
            elif state == "busy":
                cell.busy += 1
                if cell.busy > 1:
                    reg.anomaly("duplicated", "client %d cell %d: second busy" % (self.cid, cell.n))
        elif mt == "stream":
            t = _text_of(msg)
            if (msg.get("content") or {}).get("name") != "stdout":
                # the kernel's own stderr (an IPython warning, say): reported, checked for tokens
                cell.stderr += t
                reg.anomaly("kernel_stderr", "client %d cell %d: stderr %r" % (self.cid, cell.n, t[:160]))
                return
            cell.text_bytes += len(t)
            if cell.keep_text:
                cell.text += t
            if cell.idle:   # iopub is ordered: nothing of a cell comes after its idle
                reg.anomaly("duplicated", "client %d cell %d: stream after idle: %r" % (self.cid, cell.n, t[:80]))
        elif mt in ("execute_result", "display_data"):
            cell.results += 1
            if cell.results > 1:
                reg.anomaly("duplicated", "client %d cell %d: second %s %r" % (self.cid, cell.n, mt, _text_of(msg)[:80]))
            else:
                cell.result = _text_of(msg)
        elif mt == "execute_input":
            cell.inputs += 1
            if cell.inputs > 1:
                reg.anomaly("duplicated", "client %d cell %d: second execute_input" % (self.cid, cell.n))
        elif mt == "error":
            cell.error = msg.get("content")

    def _foreign_iopub(self, pid, mt, msg):
        reg = self.reg
        o = reg.owners.get(pid) if pid else None
        text = _text_of(msg)
        toks = TOKEN_RE.findall(text) if text else []
        if o is None:
            if toks:
                reg.anomaly("crossed", "client %d on kernel %s got %s with token(s) %s under an unknown parent %s"
                            % (self.cid, self.kernel[:8], mt, toks, pid))
            elif mt not in ("status",):   # a gateway's own kernel_info nudge shows only busy/idle
                reg.anomaly("unattributed", "client %d: %s with parent %s: %r" % (self.cid, mt, pid, text[:120]))
            return
        if o.kernel != self.kernel:
            reg.anomaly("crossed", "iopub %s of client %d's cell (kernel %s) reached client %d on kernel %s"
                        % (mt, o.client, o.kernel[:8], self.cid, self.kernel[:8]))
            return
        reg.counts["broadcast"] += 1
        for t in toks:
            if t != o.token:
                reg.anomaly("crossed", "client %d saw broadcast %s of client %d's request with token %s, not %s"
                            % (self.cid, mt, o.client, t, o.token))

    def _maybe_done(self, cell):
        if cell.reply is not None and cell.idle and not cell.done:
            cell.done = True
            cell.latency = time.perf_counter() - cell.t_send
            cell.event.set()

    def verdict(self, cell):
        """(lost parts, crossed text or None, duplicated text or None) of a finished or timed-out cell."""
        lost = []
        if cell.reply is None:
            lost.append("execute_reply" if cell.reply_type == "execute_reply" else cell.reply_type)
        if not cell.idle:
            lost.append("idle")
        if cell.token is not None and cell.idle:
            if not cell.text:
                lost.append("stream")
            if cell.result is None:
                lost.append("execute_result")
        crossed = dup = None
        if cell.token is not None:
            want_text, want_result = cell.token + "\n", repr(cell.token)
            toks = TOKEN_RE.findall(cell.text) + TOKEN_RE.findall(cell.result or "") + TOKEN_RE.findall(cell.stderr)
            foreign = sorted(set(t for t in toks if t != cell.token))
            if foreign:
                crossed = "client %d cell %d got foreign token(s) %s" % (self.cid, cell.n, foreign)
            elif cell.text and cell.text != want_text:
                if cell.text.count(cell.token) > 1:
                    dup = "client %d cell %d: its token %d times in the stream" % (self.cid, cell.n, cell.text.count(cell.token))
                else:
                    crossed = "client %d cell %d: stream %r, not %r" % (self.cid, cell.n, cell.text[:120], want_text)
            elif cell.result is not None and cell.result != want_result:
                crossed = "client %d cell %d: execute_result %r, not %r" % (self.cid, cell.n, cell.result[:120], want_result)
        return lost, crossed, dup

    # ---- requests ------------------------------------------------------------------

    def _message(self, msg_type, content, msg_id):
        return json.dumps({
            "header": {"msg_id": msg_id, "msg_type": msg_type, "session": self.session, "username": "kgate-load",
                       "version": "5.3", "date": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())},
            "parent_header": {}, "metadata": {}, "content": content, "channel": "shell", "buffers": []})

    async def request(self, msg_type, content, n, token=None, timeout=120, keep_text=True):
        """Send one shell request and wait for its reply and idle (or the timeout). Returns the Cell."""
        if self.closed:
            raise ConnectionError("client %d: websocket %s" % (self.cid, self.closed))
        msg_id = uuid.uuid4().hex
        cell = Cell(msg_id, n, token, msg_type.replace("_request", "_reply"), keep_text)
        self.cells[msg_id] = cell
        self.reg.owners[msg_id] = Owner(self.cid, self.kernel, self.session, token)
        data = self._message(msg_type, content, msg_id)
        cell.t_send = time.perf_counter()
        await self.conn.write_message(data)
        try:
            await asyncio.wait_for(cell.event.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        if not cell.done:
            cell.timed_out = True
        return cell

    async def kernel_info(self, timeout=180):
        cell = await self.request("kernel_info_request", {}, -1, timeout=timeout)
        if not cell.done:
            raise TimeoutError("client %d: no kernel_info_reply and idle within %gs from kernel %s (%s)"
                               % (self.cid, timeout, self.kernel, self.closed or "connection open"))
        return cell

    async def execute(self, code, n, token=None, timeout=120, keep_text=True):
        return await self.request("execute_request", {
            "code": code, "silent": False, "store_history": True, "user_expressions": {},
            "allow_stdin": False, "stop_on_error": False}, n, token, timeout, keep_text)

    async def close(self):
        if self.conn is not None:
            self.conn.close()
        if self.reader is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.reader), 2)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                self.reader.cancel()


def token_cell(cid, n):
    tok = "L%04d-%03d-%s" % (cid % 10000, n % 1000, secrets.token_hex(6))
    return tok, "_t = %r\nprint(_t)\n_t" % tok


async def _run_load(url, token, kernel_ids, clients, cells, cell_timeout, connect_timeout, progress):
    reg = Registry()
    cl = [Client(i, url, token, kernel_ids[i % len(kernel_ids)], reg, with_session_id=(i % 2 == 0))
          for i in range(clients)]
    res = {"kernels": len(kernel_ids), "clients": clients, "cells": cells, "total_cells": clients * cells,
           "errors": []}
    t_connect = time.perf_counter()
    try:
        # connect everyone (at most 50 handshakes at a time), then one kernel_info each
        sem = asyncio.Semaphore(50)

        async def connect(c):
            async with sem:
                await c.connect(connect_timeout)
            await c.kernel_info(connect_timeout)

        done = await asyncio.gather(*(connect(c) for c in cl), return_exceptions=True)
        bad = [(c.cid, d) for c, d in zip(cl, done) if isinstance(d, BaseException)]
        res["connect_s"] = round(time.perf_counter() - t_connect, 2)
        if bad:
            res["errors"].append("%d of %d clients failed to connect: client %d: %s: %s"
                                 % (len(bad), clients, bad[0][0], type(bad[0][1]).__name__, bad[0][1]))
        live = [c for c, d in zip(cl, done) if not isinstance(d, BaseException)]
        progress("%d clients connected and answered kernel_info in %.1f s" % (len(live), res["connect_s"]))

        finished = [0]

        async def run(c):
            out = []
            for n in range(cells):
                tok, code = token_cell(c.cid, n)
                if c.closed:
                    out.append((n, None, "websocket " + c.closed))
                    continue
                try:
                    out.append((n, await c.execute(code, n, tok, cell_timeout), None))
                except Exception as e:  # noqa: BLE001 - the cell counts as lost
                    out.append((n, None, "%s: %s" % (type(e).__name__, e)))
            finished[0] += 1
            return out

        async def ticker():
            while True:
                await asyncio.sleep(10)
                progress("%d/%d clients done, %d cells replied"
                         % (finished[0], len(live), sum(1 for c in live for x in c.cells.values() if x.done) - len(live)))

        ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        tick = asyncio.ensure_future(ticker())
        outs = await asyncio.gather(*(run(c) for c in live))
        wall = time.perf_counter() - t0
        tick.cancel()
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        await asyncio.sleep(1.0)   # late duplicates still count
        lat, lost, failed = [], 0, 0
        lost_parts = {}
        for c, out in zip(live, outs):
            for n, cell, err in out:
                if cell is None:
                    lost += 1
                    lost_parts[err] = lost_parts.get(err, 0) + 1
                    if len(reg.details) < MAX_DETAILS:
                        reg.details.append("lost: client %d cell %d: %s" % (c.cid, n, err))
                    continue
                parts, crossed, dup = c.verdict(cell)
                if parts:
                    lost += 1
                    key = "missing " + "+".join(parts)
                    lost_parts[key] = lost_parts.get(key, 0) + 1
                    if len(reg.details) < MAX_DETAILS:
                        reg.details.append("lost: client %d cell %d (kernel %s): %s never arrived within %gs%s"
                                           % (c.cid, n, c.kernel[:8], "+".join(parts), cell_timeout,
                                              "; websocket " + c.closed if c.closed else ""))
                if crossed:
                    reg.anomaly("crossed", crossed)
                if dup:
                    reg.anomaly("duplicated", dup)
                if cell.reply is not None and cell.reply.get("status") != "ok":
                    failed += 1
                    if len(reg.details) < MAX_DETAILS:
                        reg.details.append("failed: client %d cell %d: %s" % (c.cid, n, json.dumps(cell.reply)[:300]))
                if cell.done and not parts:
                    lat.append(cell.latency)
        missing_clients = clients - len(live)
        lost += missing_clients * cells
        if missing_clients:
            lost_parts["client never connected"] = missing_clients * cells
        lat.sort()
        q = lambda p: round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3, 1) if lat else None  # noqa: E731
        res.update({
            "wall_s": round(wall, 2), "cells_per_s": round(len(lat) / wall, 1) if wall > 0 else None,
            "ok_cells": len(lat), "p50_ms": round(statistics.median(lat) * 1e3, 1) if lat else None,
            "p90_ms": q(0.90), "p99_ms": q(0.99), "max_ms": round(lat[-1] * 1e3, 1) if lat else None,
            "lost": lost, "lost_parts": lost_parts, "crossed": reg.counts["crossed"],
            "duplicated": reg.counts["duplicated"], "failed": failed, "late": reg.counts["late"],
            "broadcast_iopub": reg.counts["broadcast"], "unattributed": reg.counts["unattributed"],
            "kernel_stderr": reg.counts["kernel_stderr"],
            "messages_received": sum(c.received for c in cl),
            "client_cpu_s": round((ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime), 2),
            "closed_by_server": sum(1 for c in live if c.closed and c.closed.startswith("closed by")),
            "details": reg.details})
        return res
    finally:
        await asyncio.gather(*(c.close() for c in cl), return_exceptions=True)


def run_load(url, token, kernel_ids, clients, cells, cell_timeout=120.0, connect_timeout=180.0, progress=None):
    """Run the load against a gateway whose kernels already exist; returns the result dict
    (see the module docstring for lost / crossed / duplicated). Blocks; uses its own event loop."""
    return asyncio.run(_run_load(url, token, list(kernel_ids), clients, cells, cell_timeout, connect_timeout,
                                 progress or (lambda s: None)))


def anomalies(res):
    return res.get("lost", 1) + res.get("crossed", 1) + res.get("duplicated", 1) + res.get("failed", 1)


# ---------------------------------------------------------------- kernels over REST

def start_kernels(server, n, concurrency, timeout=300):
    """POST n kernels, `concurrency` at a time; returns (ids, errors)."""
    ids, errors = [], []

    def one(i):
        deadline = time.monotonic() + timeout
        while True:
            try:
                return server.rest("POST", "/api/kernels", {"name": "python3"}, timeout=timeout)["id"]
            except Exception as e:  # noqa: BLE001
                code = getattr(e, "code", None)
                if code == 503 and time.monotonic() < deadline:   # max_kernels: Retry-After
                    time.sleep(1)
                    continue
                body = ""
                try:
                    body = e.read().decode(errors="replace")[:300]
                except Exception:  # noqa: BLE001
                    pass
                raise RuntimeError("POST /api/kernels #%d: %s %s" % (i, e, body))

    with concurrent.futures.ThreadPoolExecutor(concurrency) as ex:
        futs = [ex.submit(one, i) for i in range(n)]
        for f in futs:
            try:
                ids.append(f.result())
            except Exception as e:  # noqa: BLE001
                errors.append(str(e))
        # a POST that timed out here may still come through: its kernel goes with Server.stop
    return ids, errors


def delete_kernels(server, ids, concurrency=8):
    errors = []

    def one(kid):
        try:
            server.rest("DELETE", "/api/kernels/" + kid, timeout=60)
        except Exception as e:  # noqa: BLE001
            errors.append("DELETE %s: %s" % (kid, e))

    with concurrent.futures.ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(one, ids))
    return errors


# ---------------------------------------------------------------- the run

LABELS = {"kgate": "kgate", "peer": "jupyter_server"}


def bench_one(kind, tmp, args, live, R):
    label = LABELS[kind]
    out = {"server": label, "errors": []}
    R["runs"][label] = out
    s = start_server(kind, tmp, label, live=live, ipython_history=args.ipython_history)
    out["rss_idle_mb"] = bench.rss_mb(s.proc.pid)
    t = time.perf_counter()
    ids, errs = start_kernels(s, args.kernels, args.start_concurrency)
    out["kernel_posts_s"] = round(time.perf_counter() - t, 1)
    out["errors"] += errs
    if errs:
        out["errors"].append("%s log excerpt (warn/error lines and the failed kernels' lines):\n%s"
                             % (label, log_excerpt(s.log_path)))
    log("%s: %d/%d kernels POSTed in %.1f s%s" % (label, len(ids), args.kernels, out["kernel_posts_s"],
                                                  "; %d failed: %s" % (len(errs), errs[0]) if errs else ""))
    if not ids:
        raise bench.StepError("%s: no kernel started: %s" % (label, errs[:1]))
    cpu0 = bench.cpu_s(s.proc.pid)
    res = run_load(s.url, s.token, ids, args.clients, args.cells, args.cell_timeout,
                   progress=lambda m: log("%s: %s" % (label, m)))
    if s.proc.poll() is not None:
        out["errors"].append("%s exited with status %s during the run; log tail:\n%s"
                             % (label, s.proc.returncode, bench.tail(s.log_path)))
    else:
        res["gateway_cpu_s"] = round(bench.cpu_s(s.proc.pid) - cpu0, 2)
        res["rss_end_mb"] = bench.rss_mb(s.proc.pid)
    res["errors"] = out["errors"] + res["errors"]
    res["setup_s"] = round(out["kernel_posts_s"] + res.get("connect_s", 0), 1)
    out.update(res)
    if len(ids) < args.kernels:
        out["errors"].append("%d of %d kernels did not start" % (args.kernels - len(ids), args.kernels))
    log("%s: %d cells in %.1f s (%.1f/s), p50 %s ms p99 %s ms, lost %d crossed %d duplicated %d failed %d"
        % (label, res["total_cells"], res.get("wall_s", 0), res.get("cells_per_s") or 0, res.get("p50_ms"),
           res.get("p99_ms"), res["lost"], res["crossed"], res["duplicated"], res["failed"]))
    for d in res["details"][:10]:
        log("  %s" % d)
    t = time.perf_counter()
    out["errors"] += delete_kernels(s, ids)
    out["delete_s"] = round(time.perf_counter() - t, 1)
    log("%s: %d kernels deleted in %.1f s" % (label, len(ids), out["delete_s"]))
    s.stop()
    live.remove(s)
    return out


def fmt(v, f="%s"):
    if v is None:
        return "—"
    if isinstance(v, float) and f == "%s":
        return "{:,.1f}".format(v)
    if isinstance(v, int) and f == "%s":
        return "{:,}".format(v)
    return f % v


def print_table(R):
    runs = [R["runs"].get(n) for n in ("kgate", "jupyter_server")]
    k, p = [r or {} for r in runs]
    rows = [("kernels", "kernels"), ("clients (websockets)", "clients"), ("cells per client", "cells"),
            ("total cells", "total_cells"), ("setup: POST kernels + connect + kernel_info (s)", "setup_s"),
            ("wall time of the cells (s)", "wall_s"), ("cells/s", "cells_per_s"),
            ("cell latency p50 (ms)", "p50_ms"), ("cell latency p99 (ms)", "p99_ms"),
            ("cell latency max (ms)", "max_ms"), ("lost", "lost"), ("crossed", "crossed"),
            ("duplicated", "duplicated"), ("failed (reply status not ok)", "failed"),
            ("broadcast iopub checked (other clients' cells)", "broadcast_iopub"),
            ("unattributed iopub", "unattributed"), ("kernel stderr messages", "kernel_stderr"), ("gateway CPU over the cells (s)", "gateway_cpu_s"),
            ("gateway RSS after the cells (MB)", "rss_end_mb"), ("client CPU (s)", "client_cpu_s")]
    ratio_keys = {"setup_s", "wall_s", "cells_per_s", "p50_ms", "p99_ms", "max_ms", "gateway_cpu_s", "rss_end_mb"}
    hdr = ["metric", "kgate", "jupyter_server", "kgate/jupyter_server"]
    table = []
    for name, key in rows:
        kv, pv = k.get(key), p.get(key)
        ratio = "%.2f×" % (kv / pv) if key in ratio_keys and isinstance(kv, (int, float)) and pv else "—"
        table.append([name, fmt(kv), fmt(pv) if p else "not run", ratio])
    w = [max(len(r[i]) for r in table + [hdr]) for i in range(4)]
    line = lambda c: "| " + " | ".join(x.ljust(w[i]) if i == 0 else x.rjust(w[i]) for i, x in enumerate(c)) + " |"  # noqa: E731
    print("\nload: %d kernels, %d websocket clients round-robin, %d cells each; %s cpus; %s"
          % (R["meta"]["kernels"], R["meta"]["clients"], R["meta"]["cells"], R["meta"]["cpus"], R["meta"]["date"]))
    print(line(hdr))
    print("|" + "|".join(("-" * (w[i] + 1) + ":") if i else ("-" * (w[i] + 2)) for i in range(4)) + "|")
    for r in table:
        print(line(r))
    for label in ("kgate", "jupyter_server"):
        r = R["runs"].get(label)
        if r and r.get("details"):
            print("\n%s anomalies (first %d of lost/crossed/duplicated/failed/unattributed):"
                  % (label, min(len(r["details"]), MAX_DETAILS)))
            for d in r["details"][:20]:
                print("  - " + d)
        if r and r.get("lost_parts"):
            print("%s lost cells by cause: %s" % (label, r["lost_parts"]))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="bench/load.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=int, default=50)
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--cells", type=int, default=20)
    ap.add_argument("--servers", default="kgate,jupyter_server", help="kgate,jupyter_server (in this order)")
    ap.add_argument("--cell-timeout", type=float, default=120.0, help="seconds before a cell counts as lost")
    ap.add_argument("--start-concurrency", type=int, default=8, help="kernel POSTs at a time")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "load-latest.json"))
    ap.add_argument("--strict-peer", action="store_true", help="jupyter_server's anomalies also fail the run")
    ap.add_argument("--ipython-history", action="store_true",
                    help="leave IPython's history on (all kernels of a server share one history.sqlite)")
    ap.add_argument("--keep-tmp", action="store_true")
    args = ap.parse_args(argv)
    servers = [x.strip() for x in args.servers.split(",") if x.strip()]
    if any(x not in ("kgate", "jupyter_server") for x in servers) or min(args.kernels, args.clients, args.cells) < 1:
        ap.error("bad --servers or a size below 1")

    bench.interrupt_on_stop_signals()
    if "kgate" in servers and not os.access(bench.KGATE_BIN, os.X_OK):
        print("load: no kgate binary at %s" % bench.KGATE_BIN, file=sys.stderr)
        return 2
    use_pdeathsig()
    bench.START_TIMEOUT = 60.0
    tmp = tempfile.mkdtemp(prefix="kgate-bench-load-")
    R = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpus": os.cpu_count(), "kernels": args.kernels,
                  "clients": args.clients, "cells": args.cells, "cell_timeout_s": args.cell_timeout,
                  "ipython_history": args.ipython_history,
                  "kgate_bin": bench.KGATE_BIN, "versions": bench.versions(), "loadavg_start": loadavg()},
         "runs": {}, "errors": []}
    live, interrupted = [], False
    try:
        if "kgate" in servers:
            copy_kgate(tmp)
        for name in servers:
            kind = "kgate" if name == "kgate" else "peer"
            try:
                bench_one(kind, tmp, args, live, R)
            except KeyboardInterrupt:
                raise
            except Exception as e:  # noqa: BLE001 - recorded; the other server still runs
                msg = str(e) if isinstance(e, bench.StepError) else "%s: %s" % (type(e).__name__, e)
                log("FAILED %s: %s" % (name, msg))
                R["errors"].append({"step": name, "error": msg})
                for s in list(live):
                    if s.label == name:
                        R["errors"][-1]["error"] += "\nlog tail:\n" + bench.tail(s.log_path)
                        s.stop()
                        live.remove(s)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: stopping everything")
    finally:
        bench.stop_all(live, tmp, R, args.keep_tmp, log)
    for name, r in R["runs"].items():
        for e in r.get("errors", []):
            R["errors"].append({"step": name, "error": e})
        if name == "kgate" and "lost" in r and anomalies(r):
            R["errors"].append({"step": "kgate", "error": "lost %d, crossed %d, duplicated %d, failed %d"
                                % (r["lost"], r["crossed"], r["duplicated"], r["failed"])})
        if name == "jupyter_server" and "lost" in r and anomalies(r):
            msg = ("lost %d, crossed %d, duplicated %d, failed %d"
                   % (r["lost"], r["crossed"], r["duplicated"], r["failed"]))
            if args.strict_peer:
                R["errors"].append({"step": name, "error": msg})
            else:
                R.setdefault("peer_anomalies", msg)
    R["meta"]["loadavg_end"] = loadavg()
    R["meta"]["seconds"] = round(time.monotonic() - T0, 1)
    print_table(R)
    if R.get("peer_anomalies"):
        print("\njupyter_server: %s (reported, not failing the run; --strict-peer to fail)" % R["peer_anomalies"])
    return bench.finish(R, args.out, interrupted)


if __name__ == "__main__":
    sys.exit(main())
