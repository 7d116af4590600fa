"""Idle culling (docs/kernels.md "Idle culling", docs/dev/kernel-lifecycle.md "Idle culling"): jupyter_server's cull_idle_timeout,
cull_interval, cull_connected and cull_busy in [culling], the per-kernel "kgate_cull_idle_timeout"
of POST /api/kernels, what a culled kernel's websocket clients are told, and what its records say.
Small timeouts (2 s, checked every 1 s) keep the whole file near 30 s."""

import threading
import time

from conftest import WSClosed, pid_alive, wait_until
from records_util import agent_execute, agent_run, digest, get_job, kgate_kernel

CULL_WAIT = 12  # 2 s timeout + 1 s interval, with room for a loaded machine


def wait_began(kg, job, timeout=15):
    rec = wait_until(lambda: (lambda r: r if r["began"] else None)(get_job(kg, job)), timeout)
    assert rec and rec["status"] == "running", get_job(kg, job)
    return rec


def culling_config(tmp_path, name, **culling):
    cfg = tmp_path / name
    lines = ["[culling]"]
    for k, v in culling.items():
        lines.append(f"{k} = {str(v).lower() if isinstance(v, bool) else v}")
    cfg.write_text("\n".join(lines) + "\n")
    return cfg


def start_kernels(kg, bodies, pids=None):
    """POST /api/kernels for each body at once (kernels start in parallel); ids in order. With
    `pids` (a dict), each kernel's pid is put there as soon as it started: a kernel that is
    ready first may be culled while the others still start."""
    out = [None] * len(bodies)

    def one(i, body):
        out[i] = kg.start_kernel(body)["id"]
        if pids is not None:
            pids[out[i]] = kg.kernel_pid(out[i])

    threads = [threading.Thread(target=one, args=(i, b)) for i, b in enumerate(bodies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(out), out
    return out


def listed(kg):
    status, _, body = kg.rest("GET", "/api/kernels")
    assert status == 200, body
    return {m["id"] for m in body}


def gone(kg, kid):
    return kid not in listed(kg)


def test_culling_defaults(kgate_factory, tmp_path):
    """cull_idle_timeout = 2 with cull_connected and cull_busy false: an idle kernel goes, one
    with a websocket client or a busy one stays, and so does one created with a timeout of 0."""
    cfg = culling_config(tmp_path, "a.toml", cull_idle_timeout=2, cull_interval=1)
    kg = kgate_factory(config=cfg)
    # Each kernel gets what keeps it (a client, a running cell) as soon as it started: a start
    # takes seconds on a loaded machine, longer than the 2 s timeout.
    pids = {}
    (connected,) = start_kernels(kg, [{"name": "python3"}], pids)
    ws = kg.connect(connected)
    try:
        ws.run("y = 2")
        (busy,) = start_kernels(kg, [{"name": "python3"}], pids)
        status, rec = agent_execute(kg, busy, "import time\ntime.sleep(12)", agent="culling-b")
        assert status == 200, rec
        job_busy = rec["job"]
        (never,) = start_kernels(kg, [{"name": "python3", "kgate_cull_idle_timeout": 0}])
        (idle,) = start_kernels(kg, [{"name": "python3"}], pids)
        job_idle = agent_run(kg, idle, "x = 1", agent="culling-a")["job"]

        # The jupyter model is unchanged; the kgate one says how long until a cull.
        status, _, model = kg.rest("GET", f"/api/kernels/{idle}")
        assert status == 200 and "idle_seconds" not in model and "cull_after_seconds" not in model, model
        ext = kgate_kernel(kg, idle)
        assert ext["cull_after_seconds"] == 2, ext
        assert isinstance(ext["idle_seconds"], (int, float)) and ext["idle_seconds"] >= 0, ext
        assert ext["age_seconds"] >= ext["idle_seconds"], ext
        assert ext["connections"] == 0, ext
        assert kgate_kernel(kg, never)["cull_after_seconds"] is None

        ws_job = wait_until(lambda: [j for j in digest(kg, connected, "t")["jobs"]
                                     if j["status"] == "ok"], 10)
        assert ws_job, digest(kg, connected, "t")
        wait_began(kg, job_busy)

        assert wait_until(lambda: gone(kg, idle), CULL_WAIT), f"idle kernel not culled\n{kg.log_tail(30)}"
        assert wait_until(lambda: not pid_alive(pids[idle]), 10), "the culled kernel's process lives on"
        rec = get_job(kg, job_idle)
        assert rec["status"] == "ok", rec  # it had ended: the record says the kernel went after it
        assert "culled after" in rec["note"] and "cull_idle_timeout = 2 s" in rec["note"], rec
        status, _, _ = kg.rest("GET", f"/api/kgate/kernels/{idle}")
        assert status == 404

        # Connected, busy and opted-out kernels stay, though idle (or silent) for over 2 s.
        time.sleep(1.5)
        still = listed(kg)
        assert {connected, busy, never} <= still, (still, kg.log_tail(30))
        assert get_job(kg, job_busy)["status"] == "running"
        assert kg.kernel_model(busy)["execution_state"] == "busy"
    finally:
        ws.close()

    # Without its client the connected kernel is idle like any other.
    assert wait_until(lambda: gone(kg, connected), CULL_WAIT), kg.log_tail(30)
    assert wait_until(lambda: not pid_alive(pids[connected]), 10)
    rec = get_job(kg, ws_job[0]["job"])
    assert "culled after" in rec["note"], rec
    assert never in listed(kg)


def test_cull_connected_busy_and_per_kernel_timeout(kgate_factory, tmp_path):
    """The gateway's timeout off, cull_connected and cull_busy on: a kernel created with
    kgate_cull_idle_timeout = 2 is culled while a websocket client runs a cell on it (the client
    sees the note and dead, the cell's record ends "culled"); a kernel without one stays."""
    cfg = culling_config(tmp_path, "b.toml", cull_interval=1, cull_connected=True, cull_busy=True)
    kg = kgate_factory(config=cfg)

    for bad in (-1, 0.5, "2", True, [2], 1e12):
        status, _, body = kg.rest("POST", "/api/kernels", {"name": "python3", "kgate_cull_idle_timeout": bad})
        assert status == 400, (bad, status, body)
        assert "kgate_cull_idle_timeout" in body["message"], body

    ttl, plain = start_kernels(kg, [{"name": "python3", "kgate_cull_idle_timeout": 2},
                                    {"name": "python3", "kgate_cull_idle_timeout": None}])
    assert kgate_kernel(kg, ttl)["cull_after_seconds"] == 2
    assert kgate_kernel(kg, plain)["cull_after_seconds"] is None
    pid = kg.kernel_pid(ttl)

    ws = kg.connect(ttl)
    try:
        ws.execute_async("import time\ntime.sleep(30)")
        job = wait_until(lambda: [j for j in digest(kg, ttl, "t")["jobs"] if j["status"] == "running"], 10)
        assert job, digest(kg, ttl, "t")
        job = job[0]["job"]
        note = ws.wait_for(lambda m: m.get("msg_type") == "stream" and "[kgate]" in m["content"].get("text", ""),
                           timeout=CULL_WAIT, what="the cull note")
        assert note["channel"] == "iopub" and note["content"]["name"] == "stderr", note
        text = note["content"]["text"]
        assert "kernel culled after" in text and "kgate_cull_idle_timeout = 2 s" in text, text
        dead = ws.wait_for(lambda m: m.get("msg_type") == "status"
                           and m["content"].get("execution_state") == "dead", timeout=5, what="status dead")
        assert ws.received.index(dead) > ws.received.index(note), "dead came before the note"
        # Then the connection is closed (1001) once the kernel is gone.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                ws.recv(timeout=deadline - time.monotonic())
            except WSClosed:
                break
            except TimeoutError:
                pass
        assert ws.closed, "the websocket of a culled kernel stayed open"
    finally:
        ws.close()

    assert wait_until(lambda: gone(kg, ttl), 10), kg.log_tail(30)
    assert wait_until(lambda: not pid_alive(pid), 10)
    rec = get_job(kg, job)
    assert rec["status"] == "culled", rec
    assert "while this job ran" in rec["note"] and rec["ended_at"], rec
    status, _, listing = kg.rest("GET", f"/api/kgate/jobs?kernel={ttl}")
    assert status == 200, listing
    assert [j["status"] for j in listing["jobs"] if j["job"] == job] == ["culled"], listing
    # The kernel without a timeout of its own is never culled here (the gateway's is off).
    assert plain in listed(kg)


def test_a_kernel_whose_background_task_runs_is_not_culled(kgate_factory, tmp_path):
    """A background task (docs/dev/kernel-side.md) keeps its kernel busy for culling though the shell is idle
    and the task prints nothing; once it ends the kernel is idle and culled as any other."""
    cfg = culling_config(tmp_path, "c.toml", cull_idle_timeout=2, cull_interval=1)
    kg = kgate_factory(config=cfg)
    kid = kg.start_kernel()["id"]
    assert wait_until(lambda: kgate_kernel(kg, kid).get("kgate_kernel_side"), 20)
    status, rec = agent_execute(kg, kid, "import time\ntime.sleep(7)", "agent-a", wait=0, background=True)
    assert status == 200 and rec["status"] == "running", rec
    time.sleep(5)  # 2 s idle, checked every second: several passes would have culled it
    assert kid in listed(kg), kg.log_tail(20)
    assert get_job(kg, rec["job"])["status"] == "running"
    assert get_job(kg, rec["job"], wait=10)["status"] == "ok"
    assert wait_until(lambda: gone(kg, kid), CULL_WAIT), kg.log_tail(20)
