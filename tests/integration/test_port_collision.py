"""A kernel that dies at start (as ipykernel does when a port was taken in the bind/close
window) is relaunched on fresh ports, at first start and at restart; so is one whose heartbeat
port was taken, and one wedged in its start (once, then the start fails saying what was missing).
The kernels are on ipc (fresh socket names) but for the two whose test holds TCP ports: those are
given tcp by `[kernel] tcp_kernelspecs`."""
import json
import re
import time

import pytest

from conftest import Kgate, _module_daemon
from wrapped_kernels import COUNT, HB_TAKEN, add_wrapped_spec, launches, stop_blocker, taken_hb_port

# The wrapper runs ipykernel, except on the launches listed in FAIL_ON (1-based), where it
# saves the connection file it was given and exits 1, like a kernel whose port was taken.
WRAPPER = COUNT + r'''
case " $FAIL_ON " in *" $n "*) cp "$1" "$STATE/failed-$n.json"; exit 1;; esac
exec /usr/bin/python3 -m ipykernel_launcher -f "$1"
'''

PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")


@pytest.fixture(scope="module")
def kgate(kgate_bin, tmp_path_factory):
    """The module's daemon: kernels on ipc, but "hbtaken" on tcp (its test holds a TCP port)."""
    config = tmp_path_factory.mktemp("config") / "kgate.toml"
    config.write_text('[kernel]\ntcp_kernelspecs = ["hbtaken"]\n')
    yield from _module_daemon(kgate_bin, tmp_path_factory, config=config)


def add_spec(kg, name, fail_on, tmp_path):
    return add_wrapped_spec(kg, name, WRAPPER, tmp_path / name, {"FAIL_ON": " ".join(map(str, fail_on))})


def ports(path):
    info = json.loads(path.read_text())
    return {p: info[p] for p in PORTS}


def test_early_exit_at_start_relaunches_on_fresh_ports(kgate, tmp_path):
    state = add_spec(kgate, "flakystart", [1], tmp_path)
    status, _, model = kgate.rest("POST", "/api/kernels", {"name": "flakystart"})
    assert status == 201, (status, model, kgate.log_tail())
    kid = model["id"]
    kgate._kernels.add(kid)
    assert model["execution_state"] == "idle"
    assert launches(state) == 2
    first, final = ports(state / "failed-1.json"), ports(kgate.connection_file(kid))
    assert not set(first.values()) & set(final.values()), (first, final)
    assert json.loads(kgate.connection_file(kid).read_text())["transport"] == "ipc"
    with kgate.connect(kid) as ws:
        assert ws.run("print(1+1)").strip() == "2"
    assert any("relaunching on fresh ports" in line for line in kgate.log_lines)
    kgate.delete_kernel(kid)


def test_early_exit_at_restart_falls_back_to_fresh_ports(kgate, tmp_path):
    state = add_spec(kgate, "flakyrestart", [2], tmp_path)
    status, _, model = kgate.rest("POST", "/api/kernels", {"name": "flakyrestart"})
    assert status == 201, (status, model, kgate.log_tail())
    kid = model["id"]
    kgate._kernels.add(kid)
    before = ports(kgate.connection_file(kid))
    status, _, model = kgate.rest("POST", f"/api/kernels/{kid}/restart")
    assert status == 200, (status, model, kgate.log_tail())
    assert launches(state) == 3
    assert ports(state / "failed-2.json") == before  # the restart tried the same ports first
    after = ports(kgate.connection_file(kid))
    assert not set(before.values()) & set(after.values()), (before, after)
    with kgate.connect(kid) as ws:
        assert ws.run("print(2+2)").strip() == "4"
    kgate.delete_kernel(kid)


def test_kernel_that_always_dies_fails_the_start_with_the_reason(kgate, tmp_path):
    state = add_spec(kgate, "alwaysdies", [1, 2, 3, 4, 5], tmp_path)
    files_before = set(kgate.runtime_dir.glob("kernel-*.json"))
    status, _, body = kgate.rest("POST", "/api/kernels", {"name": "alwaysdies"})
    assert status == 500, (status, body)
    assert "exited with code 1" in body["message"], body
    assert launches(state) == 3  # launch_attempts
    assert set(kgate.runtime_dir.glob("kernel-*.json")) == files_before  # no stale file
    status, _, listing = kgate.rest("GET", "/api/kernels")
    assert all(k["name"] != "alwaysdies" for k in listing), listing


def test_a_kernel_whose_heartbeat_port_was_taken_is_relaunched(kgate, tmp_path):
    state = add_wrapped_spec(kgate, "hbtaken", HB_TAKEN, tmp_path / "hbtaken")
    try:
        status, _, model = kgate.rest("POST", "/api/kernels", {"name": "hbtaken"}, timeout=90)
        assert status == 201, (status, model, kgate.log_tail())
        kid = model["id"]
        kgate._kernels.add(kid)
        assert launches(state) == 2, "not relaunched"
        assert any("no heartbeat echo" in line and "relaunching it once on fresh ports" in line
                   for line in kgate.log_lines), kgate.log_tail()
        assert ports(kgate.connection_file(kid))["hb_port"] != taken_hb_port(state)
        assert json.loads(kgate.connection_file(kid).read_text())["transport"] == "tcp"
        time.sleep(1.5)  # several heartbeat intervals: it answers them
        assert kgate.kernel_model(kid)["responsive"] is True, kgate.kernel_model(kid)
        kgate.delete_kernel(kid)
    finally:
        stop_blocker(state)


# A kernel wedged in its start: it listens on its five ports and never answers on any.
WEDGED = COUNT + r'''
exec /usr/bin/python3 -c '
import json, socket, sys, time
info = json.load(open(sys.argv[1]))
held = []
for key in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((info["ip"], info[key])); s.listen(8); held.append(s)
time.sleep(120)' "$1"
'''


def test_a_wedged_kernel_is_relaunched_once_then_fails_with_what_was_missing(kgate_bin, tmp_path):
    (tmp_path / "kgate.toml").write_text("[kernel]\nready_timeout_ms = 6000\ntcp_kernelspecs = [\"wedged\"]\n\n[pool]\nsize = 0\n")
    kg = Kgate(kgate_bin, tmp_path, config=tmp_path / "kgate.toml").start()
    try:
        state = add_wrapped_spec(kg, "wedged", WEDGED, tmp_path / "wedged-state")
        status, _, body = kg.rest("POST", "/api/kernels", {"name": "wedged"}, timeout=60)
        assert status == 500, (status, body)
        missing = "no kernel_info_reply"
        assert "did not become ready within 6 s" in body["message"] and missing in body["message"], body
        assert launches(state) == 2, "not relaunched once"
        log = kg.log_tail(100)
        assert "relaunching it once on fresh ports" in log, log
        # The second launch is not relaunched again: a warning at a third of the timeout says
        # what is missing, before the start fails.
        assert re.search(r"not ready after 2\.\d s \(no kernel_info_reply.*\); its start fails if it is not within 6 s",
                         log), log
    finally:
        kg.stop()
