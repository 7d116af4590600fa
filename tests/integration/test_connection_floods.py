"""Bounded connections (issue 59): another local user who floods kgate's port with connections,
slow headers or big bodies holds little and for a short time, and the owner is served all along.

- the token before the body: an unauthenticated request gets its 401 for the header alone, and
  `Expect: 100-continue` gets "100 Continue" only once the header passed;
- at most `max_unauthenticated_connections` connections that have not passed the token check,
  the oldest closed first, and 10 s for each request's header;
- out of descriptors, accept closes the oldest unauthenticated connection and logs once a second.

The floods run as `nobody` with setpriv; they need root (CI has it)."""

import json
import re
import socket
import subprocess
import time

from conftest import Kgate
from test_shared_machine import setpriv_nobody

# Run as nobody: opens N connections to 127.0.0.1:PORT (raising its own descriptor limit first),
# each sending MODE's bytes: "idle" nothing, "slow" half a header, "body" a POST header with a
# 16 MB Content-Length and then as much body as the socket takes in a second; holds them SECONDS
# and prints how many connected, and the status lines it was answered with.
FLOOD = r"""
import collections, json, resource, selectors, socket, sys, time
port, n, mode, seconds = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held, failed = [], 0
for i in range(n):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        failed += 1
        continue
    if mode == "slow":
        s.sendall(b"GET /api HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    elif mode == "body":
        s.sendall(b"POST /api/kernels HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 16777000\r\n\r\n" % port)
        s.setblocking(False)
        chunk = b"x" * 65536
        end = time.monotonic() + 0.05
        while time.monotonic() < end:
            try:
                s.send(chunk)
            except (BlockingIOError, OSError):
                time.sleep(0.005)
    held.append(s)
time.sleep(seconds)
statuses = collections.Counter()
sel = selectors.DefaultSelector()
for s in held:
    sel.register(s, selectors.EVENT_READ)
ready = {key.fileobj for key, _ in sel.select(timeout=0.5)}
for s in held:
    if s not in ready:
        statuses["open"] += 1
        continue
    s.setblocking(False)
    try:
        data = s.recv(4096)
        statuses[data.split(b"\r\n")[0].decode() if data else "closed"] += 1
    except OSError as e:
        statuses["reset" if e.errno == 104 else str(e.errno)] += 1
print(json.dumps({"connected": len(held), "failed": failed, "statuses": statuses}))
"""


def flood(kg, n, mode, seconds):
    """Starts the flood as nobody; returns the process (its stdout is FLOOD's JSON)."""
    return subprocess.Popen(setpriv_nobody() + ["/usr/bin/python3", "-c", FLOOD, str(kg.port), str(n), mode,
                                                str(seconds)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")


def finish(p, timeout=120):
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err.decode(errors="replace")
    return json.loads(out)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1))


def open_fds(pid):
    import os
    return len(os.listdir(f"/proc/{pid}/fd"))


def timed_get(kg, path="/api"):
    t0 = time.monotonic()
    status, _, _ = kg.rest("GET", path, timeout=10)
    return status, time.monotonic() - t0


def log_bytes(kg):
    return sum(len(line) + 1 for line in kg.log_lines)


def test_unauthenticated_bodies_are_not_read(kgate):
    setpriv_nobody()
    pid = kgate.proc.pid
    before = rss_kib(pid)
    p = flood(kgate, 40, "body", 3)
    got = finish(p)
    after = rss_kib(pid)
    assert got["connected"] == 40, got
    # Each was answered 401 for its header (or, past the drain, closed): none was read whole.
    assert got["statuses"].get("HTTP/1.1 401 Unauthorized", 0) + got["statuses"].get("closed", 0) \
        + got["statuses"].get("reset", 0) == 40, got
    assert got["statuses"].get("HTTP/1.1 401 Unauthorized", 0) >= 1, got
    assert after - before < 20 * 1024, (before, after)


def test_expect_100_continue_comes_after_the_token_check(kgate):
    body = b'{"name": "python3"}'

    def ask(token):
        s = socket.create_connection(("127.0.0.1", kgate.port), timeout=10)
        auth = b"Authorization: token %s\r\n" % token.encode() if token else b""
        s.sendall(b"POST /api/sessions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n%sContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % (kgate.port, auth, len(body)))
        first = s.recv(4096)
        return s, first

    s, first = ask(None)
    assert first.startswith(b"HTTP/1.1 401"), first  # no 100: the body is never asked for
    assert b"Connection: close" in first or b"connection: close" in first.lower(), first
    s.close()
    s, first = ask(kgate.token)
    assert first == b"HTTP/1.1 100 Continue\r\n\r\n", first
    s.sendall(body)
    rest = s.recv(65536)
    assert rest.startswith(b"HTTP/1.1 400"), rest  # the body was read and judged: no "path"
    s.close()


def test_the_owner_is_served_while_another_user_holds_5000_connections(kgate):
    setpriv_nobody()
    pid = kgate.proc.pid
    log_before = log_bytes(kgate)
    p = flood(kgate, 5000, "idle", 6)
    try:
        time.sleep(2)
        worst = 0
        for _ in range(20):
            status, took = timed_get(kgate)
            assert status == 200
            worst = max(worst, took)
            time.sleep(0.1)
        assert worst < 0.1, worst
        assert open_fds(pid) < 600, open_fds(pid)  # 128 unauthenticated, the rest closed
    finally:
        got = finish(p)
    assert got["connected"] + got["failed"] == 5000, got
    assert got["statuses"].get("open", 0) <= 128, got
    assert log_bytes(kgate) - log_before < 1 << 20


def test_a_slow_header_is_cut_after_10_seconds(kgate):
    setpriv_nobody()
    t0 = time.monotonic()
    got = finish(flood(kgate, 3, "slow", 11.5))
    assert got["statuses"].get("open", 0) == 0 and got["connected"] == 3, got
    assert time.monotonic() - t0 < 30


def test_out_of_descriptors_accept_closes_the_oldest_stranger_and_logs_little(kgate_bin, tmp_path):
    setpriv_nobody()
    (tmp_path / "kgate.toml").write_text("[pool]\nsize = 0\n\n[limits]\nmax_unauthenticated_connections = 1000\n")
    kg = Kgate(kgate_bin, tmp_path, config=tmp_path / "kgate.toml")
    kg.args[:0] = ["prlimit", "--nofile=200:200", "--"]
    kg.start()
    try:
        p = flood(kg, 1000, "idle", 4)
        time.sleep(2)
        status, took = timed_get(kg)
        assert status == 200, status
        finish(p)
        lines = [line for line in kg.log_lines if "accept:" in line]
        assert lines, kg.log_tail()
        assert len(lines) <= 8, lines  # once a second at most
        assert any("closed the oldest unauthenticated connection" in line for line in lines), lines
        assert timed_get(kg)[0] == 200
    finally:
        kg.stop()
