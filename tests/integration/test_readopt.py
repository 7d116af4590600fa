"""Kernels outlive kgate (issue 18; docs/dev/readoption.md supervisors, docs/dev/readoption.md the kernel table and
re-adoption): a kgate killed with -9 leaves its kernels running under their supervisors; the
next kgate on the same state directory re-adopts them with their ids, ports, key, connection
files and state; kernels nobody comes back for end after orphan_timeout_seconds; a bad table
file is reported and set aside."""

import json
import os
import signal
import time

from conftest import Kgate, cmdline_of, pid_alive, supervisors_of, wait_until
from records_util import attach_client, kc_run
from test_mcp_semantics import Agent
from test_mcp_transcript import mcp_bin  # noqa: F401 (a fixture)


def table_dir(kg):
    return kg.root / "state" / "kgate" / "kernels"


def kernel_ids(kg):
    status, _, body = kg.rest("GET", "/api/kernels")
    assert status == 200, body
    return {m["id"]: m for m in body}


def kernel_pid_anywhere(kg, kid, timeout=10):
    """An adopted kernel is no descendant of the kgate that adopted it (its supervisor was
    reparented when the old kgate died): find it by the connection file in its argv."""
    names = (f"kernel-{kid}.json", f"pool-{kid}.json")

    def find():
        for d in os.listdir("/proc"):
            if d.isdigit():
                argv = cmdline_of(int(d))
                if argv and os.path.basename(argv[0]) != "kgate-supervise" and \
                        any(n in a for a in argv for n in names):
                    return int(d)
        return None
    pid = wait_until(find, timeout)
    assert pid, f"no process has {names[0]} in its argv"
    return pid


def kill_9(kg):
    os.kill(kg.proc.pid, signal.SIGKILL)
    kg.proc.wait(10)


def test_a_killed_kgates_kernels_are_readopted_by_the_next(kgate_factory, kgate_bin):
    kg = kgate_factory()
    a = kg.start_kernel()["id"]
    b = kg.start_kernel()["id"]
    with kg.connect(a) as ws:
        assert ws.run("x = 41\nprint('set')") == "set\n"
    files = {k: kg.connection_file(k).read_text() for k in (a, b)}
    pids = {k: kg.kernel_pid(k) for k in (a, b)}
    assert wait_until(lambda: len(list(table_dir(kg).glob("*.json"))) >= 3, 30), \
        f"no table entries (2 kernels + the pool's): {sorted(os.listdir(table_dir(kg)))}"
    entry = json.loads((table_dir(kg) / f"{a}.json").read_text())
    assert entry["version"] == 1 and entry["pid"] == pids[a] and entry["pooled"] is False, entry
    assert oct(os.stat(table_dir(kg) / f"{a}.json").st_mode & 0o777) == "0o600"
    pool_entries = [json.loads(p.read_text()) for p in table_dir(kg).glob("*.json")]
    pooled = [e["pid"] for e in pool_entries if e["pooled"]]
    kc = attach_client(kg, a)  # a client attached by connection file, across the restart
    try:
        kill_9(kg)
        time.sleep(1.0)
        assert all(pid_alive(p) for p in pids.values()), "a kernel died with kgate"

        kg2 = Kgate(kgate_bin, kg.root).start()
        try:
            assert wait_until(lambda: {a, b} <= set(kernel_ids(kg2)) and
                              all(kernel_ids(kg2)[k]["execution_state"] == "idle" for k in (a, b)), 30), \
                f"{kernel_ids(kg2)}\n{kg2.log_tail(30)}"
            assert any("re-adopting it from an earlier kgate" in line for line in kg2.log_lines), kg2.log_tail(30)
            for k in (a, b):
                assert kg2.connection_file(k).read_text() == files[k], "the connection file changed"
                assert kernel_pid_anywhere(kg2, k) == pids[k]
            with kg2.connect(a) as ws:
                assert ws.run("print(x + 1)") == "42\n", "the kernel's state was lost"
            content, out = kc_run(kc, "print('still attached', x)")
            assert content["status"] == "ok" and out == "still attached 41\n", (content, out)
            # The old pool's kernel is not kept: a fresh pool starts.
            assert wait_until(lambda: not any(pid_alive(p) for p in pooled), 15), pooled
            # Deleting an adopted kernel ends its process and its table entry.
            kg2.delete_kernel(b)
            assert wait_until(lambda: not pid_alive(pids[b]), 10)
            assert not (table_dir(kg2) / f"{b}.json").exists()
            # Interrupt and restart work through the supervisor the old kgate started.
            with kg2.connect(a) as ws:
                pending = ws.execute_async("import time\ntime.sleep(30)", stop_on_error=False)
                time.sleep(1.0)
                status, _, _ = kg2.rest("POST", f"/api/kernels/{a}/interrupt")
                assert status == 204
                r = ws.collect(pending, timeout=15)
                assert r.status == "error" and "KeyboardInterrupt" in str(r.reply), r
            status, _, body = kg2.rest("POST", f"/api/kernels/{a}/restart")
            assert status == 200, body
            new_pid = kg2.kernel_pid(a)  # restarted: now under a supervisor of kg2's
            assert new_pid != pids[a] and not pid_alive(pids[a])
            assert json.loads((table_dir(kg2) / f"{a}.json").read_text())["pid"] == new_pid
        finally:
            kg2.cleanup_kernels()
            kg2.stop()
        assert not supervisors_of(kg.root), "supervisors outlived the kgate that stopped their kernels"
    finally:
        kc.stop_channels()


def test_kernels_nobody_comes_back_for_end_after_the_orphan_timeout(kgate_factory, kgate_bin, tmp_path):
    cfg = tmp_path / "k.toml"
    cfg.write_text("[kernel]\norphan_timeout_seconds = 2\nterminate_grace_ms = 500\n[pool]\nsize = 0\n")
    kg = kgate_factory(config=cfg)
    kid = kg.start_kernel()["id"]
    pid = kg.kernel_pid(kid)
    conn = kg.connection_file(kid)
    kill_9(kg)
    time.sleep(0.5)
    assert pid_alive(pid), "the kernel did not wait for the orphan timeout"
    assert wait_until(lambda: not pid_alive(pid), 10), "the kernel outlived its orphan timeout"
    assert wait_until(lambda: not supervisors_of(kg.root), 5)
    kg2 = Kgate(kgate_bin, kg.root).start()
    try:
        # Reported dead, not dropped, and never re-adopted.
        model = kernel_ids(kg2).get(kid)
        assert model and model["execution_state"] == "dead", (model, kg2.log_tail(30))
        status, _, ext = kg2.rest("GET", f"/api/kgate/kernels/{kid}")
        assert status == 200 and "ended while no kgate was running" in ext["reason"], ext
        assert any(f"kernel {kid} (python3, pid {pid}): listed dead" in line for line in kg2.log_lines), kg2.log_tail(30)
        assert not conn.exists(), "the ended kernel's connection file is still there"
        assert (table_dir(kg2) / f"{kid}.json").exists(), "the dead kernel's entry went before its DELETE"
        # A restart starts it afresh in place (same id, ports and file), under a new supervisor.
        status, _, body = kg2.rest("POST", f"/api/kernels/{kid}/restart")
        assert status == 200 and body["execution_state"] == "idle", body
        assert conn.exists()
        with kg2.connect(kid) as ws:
            assert ws.run("print('again')") == "again\n"
        kg2.delete_kernel(kid)
        assert not (table_dir(kg2) / f"{kid}.json").exists()
    finally:
        kg2.stop()


def test_orphan_timeout_zero_ends_kernels_with_their_kgate(kgate_factory, tmp_path):
    cfg = tmp_path / "k.toml"
    cfg.write_text("[kernel]\norphan_timeout_seconds = 0\n")
    kg = kgate_factory(config=cfg)
    kid = kg.start_kernel()["id"]
    pid = kg.kernel_pid(kid)
    kill_9(kg)
    assert wait_until(lambda: not pid_alive(pid), 5), "orphan_timeout_seconds = 0 left the kernel running"


def test_a_bad_table_file_is_reported_and_set_aside(kgate_factory, kgate_bin):
    kg = kgate_factory()
    root = kg.root
    kg.stop()
    d = table_dir(kg)
    d.mkdir(parents=True, exist_ok=True)
    (d / "torn.json").write_text('{"format": "kgate-kernel", "vers')
    newer = {"format": "kgate-kernel", "version": 99, "id": "newer"}
    (d / "newer.json").write_text(json.dumps(newer))
    kg2 = Kgate(kgate_bin, root).start()
    try:
        problems = [line for line in kg2.log_lines if "kernel table:" in line]
        assert any("torn.json" in p and "set aside" in p for p in problems), kg2.log_tail(30)
        assert any("newer.json" in p and "version 99" in p for p in problems), kg2.log_tail(30)
        assert (d / "torn.json.bad").exists() and not (d / "torn.json").exists()
        assert (d / "newer.json.bad").exists()
        assert kernel_ids(kg2) == {}
        kid = kg2.start_kernel()["id"]  # and it works
        kg2.delete_kernel(kid)
    finally:
        kg2.stop()


def kgate_stop(kgate_bin, kg, *args, state_dir=None):
    import subprocess
    state_dir = state_dir or kg.root / "state" / "kgate"
    return subprocess.run([kgate_bin, "stop", "--state-dir", str(state_dir), *args],
                          env=kg.env, capture_output=True, text=True, timeout=60)


def test_sigterm_leaves_kernels_for_the_next_kgate_and_stop_kernels_ends_them(kgate_factory, kgate_bin):
    kg = kgate_factory()
    a = kg.start_kernel()["id"]
    with kg.connect(a) as ws:
        assert ws.run("x = 5\nprint('set')") == "set\n"
    pid = kg.kernel_pid(a)

    def pooled_pids():
        return [e["pid"] for e in (json.loads(p.read_text()) for p in table_dir(kg).glob("*.json")) if e["pooled"]]
    assert wait_until(lambda: pooled_pids(), 30), "the warm pool never refilled"
    pooled = pooled_pids()

    r = kgate_stop(kgate_bin, kg)  # SIGTERM
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert f"kgate (pid {kg.proc.pid}) stopped; its kernels keep running" in r.stdout, r.stdout
    assert kg.proc.wait(10) == 0
    assert any("left 1 kernel(s) running for the next kgate" in line for line in kg.log_lines), kg.log_tail(20)
    assert pid_alive(pid), "SIGTERM stopped a kernel"
    assert wait_until(lambda: not any(pid_alive(p) for p in pooled), 10), "a warm-pool kernel outlived kgate"
    assert [p.name for p in table_dir(kg).glob("*.json")] == [f"{a}.json"]
    kg.stop(sweep=False)  # bookkeeping only: it has exited

    kg2 = Kgate(kgate_bin, kg.root).start()
    try:
        assert wait_until(lambda: kernel_ids(kg2).get(a, {}).get("execution_state") == "idle", 30), kg2.log_tail(20)
        with kg2.connect(a) as ws:
            assert ws.run("print(x * 2)") == "10\n"
        r = kgate_stop(kgate_bin, kg2, "--kernels")  # SIGINT: the kernels stop too
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert "its kernels were stopped with it" in r.stdout, r.stdout
        assert kg2.proc.wait(10) == 0
        assert wait_until(lambda: not pid_alive(pid), 10), "kgate stop --kernels left the kernel running"
        assert list(table_dir(kg2).glob("*.json")) == []
        assert not supervisors_of(kg.root)
    finally:
        kg2.stop()
    r = kgate_stop(kgate_bin, kg2)
    assert r.returncode == 1 and "no kgate is running on state directory" in r.stderr, (r.stdout, r.stderr)
    r = kgate_stop(kgate_bin, kg2, state_dir=kg.root / "nowhere")
    assert r.returncode == 1 and "no kgate has run on state directory" in r.stderr, (r.stdout, r.stderr)


def test_kgate_mcp_carries_on_across_a_kgate_restart(mcp_bin, kgate_factory, kgate_bin, tmp_path):
    """The agent's pointer survives: while kgate is down a call says the gateway does not answer;
    once a kgate is back on the same port and state, the same kernel answers, with its state,
    and no kernel is created."""
    kg = kgate_factory()
    a = Agent(mcp_bin, tmp_path / "agent", kg.url)
    try:
        assert a.ok("execute", code="x = 41").endswith("(no output)")  # after the auto kernel's banner
        before = set(kernel_ids(kg))
        assert len(before) == 1, before
        port = kg.port
        kg.stop(sweep=False)  # SIGTERM: the kernel stays
        down = a.error("execute", code="x")
        assert "gateway" in down, down
        kg2 = Kgate(kgate_bin, kg.root, port=port).start()
        try:
            assert a.ok("execute", code="x + 1") == "42"
            assert set(kernel_ids(kg2)) == before, "kgate-mcp created another kernel"
        finally:
            kg2.stop()
    finally:
        a.kill()


def test_a_kernel_killed_while_kgate_was_down_is_reported_dead(kgate_factory, kgate_bin):
    kg = kgate_factory()
    kid = kg.start_kernel()["id"]
    pid = kg.kernel_pid(kid)
    kill_9(kg)
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not pid_alive(pid), 5)
    assert wait_until(lambda: not any(str(kid) in " ".join(cmdline_of(p)) for p in supervisors_of(kg.root)), 5), \
        "the supervisor outlived its kernel"
    kg2 = Kgate(kgate_bin, kg.root).start()
    try:
        model = kernel_ids(kg2)[kid]
        assert model["execution_state"] == "dead" and "ended while no kgate was running" in model["reason"], model
        kg2.delete_kernel(kid)
        assert kid not in kernel_ids(kg2)
    finally:
        kg2.stop()
