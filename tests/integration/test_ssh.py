"""Kernels on an SSH launcher (issue 19), against an sshd on loopback this module starts itself
(engines.Sshd: Debian's openssh-server, a generated host key and user key, as root)."""

import os
import signal
import time

import pytest

from conftest import Kgate, assert_interrupts_a_sleep, wait_until
from engines import Sshd
from wrapped_kernels import HB_TAKEN, add_wrapped_spec, launches, stop_blocker, taken_hb_port


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    d = Sshd(tmp_path_factory.mktemp("sshd")).start()
    yield d
    d.stop()


def ssh_launcher(name, sshd, conn_dir, forward, known_hosts=None):
    known = known_hosts or sshd.known_hosts
    return f"""
[launchers.{name}]
kind = "ssh"
host = "127.0.0.1"
port = {sshd.port}
identity_file = "{sshd.user_key}"
ssh_options = ["UserKnownHostsFile={known}", "StrictHostKeyChecking=yes"]
forward = {"true" if forward else "false"}
connection_dir = "{conn_dir}"
"""


@pytest.fixture(scope="module")
def kg(kgate_bin, sshd, tmp_path_factory):
    root = tmp_path_factory.mktemp("kgate")
    empty_known = root / "empty_known_hosts"
    empty_known.write_text("")
    conn_dir = root / "node-runtime"
    (root / "kgate.toml").write_text("""
[pool]
size = 0

[remote]
link_timeout_seconds = 60
""" + ssh_launcher("box", sshd, conn_dir, forward=True)
        + ssh_launcher("direct", sshd, conn_dir, forward=False)
        + ssh_launcher("stranger", sshd, conn_dir, forward=True, known_hosts=empty_known))
    d = Kgate(kgate_bin, root, config=root / "kgate.toml").start()
    yield d
    d.stop(sig=signal.SIGINT)


def node_logs(kg):
    """The node launchers' logs (kgate-node-<id>.log in the launchers' connection_dir), last lines."""
    out = []
    for log in sorted((kg.root / "node-runtime").glob("kgate-node-*.log")):
        out.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:]))
    return "\n".join(out)


def ssh_kernel(kg, launcher, name="python3"):
    status, _, model = kg.rest("POST", "/api/kernels", {"name": name, "kgate_launcher": launcher}, timeout=90)
    assert status == 201, f"{status} {model!r}\n{kg.log_tail()}\n{node_logs(kg)}"
    kg._kernels.add(model["id"])
    return model


def tunnels_of(kg):
    """The `ssh -N` forwarding processes kgate runs."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if ppid == kg.proc.pid and argv and argv[0].endswith(b"ssh") and b"-N" in argv:
            out.append(int(d))
    return out


def test_launchers_say_whether_the_host_answers(kg):
    status, _, body = kg.rest("GET", "/api/kgate/launchers")
    assert status == 200, body
    by_name = {l["name"]: l for l in body["launchers"]}
    assert by_name["box"]["usable"] is True, by_name["box"]
    assert by_name["direct"]["usable"] is True, by_name["direct"]
    assert by_name["stranger"]["usable"] is False
    assert "Host key verification failed" in by_name["stranger"]["reason"], by_name["stranger"]


def test_an_unknown_host_key_is_refused(kg):
    status, _, body = kg.rest("POST", "/api/kernels", {"name": "python3", "kgate_launcher": "stranger"}, timeout=90)
    assert status == 500, body
    assert "Host key verification failed" in body["message"], body


@pytest.mark.parametrize("launcher", ["box", "direct"])
def test_an_ssh_kernel_executes_and_is_interrupted(kg, launcher):
    model = ssh_kernel(kg, launcher)
    kid = model["id"]
    place = model["kgate_placement"]
    assert place["kind"] == "ssh" and place["host"] and place["launcher"] == launcher, place
    with kg.connect(kid) as ws:
        r = ws.execute("import os; print(os.getpid())")
        assert r.status == "ok", r
        assert_interrupts_a_sleep(kg, kid, ws)
    # kgate's kernel side reaches a launcher's kernel too (docs/dev/kernel-side.md).
    side = kg.rest("GET", f"/api/kgate/kernels/{kid}")[2].get("kgate_kernel_side") or {}
    assert side.get("installed") is True and all(v is True for v in side["features"].values()), side
    if launcher == "box":  # forwarded: kgate's connection file names its local ends
        conn = kg.connection_file(kid).read_text()
        assert '"ip": "127.0.0.1"' in conn or '"ip":"127.0.0.1"' in conn, conn
    kg.delete_kernel(kid)


def test_a_port_taken_on_the_node_relaunches_there_on_fresh_ports(kg, tmp_path):
    """ipykernel runs on without its heartbeat when that port was taken: a probe of the five ports
    would register it, never ready (seen in CI). The node launcher sees whose listeners they are."""
    state = add_wrapped_spec(kg, "hbtaken", HB_TAKEN, tmp_path / "hbtaken")
    try:
        began = time.monotonic()
        model = ssh_kernel(kg, "direct", name="hbtaken")
        kid = model["id"]
        assert time.monotonic() - began < 30, "waited for readiness rather than relaunching"
        assert launches(state) == 2, f"{launches(state)} launches on the node, not 2\n{node_logs(kg)}"
        assert f"port {taken_hb_port(state)} was taken by another process before the kernel bound it; " \
            "again on fresh ports" in node_logs(kg), node_logs(kg)
        with kg.connect(kid) as ws:
            assert ws.run("print(6*7)").strip() == "42"
        assert wait_until(lambda: kg.kernel_model(kid)["responsive"] is True, 5), kg.kernel_model(kid)
        kg.delete_kernel(kid)
    finally:
        stop_blocker(state)


def test_a_dropped_ssh_connection_is_reconnected(kg):
    model = ssh_kernel(kg, "box")
    kid = model["id"]
    with kg.connect(kid) as ws:
        assert ws.execute("x = 41").status == "ok"
        before = tunnels_of(kg)
        assert len(before) == 1, before
        os.kill(before[0], signal.SIGKILL)  # the SSH connection drops
        assert wait_until(lambda: "unreachable (" in kg.log_tail(200), 10), kg.log_tail()
        # A cell sent meanwhile waits for the link, then runs, on the same websocket.
        r = ws.execute("print(x + 1)", timeout=60)
        assert r.status == "ok" and r.stdout.strip() == "42", r
        assert "reachable again" in kg.log_tail(200), kg.log_tail()
        after = tunnels_of(kg)
        assert len(after) == 1 and after != before, (before, after)
        m = kg.kernel_model(kid)
        assert m["execution_state"] == "idle" and "link" not in m["kgate_placement"], m
        assert m["responsive"] is True, m
    kg.delete_kernel(kid)
    assert wait_until(lambda: not tunnels_of(kg), 10)


def test_a_restarted_kgate_readopts_an_ssh_kernel_behind_forwarding(kgate_bin, sshd, tmp_path):
    (tmp_path / "kgate.toml").write_text("[pool]\nsize = 0\n" +
                                         ssh_launcher("box", sshd, tmp_path / "node-runtime", forward=True))
    kg1 = Kgate(kgate_bin, tmp_path, config=tmp_path / "kgate.toml").start()
    try:
        kid = ssh_kernel(kg1, "box")["id"]
        with kg1.connect(kid) as ws:
            assert ws.execute("x = 41").status == "ok"
        os.kill(kg1.proc.pid, signal.SIGKILL)
        kg1.proc.wait(10)
    except BaseException:
        kg1.stop(sig=signal.SIGINT)
        raise
    kg2 = Kgate(kgate_bin, tmp_path, config=tmp_path / "kgate.toml").start()
    try:
        assert "re-adopting it from an earlier kgate" in kg2.log_tail(200), kg2.log_tail()
        assert wait_until(lambda: kg2.kernel_model(kid)["execution_state"] == "idle", 30), kg2.log_tail()
        assert len(tunnels_of(kg2)) == 1
        with kg2.connect(kid) as ws:
            r = ws.execute("print(x + 1)")
            assert r.status == "ok" and r.stdout.strip() == "42", r
        kg2.delete_kernel(kid)
    finally:
        kg2.stop(sig=signal.SIGINT)


def test_squatters_on_the_control_link_cannot_lock_kgate_out(kgate_bin, sshd, tmp_path):
    """Connections that never finish the handshake used to fill the launcher's 8 slots, and every
    newer one was closed at once: a squatter holding 8 open kept kgate out until link_timeout.
    Now the oldest unfinished peer makes room: the next kgate re-adopts the kernel through 20
    idle connections, and the control link still refuses whoever does not hold the key."""
    import json
    import socket
    (tmp_path / "kgate.toml").write_text("[pool]\nsize = 0\n" +
                                         ssh_launcher("direct", sshd, tmp_path / "node-runtime", forward=False))
    kg1 = Kgate(kgate_bin, tmp_path, config=tmp_path / "kgate.toml").start()
    squat = []
    try:
        kid = ssh_kernel(kg1, "direct")["id"]
        with kg1.connect(kid) as ws:
            assert ws.execute("x = 41").status == "ok"
        entry = json.loads((kg1.own_token_file.parent / "kernels" / f"{kid}.json").read_text())
        port = entry["remote"]["control_link_port"]
        os.kill(kg1.proc.pid, signal.SIGKILL)
        kg1.proc.wait(10)
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            squat.append(s)
        # Each is challenged (the v2 handshake), and one that answers wrongly is refused.
        assert squat[-1].recv(200).startswith(b"challenge2 ")
        liar = socket.create_connection(("127.0.0.1", port), timeout=5)
        assert liar.recv(200).startswith(b"challenge2 ")
        liar.sendall(b"prove " + b"ab" * 16 + b"\n")
        assert liar.recv(200).startswith(b"proof ")
        liar.sendall(b"auth " + b"00" * 32 + b"\n")
        assert liar.recv(200) == b"", "a wrong answer got more than a close"
        liar.close()
    except BaseException:
        kg1.stop(sig=signal.SIGINT)
        raise
    kg2 = Kgate(kgate_bin, tmp_path, config=tmp_path / "kgate.toml").start()
    try:
        assert "re-adopting it from an earlier kgate" in kg2.log_tail(200), kg2.log_tail()
        assert wait_until(lambda: kg2.kernel_model(kid)["execution_state"] == "idle", 30), kg2.log_tail()
        with kg2.connect(kid) as ws:
            r = ws.execute("print(x + 1)")
            assert r.status == "ok" and r.stdout.strip() == "42", r
        kg2.delete_kernel(kid)
    finally:
        for s in squat:
            s.close()
        kg2.stop(sig=signal.SIGINT)
