#!/usr/bin/python3
"""The benchmark's clients: execute round trips and an output flood, either straight to a kernel
over ZMQ (the floor, no gateway in between) or through a Jupyter gateway's websocket channels
(jupyter_server, kgate, or any server with the same REST and websocket API).

usage: wsclient.py direct N [--store-history]
       wsclient.py direct-flood MEGABYTES
       wsclient.py direct-prints COUNT
       wsclient.py gateway URL TOKEN N [--kernel NAME] [--store-history]
       wsclient.py flood URL TOKEN MEGABYTES [--kernel NAME] [--no-utf8-check] [--whole-frames]
       wsclient.py prints URL TOKEN COUNT [--kernel NAME] [--no-utf8-check] [--whole-frames]
       wsclient.py interleaved URL TOKEN N [--kernel NAME] [--pairs K]
       wsclient.py relayed N [--pairs K]

direct, direct-flood, direct-prints
                      start a python3 kernel with jupyter_client's KernelManager and talk to its
                      shell (DEALER) and iopub (SUB) sockets with blocking polls.
gateway, flood, prints
                      POST URL/api/kernels, open URL/api/kernels/{id}/channels with the token in
                      an Authorization header (TCP_NODELAY on), DELETE the kernel at the end.
interleaved           K pairs of kernels (default 4), one after the other: one through the
                      gateway (as `gateway`), one of its own (as `direct`). N/K round trips on
                      each pair, alternating request by request, the first of each two taking
                      turns. So drift hits both alike, and K kernel processes on each side even
                      out what one kernel process differs from another.
relayed               as interleaved, with bench/relay.py (libzmq's zmq_proxy, a relay that does
                      nothing) between the client and its own kernel in place of the gateway:
                      the floor of any gateway process's round trip on this machine.

A round trip is one execute_request for `1+1`, from sending it until both its execute_reply and
the iopub `status: idle` that it caused have arrived. Once the kernel answers kernel_info, 20
untimed round trips come first, then N timed ones. The flood is one cell that writes MEGABYTES
x 1024 lines of 1023 `x` and a newline to stdout; its time runs from sending the cell until its
reply and idle status, and the stdout text that reached the client is counted. The prints cell
is `print(i, flush=True)` for i in range(COUNT): one stream message per print (without the
flush, ipykernel joins a loop's prints into a few messages, one per 0.2 s), timed and counted
the same way.

Every execute_request asks for store_history=False unless --store-history is given.
--no-utf8-check turns off websocket-client's pure-Python UTF-8 check of text frames, which
otherwise costs the client more than the gateway costs (see bench/README.md).
--whole-frames reads a frame's payload of WHOLE_FRAME bytes or more into one buffer, as a
browser or Beast does, where websocket-client reads it 16 KiB at a time and joins the pieces
(for a 20 MB frame: two copies of it in fresh memory and 1,280 reads in Python, more than the
gateway's own time on the path; bench/README.md, "The I/O thread's wakes, and a frame read
whole"). The result says which reader ran ("reader": "whole" or "stock"); an unknown
websocket-client keeps its own.

Prints one JSON line: interleaved and relayed {"mode", "n", "pairs", "warmup", "direct_median_us",
"direct_p90_us", "gateway_median_us", "gateway_p90_us", "ratio" (gateway median / direct median,
over all pairs' round trips), "pair_ratios"}, where relayed's gateway_* are the relay's; latency
modes {"mode", "n", "warmup", "median_us", "p10_us", "p90_us", "p99_us", "min_us", "max_us"}; flood
modes {"mode", "printed_bytes", "received_bytes", "seconds", "MB_per_s", "idle_lost"}; prints modes
{"mode", "count", "printed_bytes", "received_bytes", "received_messages", "seconds",
"messages_per_s", "idle_lost"}; through a gateway, both also have "reader". idle_lost: the
server lost the cell's idle (the wait for it ended IDLE_GRACE after the reply), and seconds end
at the cell's last message. A flood or prints cell
stopped by SIGTERM first prints what had arrived: {"mode", "incomplete": true, "received_bytes",
"received_messages", "replied", "idle", "seconds", ...}. Exit status 0, or 1 with the reason on
stderr.
"""
import argparse
import datetime
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid

WARMUP = 20
READY_TIMEOUT = 60.0     # kernel start until kernel_info is answered
MESSAGE_TIMEOUT = 60.0   # the longest wait for a round trip's reply and idle
CELL_TIMEOUT = 600.0     # the same for the flood and prints cells
IDLE_GRACE = 10.0        # how long the idle may trail the reply: a server that lost it (jupyter_server
                         # can drop iopub messages even with its rate limits off) ends the wait then
RELAY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "relay.py")
LINE = 1023              # characters of `x` on each flood line, plus its newline
WHOLE_FRAME = 64 * 1024  # --whole-frames: a payload this long or longer is read into one buffer


def flood_code(megabytes):
    return ("import sys\n"
            "_line = 'x' * %d + '\\n'\n"
            "for _ in range(%d):\n"
            "    sys.stdout.write(_line)\n"
            "sys.stdout.flush()\n" % (LINE, megabytes * 1024))


def prints_code(count):
    return "for _i in range(%d):\n    print(_i, flush=True)\n" % count


def prints_bytes(count):
    return sum(len(str(i)) + 1 for i in range(count))


def execute_content(code, store_history):
    return {"code": code, "silent": False, "store_history": store_history, "user_expressions": {},
            "allow_stdin": False, "stop_on_error": True}


class Round:
    """What one request is waiting for: its shell reply and its iopub idle; stdout text counted."""

    def __init__(self, msg_id, reply_type):
        self.msg_id, self.reply_type = msg_id, reply_type
        self.replied = self.idle = self.idle_lost = False
        self.replied_at = None
        self.last_seen = None  # perf_counter() at its last message: its end when the idle was lost
        self.stdout_chars = 0
        self.stdout_messages = 0

    def feed(self, msg_type, parent_id, content):
        if parent_id != self.msg_id:
            return
        self.last_seen = time.perf_counter()
        if msg_type == self.reply_type:
            self.replied = True
            self.replied_at = time.monotonic()
        elif msg_type == "status" and content.get("execution_state") == "idle":
            self.idle = True
        elif msg_type == "stream" and content.get("name") == "stdout":
            self.stdout_chars += len(content.get("text", ""))
            self.stdout_messages += 1

    @property
    def done(self):
        return self.replied and self.idle

    def wait(self, timeout, receive):
        """Feeds this round what `receive(self, left)` reads, waiting at most `left` seconds,
        until its reply and its idle have both come.  TimeoutError `timeout` seconds after the
        send; an idle still missing IDLE_GRACE after the reply ends the wait (idle_lost)."""
        deadline = time.monotonic() + timeout
        while not self.done:
            left = self.wait_bound(deadline)
            if self.idle_lost:
                break
            if left <= 0:
                raise TimeoutError("no %s (reply %s, idle %s) within %g s" % (self.reply_type, self.replied, self.idle,
                                                                               timeout))
            receive(self, left)
        return self

    def wait_bound(self, deadline):
        """Seconds left to wait: to the deadline, or to the end of the idle's grace after the
        reply (then idle_lost is set and 0 returned)."""
        now = time.monotonic()
        left = deadline - now
        if self.replied and not self.idle:
            grace = self.replied_at + IDLE_GRACE - now
            if grace <= 0:
                self.idle_lost = True
                return 0
            left = min(left, grace)
        return left


class DirectKernel:
    """A kernel of our own, reached over its ZMQ sockets with no gateway in between."""

    def __init__(self, store_history, connection_file=None):
        """connection_file: a running kernel's (another's, e.g. a gateway's): attached, not
        started, and left running at close()."""
        import zmq
        from jupyter_client.manager import KernelManager
        self.zmq, self.store_history = zmq, store_history
        self.attached = connection_file is not None
        if self.attached:
            self.km = KernelManager(connection_file=connection_file)
            self.km.load_connection_file()
        else:
            self.km = KernelManager(kernel_name="python3")
            self.km.start_kernel()
        self.session = self.km.session
        self.shell = self.km.connect_shell()
        self.iopub = self.km.connect_iopub()     # subscribed to every topic
        self.poller = zmq.Poller()
        self.poller.register(self.shell, zmq.POLLIN)
        self.poller.register(self.iopub, zmq.POLLIN)

    def request(self, msg_type, content, timeout=MESSAGE_TIMEOUT):
        sent = self.session.send(self.shell, msg_type, content)
        self.current = Round(sent["header"]["msg_id"], msg_type.replace("_request", "_reply"))
        return self.current.wait(timeout, self._receive)

    def _receive(self, r, left):
        for sock, _ in self.poller.poll(left * 1000):
            _, frames = self.session.feed_identities(sock.recv_multipart())
            m = self.session.deserialize(frames)
            r.feed(m["msg_type"], m["parent_header"].get("msg_id"), m["content"])

    def execute(self, code, timeout=MESSAGE_TIMEOUT):
        return self.request("execute_request", execute_content(code, self.store_history), timeout)

    def wait_ready(self):
        """kernel_info until its reply and idle both arrive: the kernel is up and the iopub SUB
        socket is connected (a SUB misses what is published before it joins)."""
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            try:
                self.request("kernel_info_request", {}, timeout=1.0)
                return
            except TimeoutError:
                if time.monotonic() > deadline or (not self.attached and not self.km.is_alive()):
                    raise TimeoutError("kernel did not answer kernel_info within %g s" % READY_TIMEOUT)

    def close(self):
        for sock in (self.shell, self.iopub):
            sock.close(linger=0)
        if not self.attached:
            self.km.shutdown_kernel(now=True)


class RelayedKernel:
    """A kernel of our own behind bench/relay.py: a direct client of the relay's ports."""

    def __init__(self):
        from jupyter_client.manager import KernelManager
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel()
        self.relay = self.client = None
        self.relayed = os.path.splitext(self.km.connection_file)[0] + "-relayed.json"
        try:
            relayed = self.relayed
            # the relay ends when its stdin closes: at close(), or when this process dies
            self.relay = subprocess.Popen([sys.executable, RELAY, self.km.connection_file, relayed],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            line = self.relay.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError("bench/relay.py did not start (exit %s)" % self.relay.wait())
            self.client = DirectKernel(False, connection_file=relayed)
        except BaseException:
            self.close()
            raise

    def wait_ready(self):
        self.client.wait_ready()

    def execute(self, code, timeout=MESSAGE_TIMEOUT):
        return self.client.execute(code, timeout)

    def close(self):
        if self.client:
            self.client.close()
        if self.relay:
            self.relay.stdin.close()
            self.relay.wait()
        if os.path.exists(self.relayed):
            os.remove(self.relayed)
        self.km.shutdown_kernel(now=True)


def whole_frame_buffer(ws):
    """websocket-client's frame reader for `ws`, with a frame's payload of WHOLE_FRAME bytes or
    more read straight into one buffer (socket.recv_into), or None when this websocket-client
    does not have the reader this relies on (1.2.3, Debian 12's, does)."""
    try:
        from websocket._abnf import frame_buffer
    except ImportError:
        return None
    old = getattr(ws, "frame_buffer", None)
    if not isinstance(old, frame_buffer) or not hasattr(old, "recv_buffer") or ws.sock is None:
        return None

    class WholeFrames(frame_buffer):
        def recv_strict(self, bufsize):
            have = sum(map(len, self.recv_buffer))
            if bufsize - have < WHOLE_FRAME:
                return super().recv_strict(bufsize)
            out = bytearray(bufsize)
            view = memoryview(out)
            pos = 0
            for piece in self.recv_buffer:   # what an earlier read left (none: reads are exact)
                view[pos:pos + len(piece)] = piece
                pos += len(piece)
            self.recv_buffer = []
            while pos < bufsize:
                try:
                    got = ws.sock.recv_into(view[pos:], bufsize - pos)
                except socket.timeout:
                    raise self.timeout_error("no data for %g s in a frame's payload" % ws.sock.gettimeout())
                if not got:
                    raise self.closed_error("the connection closed in a frame's payload")
                pos += got
            return out

    import websocket
    WholeFrames.timeout_error = websocket.WebSocketTimeoutException
    WholeFrames.closed_error = websocket.WebSocketConnectionClosedException
    return WholeFrames(old.recv, old.skip_utf8_validation)


class GatewayKernel:
    """A kernel started through a gateway's REST API and reached over its channels websocket."""

    def __init__(self, url, token, kernel_name, store_history, utf8_check=True, kernel_id=None,
                 whole_frames=False):
        """kernel_id: a kernel the gateway runs already: used, and left running at close().
        whole_frames: a long frame's payload is read into one buffer (whole_frame_buffer)."""
        import websocket
        self.websocket = websocket
        self.url, self.token, self.store_history = url.rstrip("/"), token, store_history
        self.session_id = uuid.uuid4().hex
        self.owned = kernel_id is None
        self.kernel_id = kernel_id or self.rest("POST", "/api/kernels", {"name": kernel_name})["id"]
        ws_url = "ws" + self.url[len("http"):] + "/api/kernels/%s/channels" % self.kernel_id
        try:
            self.ws = websocket.create_connection(
                ws_url, header=["Authorization: token " + token], timeout=MESSAGE_TIMEOUT,
                sockopt=((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),),
                skip_utf8_validation=not utf8_check)
        except Exception:
            self.rest("DELETE", "/api/kernels/" + self.kernel_id)
            raise
        self.reader = "stock"
        if whole_frames:
            reader = whole_frame_buffer(self.ws)
            if reader is not None:
                self.ws.frame_buffer = reader
                self.reader = "whole"

    def rest(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": "token " + self.token,
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=MESSAGE_TIMEOUT) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def request(self, msg_type, content, timeout=MESSAGE_TIMEOUT):
        msg_id = uuid.uuid4().hex
        self.ws.send(json.dumps({
            "channel": "shell",
            "header": {"msg_id": msg_id, "msg_type": msg_type, "session": self.session_id,
                       "username": "bench", "version": "5.3",
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat()},
            "parent_header": {}, "metadata": {}, "content": content}))
        self.current = Round(msg_id, msg_type.replace("_request", "_reply"))
        return self.current.wait(timeout, lambda r, left: self._receive(r, left, timeout < MESSAGE_TIMEOUT))

    def _receive(self, r, left, short):
        # A short wait (the readiness probe, an idle's grace) must not cut a frame in half, so
        # it waits for the socket first; otherwise recv blocks (its socket timeout is the bound).
        if (short or r.replied) and not select.select([self.ws.sock], [], [], left)[0]:
            return
        # A ping (jupyter_server sends one every 30 s; the library answers it) comes back to
        # the wait: ws.recv() would go on waiting for a data frame, past the idle's grace.
        opcode, data = self.ws.recv_data(control_frame=True)
        if opcode == self.websocket.ABNF.OPCODE_CLOSE:
            raise ConnectionError("the server closed the websocket while %s waited" % r.reply_type)
        if opcode in (self.websocket.ABNF.OPCODE_TEXT, self.websocket.ABNF.OPCODE_BINARY):
            m = json.loads(data)
            r.feed(m.get("msg_type"), (m.get("parent_header") or {}).get("msg_id"), m.get("content") or {})

    def execute(self, code, timeout=MESSAGE_TIMEOUT):
        return self.request("execute_request", execute_content(code, self.store_history), timeout)

    def wait_ready(self):
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            try:
                self.request("kernel_info_request", {}, timeout=2.0)
                return
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise TimeoutError("kernel %s did not answer kernel_info within %g s"
                                       % (self.kernel_id, READY_TIMEOUT))

    def close(self):
        try:
            self.ws.close()
        finally:
            if self.owned:
                self.rest("DELETE", "/api/kernels/" + self.kernel_id)


def nearest_rank(ordered, q):
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure_latency(kernel, n, mode):
    for _ in range(WARMUP):
        kernel.execute("1+1")
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        kernel.execute("1+1")
        times.append(time.perf_counter() - t0)
    us = sorted(t * 1e6 for t in times)
    return {"mode": mode, "n": n, "warmup": WARMUP, "median_us": round(statistics.median(us)),
            "p10_us": round(nearest_rank(us, 0.10)), "p90_us": round(nearest_rank(us, 0.90)),
            "p99_us": round(nearest_rank(us, 0.99)), "min_us": round(us[0]), "max_us": round(us[-1])}


def measure_interleaved(open_gateway, n, pairs):
    """n round trips on each side, over `pairs` fresh pairs of kernels (gateway, direct), the two
    sides alternating request by request. Each pair's kernels are closed before the next starts."""
    times = {"gateway": [], "direct": []}
    ratios = []
    per_pair = [n // pairs + (1 if i < n % pairs else 0) for i in range(pairs)]
    for count in per_pair:
        gateway = open_gateway()
        try:
            direct = DirectKernel(False)
            try:
                gateway.wait_ready()
                direct.wait_ready()
                for _ in range(WARMUP):
                    gateway.execute("1+1")
                    direct.execute("1+1")
                these = {"gateway": [], "direct": []}
                for i in range(count):
                    for name, kernel in ((("direct", direct), ("gateway", gateway)) if i % 2 == 0
                                         else (("gateway", gateway), ("direct", direct))):
                        t0 = time.perf_counter()
                        kernel.execute("1+1")
                        these[name].append((time.perf_counter() - t0) * 1e6)
            finally:
                direct.close()
        finally:
            gateway.close()
        if count:
            ratios.append(round(statistics.median(these["gateway"]) / statistics.median(these["direct"]), 3))
        for name in times:
            times[name] += these[name]
    out = {"mode": "interleaved", "n": n, "pairs": pairs, "warmup": WARMUP}
    for name in ("direct", "gateway"):
        us = sorted(times[name])
        out[name + "_median_us"] = round(statistics.median(us))
        out[name + "_p90_us"] = round(nearest_rank(us, 0.90))
    out["ratio"] = round(statistics.median(times["gateway"]) / statistics.median(times["direct"]), 3)
    out["pair_ratios"] = ratios
    return out


def cell_seconds(r, t0):
    """From t0 to the cell's idle; to its last message when the server lost the idle, so the
    idle's grace is not counted as the server's time."""
    end = r.last_seen if r.idle_lost and r.last_seen is not None else time.perf_counter()
    return end - t0


def measure_flood(kernel, megabytes, mode):
    code = flood_code(megabytes)
    t0 = time.perf_counter()
    r = run_cell(kernel, code, mode, t0, printed_bytes=megabytes * 1024 * (LINE + 1))
    seconds = cell_seconds(r, t0)
    return {"mode": mode, "printed_bytes": megabytes * 1024 * (LINE + 1), "received_bytes": r.stdout_chars,
            "seconds": round(seconds, 3), "MB_per_s": round(r.stdout_chars / seconds / 1e6, 1),
            "idle_lost": r.idle_lost}


class Stopped(Exception):
    """SIGTERM (the harness's timeout): the cell in progress reports what it got so far."""


def on_sigterm(signum, frame):
    raise Stopped("stopped by signal %d" % signum)


def run_cell(kernel, code, mode, t0, **what):
    """kernel.execute(code) for the flood and prints modes. Stopped (SIGTERM) first prints a
    line {"mode", "incomplete": true, what..., "received_bytes", "received_messages",
    "replied", "idle", "seconds"}: how far the cell had come, for the harness's error."""
    try:
        return kernel.execute(code, CELL_TIMEOUT)
    except Stopped:
        r = getattr(kernel, "current", None)
        print(json.dumps({"mode": mode, "incomplete": True, **what,
                          "received_bytes": r.stdout_chars if r else 0,
                          "received_messages": r.stdout_messages if r else 0,
                          "replied": bool(r and r.replied), "idle": bool(r and r.idle),
                          "seconds": round(time.perf_counter() - t0, 3)}), flush=True)
        raise


def measure_prints(kernel, count, mode):
    t0 = time.perf_counter()
    r = run_cell(kernel, prints_code(count), mode, t0, count=count, printed_bytes=prints_bytes(count))
    seconds = cell_seconds(r, t0)
    return {"mode": mode, "count": count, "printed_bytes": prints_bytes(count), "received_bytes": r.stdout_chars,
            "received_messages": r.stdout_messages, "seconds": round(seconds, 3), "messages_per_s": round(count / seconds), "idle_lost": r.idle_lost}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="wsclient.py", description="kgate benchmark clients")
    sub = p.add_subparsers(dest="mode", required=True)
    d = sub.add_parser("direct", help="N round trips over raw ZMQ")
    d.add_argument("n", type=int)
    d.add_argument("--store-history", action="store_true")
    d = sub.add_parser("direct-flood", help="the flood over raw ZMQ")
    d.add_argument("megabytes", type=int)
    d = sub.add_parser("direct-prints", help="COUNT small prints over raw ZMQ")
    d.add_argument("count", type=int)
    d = sub.add_parser("relayed", help="N round trips through a relay that does nothing, interleaved with direct ones")
    d.add_argument("n", type=int)
    d.add_argument("--pairs", type=int, default=4, help="pairs of kernels (default 4)")
    for name, what in (("gateway", "n"), ("flood", "megabytes"), ("prints", "count"), ("interleaved", "n")):
        g = sub.add_parser(name, help="through a gateway's websocket")
        g.add_argument("url")
        g.add_argument("token")
        g.add_argument(what, type=int)
        g.add_argument("--kernel", default="python3")
        if name == "gateway":
            g.add_argument("--store-history", action="store_true")
        elif name == "interleaved":
            g.add_argument("--pairs", type=int, default=4, help="pairs of kernels (default 4)")
        else:
            g.add_argument("--no-utf8-check", action="store_true")
            g.add_argument("--whole-frames", action="store_true",
                           help="read a long frame's payload into one buffer (websocket-client: 16 KiB at a time)")
    return p.parse_args(argv)


def main(argv):
    a = parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    if a.mode in ("interleaved", "relayed"):
        if a.n < 1 or not 1 <= a.pairs <= a.n:
            raise ValueError("%s needs N >= 1 and 1 <= --pairs <= N" % a.mode)
        if a.mode == "relayed":
            result = dict(measure_interleaved(RelayedKernel, a.n, a.pairs), mode="relayed")
        else:
            result = measure_interleaved(lambda: GatewayKernel(a.url, a.token, a.kernel, False), a.n, a.pairs)
        print(json.dumps(result), flush=True)
        return 0
    if a.mode in ("direct", "direct-flood", "direct-prints"):
        kernel = DirectKernel(getattr(a, "store_history", False))
    else:
        kernel = GatewayKernel(a.url, a.token, a.kernel, getattr(a, "store_history", False),
                               utf8_check=not getattr(a, "no_utf8_check", False),
                               whole_frames=getattr(a, "whole_frames", False))
    try:
        kernel.wait_ready()
        if a.mode in ("direct", "gateway"):
            result = measure_latency(kernel, a.n, a.mode)
        elif a.mode in ("direct-prints", "prints"):
            result = measure_prints(kernel, a.count, a.mode)
        else:
            result = measure_flood(kernel, a.megabytes, a.mode)
        if isinstance(kernel, GatewayKernel) and a.mode in ("flood", "prints"):
            result["reader"] = kernel.reader
    finally:
        kernel.close()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception as e:   # the harness shows stderr's tail; one line with the cause is enough
        print("wsclient: %s: %s" % (type(e).__name__, e), file=sys.stderr)
        sys.exit(1)
