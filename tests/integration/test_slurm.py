"""Kernels on a Slurm launcher (issue 19), against a single-node Slurm cluster this module
starts itself (engines.SlurmCluster: Debian 12's slurmctld, slurmd and munge, as root)."""

import time

import pytest

from conftest import Kgate, wait_until
from engines import SlurmCluster


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()


def launcher_config(path, extra=""):
    path.write_text(f"""
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
    d.stop(sig=__import__("signal").SIGINT)


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
        # interrupt a sleep: SIGINT to the kernel on the node, through the control link
        pending = ws.execute_async("import time; time.sleep(60)", stop_on_error=False)
        time.sleep(1.0)
        status, _, _ = kg.rest("POST", f"/api/kernels/{kid}/interrupt")
        assert status == 204
        res = ws.collect(pending, timeout=20)
        assert res.status == "error" and res.error["ename"] == "KeyboardInterrupt", res
        r = ws.execute("1 + 1")
        assert r.status == "ok"
    kg.delete_kernel(kid)
    assert wait_until(lambda: job not in [j for j in slurm.jobs()], 30), slurm.run("squeue").stdout
