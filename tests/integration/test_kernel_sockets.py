"""Local kernels on ipc (issue 59): Unix sockets in the 0700 runtime dir, no TCP port, attach by
connection file as before, and another local user reads nothing of a kernel's output, while a
kernelspec given tcp (`[kernel] tcp_kernelspecs`) is as open as it always was: the control that
shows the probe would see a secret if one could be seen.

The other-uid test runs its probe as `nobody` with setpriv; it needs root (CI has it)."""

import json
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

from jupyter_client import BlockingKernelClient

from conftest import wait_until
from test_shared_machine import setpriv_nobody

PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")


def tcp_listen_ports(pid):
    """The TCP ports process `pid` listens on (its socket inodes against /proc/net/tcp{,6})."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def socket_paths(info):
    return [Path(f"{info['ip']}-{info[key]}") for key in PORTS]


def test_a_local_kernel_is_on_ipc_and_attaches_by_its_connection_file(kgate, kernel):
    info = json.loads(kgate.connection_file(kernel).read_text())
    assert info["transport"] == "ipc", info
    assert Path(info["ip"]).parent == kgate.runtime_dir.resolve(), info
    assert stat.S_IMODE(os.stat(kgate.runtime_dir).st_mode) & 0o777 == 0o700
    paths = socket_paths(info)
    assert len(set(paths)) == 5, info
    for p in paths:
        assert stat.S_ISSOCK(os.lstat(p).st_mode), p
    # ipykernel's own IOPub pipe (for forked subprocesses' output) is moved off TCP by the
    # kernel side, once it is installed.
    pid = kgate.kernel_pid(kernel)
    assert wait_until(lambda: tcp_listen_ports(pid) == set(), 15), tcp_listen_ports(pid)
    assert stat.S_ISSOCK(os.lstat(info["ip"] + "-pipe").st_mode)

    client = BlockingKernelClient()
    client.load_connection_file(str(kgate.connection_file(kernel)))
    client.start_channels()
    try:
        client.wait_for_ready(timeout=30)
        out = []
        reply = client.execute_interactive("print(6 * 7)", timeout=30, output_hook=out.append)
        assert reply["content"]["status"] == "ok", reply["content"]
        assert "".join(m["content"].get("text", "") for m in out) == "42\n", out
    finally:
        client.stop_channels()

    # What a forked child prints still comes through the pipe, now on ipc.
    with kgate.connect(kernel) as ws:
        out = ws.run("import os, sys\npid = os.fork()\nif pid == 0:\n    print('from the child', flush=True)\n"
                     "    os._exit(0)\nos.waitpid(pid, 0)\nimport time; time.sleep(0.5)")
        assert "from the child" in out, out

    # A restart keeps the connection file (as with tcp's ports); the new process binds the same
    # paths, and they go with the kernel.
    status, _, _ = kgate.rest("POST", f"/api/kernels/{kernel}/restart")
    assert status == 200
    assert json.loads(kgate.connection_file(kernel).read_text()) == info
    with kgate.connect(kernel) as ws:
        assert ws.run("print(1 + 1)").strip() == "2"
    for p in paths:
        assert stat.S_ISSOCK(os.lstat(p).st_mode), p
    kgate.delete_kernel(kernel)
    assert not any(p.exists() for p in paths)


# Run as nobody: SUB to every TCP port that listens on loopback and to every path given (ipc),
# for `seconds`; prints what it could do and whether the secret came by.
NOBODY_SUB = r"""
import json, sys, time, zmq
secret, seconds, paths = sys.argv[1].encode(), float(sys.argv[2]), sys.argv[3:]
ports = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).readlines()[1:]:
        f = line.split()
        if f[3] == "0A":
            ports.add(int(f[1].rsplit(":", 1)[1], 16))
ctx = zmq.Context()
subs = []
for url in ["tcp://127.0.0.1:%d" % p for p in sorted(ports)] + ["ipc://" + p for p in paths]:
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.setsockopt(zmq.LINGER, 0)
    s.connect(url)
    subs.append(s)
poller = zmq.Poller()
for s in subs:
    poller.register(s, zmq.POLLIN)
got, seen = 0, False
end = time.monotonic() + seconds
while time.monotonic() < end:
    for s, _ in poller.poll(100):
        while True:
            try:
                parts = s.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            got += 1
            seen = seen or any(secret in p for p in parts)
listable = True
try:
    import os
    os.listdir(sys.argv[3].rsplit("/", 1)[0]) if paths else None
except OSError:
    listable = False
print(json.dumps({"ports": len(ports), "messages": got, "seen": seen, "runtime_listable": listable}))
"""


def nobody_reads(kg, kid, secret, paths):
    """Starts the nobody probe, prints the secret in kernel `kid` while it listens, returns what
    the probe saw."""
    probe = subprocess.Popen(setpriv_nobody() + ["/usr/bin/python3", "-c", NOBODY_SUB, secret, "6"] + paths,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")
    try:
        time.sleep(2)  # its SUBs connected and subscribed
        with kg.connect(kid) as ws:
            for _ in range(3):
                ws.run(f"print({secret!r})")
                time.sleep(0.5)
        out, err = probe.communicate(timeout=30)
    finally:
        probe.kill()
    assert probe.returncode == 0, err.decode(errors="replace")
    return json.loads(out)


def test_another_user_reads_no_output_of_an_ipc_kernel_but_does_of_a_tcp_one(kgate_factory, tmp_path):
    setpriv_nobody()  # skips without root
    config = tmp_path / "kgate.toml"
    config.write_text('[kernel]\ntcp_kernelspecs = ["tcpspec"]\n\n[pool]\nsize = 0\n')
    kg = kgate_factory(config=config)
    assert any("tcp_kernelspecs: kernels of tcpspec listen on 127.0.0.1 ports" in line for line in kg.log_lines)
    shutil.copytree(kg.spec_dir, kg.spec_dir.parent / "tcpspec")
    ipc_kernel = kg.start_kernel()["id"]
    tcp_kernel = kg.start_kernel({"name": "tcpspec"})["id"]
    ipc_info = json.loads(kg.connection_file(ipc_kernel).read_text())
    tcp_info = json.loads(kg.connection_file(tcp_kernel).read_text())
    assert (ipc_info["transport"], tcp_info["transport"]) == ("ipc", "tcp")
    # The owner's kernel on ipc: every path named to the probe, none reachable.
    got = nobody_reads(kg, ipc_kernel, "KGATE-IPC-SECRET-59", [str(p) for p in socket_paths(ipc_info)])
    assert got["seen"] is False and got["messages"] == 0, got
    assert got["runtime_listable"] is False, got
    # The control: on tcp, the same probe reads the cell's output.
    got = nobody_reads(kg, tcp_kernel, "KGATE-TCP-SECRET-59", [])
    assert got["seen"] is True, got
    for kid in (ipc_kernel, tcp_kernel):
        kg.delete_kernel(kid)


def test_a_runtime_dir_too_long_for_ipc_fails_the_start_saying_so(kgate_factory, tmp_path):
    config = tmp_path / "kgate.toml"
    config.write_text("[pool]\nsize = 0\n")
    kg = kgate_factory(config=config, extra_args=["--runtime-dir", str(tmp_path / ("r" * 100))])
    status, _, body = kg.rest("POST", "/api/kernels", {})
    assert status == 500, (status, body)
    assert "past the 107 a Unix socket allows" in body["message"] and "transport" in body["message"], body
