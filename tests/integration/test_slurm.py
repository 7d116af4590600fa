"""Kernels on a Slurm launcher (issue 19), against a single-node Slurm cluster this module
starts itself (engines.SlurmCluster: Debian 12's slurmctld, slurmd and munge, as root)."""

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
import zmq
from jupyter_client.session import Session

from conftest import Kgate, assert_interrupts_a_sleep, wait_until
from engines import SlurmCluster
from test_mcp_transcript import mcp_bin  # noqa: F401 (a fixture)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()


def launcher_config(path, extra=""):
    path.write_text(f"""
[kernel]
ready_timeout_ms = 8000

[pool]
size = 0

[remote]
scheduler_poll_ms = 500

[launchers.slurm]
kind = "slurm"
partition = "debug"
allow_override = ["time", "cpus"]
{extra}
""")
    return path


@pytest.fixture(scope="module")
def kg(kgate_bin, slurm, tmp_path_factory):
    root = tmp_path_factory.mktemp("kgate")
    d = Kgate(kgate_bin, root, config=launcher_config(root / "kgate.toml"))
    d.env["SLURM_CONF"] = str(slurm.conf)
    d.start()
    yield d
    d.stop(sig=signal.SIGINT)


def slurm_kernel(kg, body=None, timeout=90):
    body = dict(body or {})
    body.setdefault("name", "python3")
    body.setdefault("kgate_launcher", "slurm")
    status, _, model = kg.rest("POST", "/api/kernels", body, timeout=timeout)
    assert status == 201, f"{status} {model!r}\n{kg.log_tail()}"
    kg._kernels.add(model["id"])
    return model


def test_the_cluster_runs_a_job_that_imports_ipykernel(slurm, tmp_path):
    out = tmp_path / "out.txt"
    p = slurm.run("sbatch", "--parsable", "-o", str(out), "--wrap",
                  "/usr/bin/python3 -c 'import ipykernel, os; print(os.environ[\"SLURM_JOB_ID\"])'")
    assert p.returncode == 0, p.stderr
    job = p.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (job in slurm.jobs() or not out.exists()):
        time.sleep(0.2)
    assert out.read_text().strip() == job


def test_launchers_are_listed_with_whether_they_work(kg):
    status, _, body = kg.rest("GET", "/api/kgate/launchers")
    assert status == 200, body
    by_name = {l["name"]: l for l in body["launchers"]}
    assert by_name["local"]["usable"] is True
    assert by_name["slurm"]["kind"] == "slurm"
    assert by_name["slurm"]["usable"] is True, by_name["slurm"]
    assert by_name["slurm"]["allow_override"] == ["time", "cpus"]


def test_bad_launcher_requests_get_a_400_naming_the_key(kg):
    status, _, body = kg.rest("POST", "/api/kernels", {"name": "python3", "kgate_launcher": "nope"})
    assert status == 400 and "No launcher named nope" in body["message"], body
    status, _, body = kg.rest("POST", "/api/kernels", {"name": "python3", "kgate_launcher": "slurm",
                                                       "kgate_launcher_options": {"partition": "gpu"}})
    assert status == 400 and "kgate_launcher_options.partition" in body["message"], body
    status, _, body = kg.rest("POST", "/api/kernels", {"name": "python3",
                                                       "kgate_launcher_options": {"time": "5"}})
    assert status == 400 and "needs a launcher" in body["message"], body


def test_a_slurm_kernel_runs_in_its_job_and_is_cancelled_by_delete(kg, slurm):
    model = slurm_kernel(kg, {"kgate_launcher_options": {"time": "10"}})
    kid = model["id"]
    place = model["kgate_placement"]
    assert place["launcher"] == "slurm" and place["kind"] == "slurm", place
    assert place["state"] == "RUNNING" or place["state"] == "PENDING", place
    job = place["job_id"]
    assert job in slurm.jobs()
    with kg.connect(kid) as ws:
        r = ws.execute("import os; print(os.environ.get('SLURM_JOB_ID'))")
        assert r.status == "ok", r
        assert r.stdout.strip() == job
        # SIGINT to the kernel on the node, through the control link
        assert_interrupts_a_sleep(kg, kid, ws)
    # kgate's kernel side reaches a launcher's kernel too (docs/dev/kernel-side.md).
    side = kg.rest("GET", f"/api/kgate/kernels/{kid}")[2].get("kgate_kernel_side") or {}
    assert side.get("installed") is True and all(v is True for v in side["features"].values()), side
    kg.delete_kernel(kid)
    assert wait_until(lambda: job not in [j for j in slurm.jobs()], 30), slurm.run("squeue").stdout


def test_a_restart_keeps_the_job_and_a_time_limit_ends_it_with_the_reason(kg, slurm):
    model = slurm_kernel(kg, {"kgate_launcher_options": {"time": "1"}})  # one minute
    kid, job = model["id"], model["kgate_placement"]["job_id"]
    started = time.monotonic()
    with kg.connect(kid) as ws:
        assert ws.execute("x = 41").status == "ok"
        status, _, body = kg.rest("POST", f"/api/kernels/{kid}/restart", timeout=60)
        assert status == 200, (status, body, kg.log_tail())
        r = ws.execute("import os; print(os.environ['SLURM_JOB_ID'], 'x' in globals())")
        assert r.status == "ok", r
        assert r.stdout.split() == [job, "False"], r  # a new process, in the same job
    assert "restarted in place" in kg.log_tail(200)
    # Slurm ends the job at its time limit: the kernel is dead, with the scheduler's reason.
    def dead():
        m = kg.kernel_model(kid)
        return m if m["execution_state"] == "dead" else None
    m = wait_until(dead, 150 - (time.monotonic() - started), interval=1)
    assert m, kg.kernel_model(kid)
    assert "Slurm job " + job in m["reason"] and "TIMEOUT" in m["reason"], m
    assert m["kgate_placement"]["state"] == "TIMEOUT", m
    kg.delete_kernel(kid)


def registration_endpoint(kg):
    m = re.findall(r"remote launchers register at (tcp://\S+)", kg.log_tail(500))
    assert m, kg.log_tail()
    return m[-1]


def idle_cpus(slurm):
    alloc, idle, _other, _total = slurm.run("sinfo", "-h", "-o", "%C").stdout.strip().split("/")
    return int(idle)


def register(endpoint, key, kernel_id, content, date=None, msg_id=None):
    """One registration as a node launcher sends it; returns kgate's reply content."""
    session = Session(key=key.encode(), session=kernel_id, username="test")
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    s.connect(endpoint)
    try:
        msg = session.msg("kgate_register", content)
        if date is not None:
            msg["header"]["date"] = date
        if msg_id is not None:
            msg["header"]["msg_id"] = msg_id
            msg["msg_id"] = msg_id
        session.send(s, msg)
        assert s.poll(10000), "kgate did not answer the registration"
        frames = s.recv_multipart()
        idx = frames.index(b"<IDS|MSG>")
        return json.loads(frames[idx + 5])
    finally:
        s.close()


def test_a_queued_job_is_a_starting_kernel_that_can_be_deleted_and_registrations_are_checked(kg, slurm):
    # Fill the node, so the kernel's job waits in the queue.
    p = slurm.run("sbatch", "--parsable", "-o", "/dev/null", "-c", str(idle_cpus(slurm)), "--wrap", "sleep 300")
    assert p.returncode == 0, p.stderr
    blocker = p.stdout.strip().split(";")[0]
    try:
        t0 = time.monotonic()
        status, _, model = kg.rest("POST", "/api/kernels", {"name": "python3", "kgate_launcher": "slurm"},
                                   timeout=60)
        waited = time.monotonic() - t0
        # After ready_timeout (8 s here) the POST answers 202 with the pending model.
        assert status == 202, (status, model, kg.log_tail())
        assert 7 <= waited < 20, waited
        kid = model["id"]
        kg._kernels.add(kid)
        assert model["execution_state"] == "starting", model
        place = model["kgate_placement"]
        assert place["state"] == "PENDING" and place["reason"] in ("Resources", "Priority"), place
        job = place["job_id"]

        # Registrations for it: the secret is in the launch spec (0600, kgate's state dir).
        spec_file = kg.root / "state" / "kgate" / "remote" / f"{kid}-1.json"
        spec = json.loads(spec_file.read_text())
        assert oct(spec_file.stat().st_mode & 0o777) == "0o600"
        endpoint = registration_endpoint(kg)
        content = {"kernel_id": kid, "attempt": 1, "ip": "127.0.0.1", "shell_port": 1, "iopub_port": 2,
                   "stdin_port": 3, "control_port": 4, "hb_port": 5, "control_link_port": 6, "pid": 1,
                   "start_time": 1, "hostname": "forger"}
        forged = register(endpoint, "not-the-secret", kid, content)
        assert forged["status"] == "error" and "signature" in forged["reason"], forged
        late = register(endpoint, spec["secret"], kid, content, date="2026-01-01T00:00:00.000000Z")
        assert late["status"] == "error" and "late" in late["reason"], late
        wrong = register(endpoint, spec["secret"], kid, dict(content, attempt=7), msg_id="n-1")
        assert wrong["status"] == "error" and "earlier launch" in wrong["reason"], wrong
        replayed = register(endpoint, spec["secret"], kid, content, msg_id="n-1")
        assert replayed["status"] == "error" and "replayed" in replayed["reason"], replayed
        assert kg.kernel_model(kid)["execution_state"] == "starting"

        # Deleting the pending kernel cancels its job.
        kg.delete_kernel(kid)
        assert wait_until(lambda: job not in slurm.jobs(), 30), slurm.run("squeue").stdout
        status, _, _ = kg.rest("GET", f"/api/kernels/{kid}")
        assert status == 404
    finally:
        slurm.run("scancel", blocker)
        wait_until(lambda: blocker not in slurm.jobs(), 30)


def test_a_registration_is_refused_once_the_kernel_registered(kg, slurm):
    # The launch spec is removed by the node launcher once read: catch its secret while the job
    # waits in the queue, then let the job run.
    p = slurm.run("sbatch", "--parsable", "-o", "/dev/null", "-c", str(idle_cpus(slurm)), "--wrap", "sleep 300")
    blocker = p.stdout.strip().split(";")[0]
    import threading
    result = {}
    t = threading.Thread(target=lambda: result.update(
        r=kg.rest("POST", "/api/kernels", {"name": "python3", "kgate_launcher": "slurm"}, timeout=60)))
    t.start()
    try:
        spec_files = lambda: list((kg.root / "state" / "kgate" / "remote").glob("*-1.json"))
        assert wait_until(lambda: spec_files(), 10)
        spec = json.loads(spec_files()[0].read_text())
    finally:
        slurm.run("scancel", blocker)
    t.join(60)
    status, _, model = result["r"]
    assert status == 201, (status, model, kg.log_tail())
    kid = model["id"]
    kg._kernels.add(kid)
    assert spec["kernel_id"] == kid
    content = {"kernel_id": kid, "attempt": 1, "ip": "127.0.0.1", "shell_port": 1, "iopub_port": 2,
               "stdin_port": 3, "control_port": 4, "hb_port": 5, "control_link_port": 6, "pid": 1,
               "start_time": 1, "hostname": "replayer"}
    again = register(registration_endpoint(kg), spec["secret"], kid, content)
    assert again["status"] == "error" and "no registration is expected" in again["reason"], again
    with kg.connect(kid) as ws:
        assert ws.execute("1 + 1").status == "ok"
    kg.delete_kernel(kid)


@pytest.mark.parametrize("how", ["kill -9", "SIGTERM"])
def test_a_restarted_kgate_readopts_its_slurm_kernel(kgate_bin, slurm, tmp_path, how):
    def daemon():
        d = Kgate(kgate_bin, tmp_path, config=launcher_config(tmp_path / "kgate.toml"))
        d.env["SLURM_CONF"] = str(slurm.conf)
        return d.start()
    kg1 = daemon()
    kid = job = None
    try:
        model = slurm_kernel(kg1)
        kid, job = model["id"], model["kgate_placement"]["job_id"]
        with kg1.connect(kid) as ws:
            assert ws.execute("x = 41").status == "ok"
        if how == "kill -9":
            os.kill(kg1.proc.pid, signal.SIGKILL)
            kg1.proc.wait(10)
        else:
            assert kg1.stop(sig=signal.SIGTERM, sweep=False) == 0
        assert job in slurm.jobs(), "the job ended with kgate"
    except BaseException:
        kg1.stop(sig=signal.SIGINT)
        raise
    kg2 = daemon()
    try:
        assert "re-adopting it from an earlier kgate" in kg2.log_tail(200), kg2.log_tail()
        def idle():
            return kg2.kernel_model(kid)["execution_state"] == "idle"
        assert wait_until(idle, 30), kg2.log_tail()
        m = kg2.kernel_model(kid)
        assert m["kgate_placement"]["job_id"] == job and m["kgate_placement"]["launcher"] == "slurm", m
        with kg2.connect(kid) as ws:
            r = ws.execute("import os; print(x + 1, os.environ['SLURM_JOB_ID'])")
            assert r.status == "ok", r
            assert r.stdout.split() == ["42", job], r
        kg2.delete_kernel(kid)
        assert wait_until(lambda: job not in slurm.jobs(), 30), slurm.run("squeue").stdout
    finally:
        kg2.stop(sig=signal.SIGINT)


def test_kgate_mcp_connects_on_a_launcher_and_says_when_it_is_queued(kg, slurm, mcp_bin, tmp_path):
    from test_mcp_semantics import Agent
    agent = Agent(mcp_bin, tmp_path / "agent", kg.url)
    p = slurm.run("sbatch", "--parsable", "-o", "/dev/null", "-c", str(idle_cpus(slurm)), "--wrap", "sleep 300")
    blocker = p.stdout.strip().split(";")[0]
    try:
        listing = agent.ok("list_kernels")
        assert re.search(r"slurm\s+slurm\s+usable", listing), listing
        text = agent.ok("connect", launcher="slurm")
        m = re.search(r"queued as Slurm job (\d+) \(PENDING, (\w+)\); poll with server_status", text)
        assert m, text
        job = m.group(1)
        kid = re.search(r"created kernel (\S+)", text).group(1)
        kg._kernels.add(kid)
        err = agent.error("execute", code="1 + 1")
        assert "still queued as Slurm job " + job in err, err
        status = agent.ok("server_status")
        assert "runs on slurm: Slurm job " + job + " PENDING" in status, status
        # verify waits for its queued scratch kernel as long as a cell may run, then cancels it.
        before = set(slurm.jobs())
        err = agent.error("verify", cells=["1"], timeout=2)
        assert re.search(r"still queued as Slurm job \d+ \(PENDING.*after 2(\.0+)? s, so nothing ran", err), err
        assert wait_until(lambda: set(slurm.jobs()) == before, 30), (before, slurm.run("squeue").stdout)
        slurm.run("scancel", blocker)
        assert wait_until(lambda: kg.kernel_model(kid)["execution_state"] == "idle", 60), kg.log_tail()
        out = agent.ok("execute", code="import os; print(os.environ['SLURM_JOB_ID'])")
        assert job in out, out
        # verify's scratch kernel runs where the agent's kernel runs: a Slurm job of its own on
        # the same launcher, cancelled afterwards.
        report = agent.ok("verify", cells=["import os", "print('job', os.environ['SLURM_JOB_ID'])"])
        assert "on launcher slurm" in report and "all 2 cells passed" in report, report
        scratch = re.search(r"job (\d+)", report.split("cell 2/2", 1)[1]).group(1)
        assert scratch != job, report
        assert wait_until(lambda: scratch not in slurm.jobs(), 30), slurm.run("squeue").stdout
        assert job in slurm.jobs()
        listing = agent.ok("list_kernels")
        assert "on slurm: Slurm job " + job + " RUNNING" in listing, listing
        agent.ok("stop_kernel")
        assert wait_until(lambda: job not in slurm.jobs(), 30), slurm.run("squeue").stdout
    finally:
        slurm.run("scancel", blocker)
        agent.kill()


def test_the_observe_page_and_kgate_kernels_show_where_a_kernel_runs(kg, slurm, tmp_path):
    import subprocess
    from cdp import Chromium
    from test_observe import CHROMIUM, artifacts_dir
    model = slurm_kernel(kg)
    kid, job = model["id"], model["kgate_placement"]["job_id"]
    # The owner's `kgate kernels`: the default gateway, whose token it finds by itself.
    env = dict(os.environ, KGATE_URL=kg.url, XDG_STATE_HOME=kg.env["XDG_STATE_HOME"])
    env.pop("KGATE_TOKEN", None)
    out = subprocess.run([kg.binary, "kernels"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert f"on slurm: Slurm job {job} RUNNING" in out.stdout, out.stdout
    assert re.search(r"slurm\s+slurm\s+usable", out.stdout), out.stdout
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is absent (scripts/bootstrap.sh installs chromium)"
    with Chromium.launch(tmp_path / "chromium-profile") as b:
        page = b.page()
        page.navigate(f"{kg.url}/observe?token={kg.token}")
        page.wait_for(f"document.querySelector('[data-kernel=\"{kid}\"] .placement') !== null", timeout=20)
        text = page.text(f'[data-kernel="{kid}"] .placement')
        assert f"on slurm: Slurm job {job} RUNNING" in text, text
        page.screenshot(artifacts_dir() / "observe-slurm.png")
    kg.delete_kernel(kid)
