"""Kernels on a Slurm launcher (issue 19), against a single-node Slurm cluster this module
starts itself (engines.SlurmCluster: Debian 12's slurmctld, slurmd and munge, as root)."""

import pytest

from engines import SlurmCluster


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()


def test_the_cluster_runs_a_job_that_imports_ipykernel(slurm, tmp_path):
    out = tmp_path / "out.txt"
    p = slurm.run("sbatch", "--parsable", "-o", str(out), "--wrap",
                  "/usr/bin/python3 -c 'import ipykernel, os; print(os.environ[\"SLURM_JOB_ID\"])'")
    assert p.returncode == 0, p.stderr
    job = p.stdout.strip().split(";")[0]
    import time
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (job in slurm.jobs() or not out.exists()):
        time.sleep(0.2)
    assert out.read_text().strip() == job
