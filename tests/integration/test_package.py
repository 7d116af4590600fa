"""The Debian package (scripts/package.sh, cmake/Package.cmake): built from the build under test,
checked by lintian, installed on this machine with dpkg -i, used from /usr/bin (a kgate serving
a kernel to the installed kgate-mcp), and removed leaving nothing behind.  Then an upgrade from
that package to one of another version, with a live kernel, and back (docs/service.md,
"Upgrading").

It installs into /usr, so it runs only as root, and only where no kgate package is installed
already (it would replace it); both tests are in this one file, so they never run at once."""

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import Kgate, cmdline_of, sweep_supervisors, wait_until
from records_util import agent_execute, agent_run, job_num, wait_job_end
from test_install import cache_value
from test_mcp_semantics import Agent
from test_readopt import kernel_ids

REPO = Path(__file__).resolve().parents[2]
BIN = Path("/usr/bin/kgate")
MCP = Path("/usr/bin/kgate-mcp")
SUPERVISOR = Path("/usr/lib/kgate/kgate-supervise")


def run(argv, timeout=600, check=True, **kw):
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check:
        assert proc.returncode == 0, f"{argv} -> {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return proc


def dpkg_status():
    proc = run(["dpkg-query", "-W", "-f=${Status}", "kgate"], check=False)
    return proc.stdout.strip() if proc.returncode == 0 else "not known to dpkg"


@pytest.fixture(scope="module")
def build(kgate_bin):
    if os.geteuid() != 0:
        pytest.skip("dpkg -i needs root")
    if "install ok installed" in dpkg_status():
        pytest.skip("a kgate package is installed on this machine already: this test would replace it")
    build = Path(os.path.realpath(kgate_bin)).parents[1]
    if not (build / "CPackConfig.cmake").is_file():
        pytest.skip(f"{build} has no CPackConfig.cmake (a sanitizer or fuzz build packs nothing)")
    return build


def package(build, suffix=None):
    """scripts/package.sh (lintian included: it fails on an error or a warning); the .deb."""
    argv = [str(REPO / "scripts/package.sh")]
    if suffix:
        argv += ["--version-suffix", suffix]
    else:
        argv += ["--build", str(build)]
    proc = run(argv, timeout=1200)
    assert not re.search(r"^[EW]: ", proc.stderr, re.M), proc.stderr  # lintian's errors and warnings
    deb = Path(proc.stdout.strip().splitlines()[-1])
    assert deb.is_file() and deb.name.endswith("_amd64.deb"), proc.stdout
    return deb


def field(deb, name):
    return run(["dpkg-deb", "-f", str(deb), name]).stdout.strip()


@pytest.fixture(scope="module")
def release(build):
    return package(build)


@pytest.fixture
def purge():
    """Whatever a test installed is removed after it, passed or not."""
    yield
    if dpkg_status() != "not known to dpkg":
        run(["dpkg", "--purge", "kgate"], check=False)


def install(deb):
    run(["dpkg", "-i", str(deb)], timeout=120)
    assert "install ok installed" in dpkg_status()
    return field(deb, "Version")


def mcp_round_trip(kg, home):
    """An installed kgate-mcp, stdio, against the kgate: a kernel, and a cell run in it."""
    agent = Agent(str(MCP), home, kg.url)
    try:
        agent.ok("connect")
        assert agent.ok("execute", code="6 * 7") == "42"
    finally:
        agent.exit()


def test_the_package_installs_serves_an_agent_and_removes_cleanly(build, release, purge, tmp_path):
    version = cache_value(build, "CMAKE_PROJECT_VERSION") + cache_value(build, "KGATE_VERSION_SUFFIX")
    assert release.name == f"kgate_{version}_amd64.deb"
    assert field(release, "Version") == version
    depends = field(release, "Depends")
    for lib in ("libzmq5", "libssl3", "libstdc++6", "libc6"):  # dpkg-shlibdeps, from the programs' links
        assert lib in depends, depends
    assert "libxml2 (>= 2.9)" in depends, depends  # opened at run time (render.cpp), so named by hand
    assert field(release, "Recommends") == "python3-ipykernel"
    # No maintainer script: installing enables and starts nothing, for any user.
    members = subprocess.run(f"dpkg-deb --ctrl-tarfile {release} | tar -t", shell=True, capture_output=True,
                             text=True, check=True).stdout.split()
    assert sorted(m.lstrip("./") for m in members if m.strip("./")) == ["control", "md5sums"], members

    install(release)
    files = [f for f in run(["dpkg", "-L", "kgate"]).stdout.splitlines() if os.path.isfile(f)]
    for f in (BIN, MCP, SUPERVISOR, "/usr/share/doc/kgate/copyright", "/usr/share/doc/kgate/changelog.gz",
              "/usr/lib/systemd/user/kgate.service", "/usr/lib/systemd/system/kgate@.service"):
        assert str(f) in files, files
    for exe in (BIN, MCP):
        out = run([str(exe), "--version"], timeout=10).stdout
        assert version in out.split(), (exe, out)
    env = {k: v for k, v in os.environ.items() if k != "MANPATH"}
    assert run(["man", "-w", "kgate"], env=env).stdout.strip() == "/usr/share/man/man1/kgate.1.gz"
    unit = Path("/usr/lib/systemd/user/kgate.service").read_text()
    assert "ExecStart=/usr/bin/kgate serve\n" in unit, unit

    # kgate serve from /usr/bin, its kernel under /usr/lib/kgate's supervisor, and the installed
    # kgate-mcp making a round trip through it.
    kg = Kgate(str(BIN), tmp_path / "kg").start()
    try:
        status, _, about = kg.rest("GET", "/api")
        assert status == 200 and about["version"] == version, about
        mcp_round_trip(kg, tmp_path / "agent")
        sups = [p for p in kg.supervised()]
        assert sups and all(os.path.realpath(f"/proc/{p}/exe") == str(SUPERVISOR) for p in sups), \
            ([cmdline_of(p) for p in sups], kg.log_tail())
    finally:
        kg.stop(sig=signal.SIGINT)  # SIGINT: its kernels stop with it

    run(["dpkg", "-r", "kgate"], timeout=120)
    assert dpkg_status() == "not known to dpkg"  # no conffiles: nothing stays in "config-files"
    assert run(["dpkg", "-L", "kgate"], check=False).returncode != 0
    left = [f for f in files if os.path.lexists(f)]
    assert not left, left
    for folder in ("/usr/lib/kgate", "/usr/share/doc/kgate"):
        assert not os.path.exists(folder), folder


def test_an_upgrade_keeps_every_kernel_and_so_does_a_downgrade(build, release, purge, tmp_path):
    a = install(release)
    nxt = package(build, "+next")  # the same tree, version 0.1.0+next
    b = field(nxt, "Version")
    assert run(["dpkg", "--compare-versions", b, "gt", a], check=False).returncode == 0, (a, b)

    root = tmp_path / "kg"
    try:
        upgrade_and_downgrade(root, a, b, release, nxt)
    finally:
        sweep_supervisors(root)  # a failed run leaves no kernel behind (they wait an hour otherwise)


def upgrade_and_downgrade(root, a, b, release, nxt):
    """Version A, started as the unit starts it (`/usr/bin/kgate serve`), with a kernel that has
    state, an old record, and a cell running through the upgrade to B; then back to A."""
    kg = Kgate(str(BIN), root).start()
    kid = kg.start_kernel()["id"]
    first = agent_run(kg, kid, "x = 42\nprint('set')", "agent-1")
    assert first["status"] == "ok", first
    status, running = agent_execute(
        kg, kid, "import time\nfor i in range(16):\n    print(i, flush=True)\n    time.sleep(0.5)\n'done'", "agent-1")
    assert status in (200, 202), running
    kernel_pid = kg.kernel_pid(kid)
    supervisor = next(p for p, kids in kg.supervised().items() if kids and kernel_pid in kids)

    # dpkg replaces the files under the running kgate A; A runs on until systemd restarts it:
    # SIGTERM, which leaves the kernels running, then the new binary on the same state.
    install(nxt)
    assert b in run([str(BIN), "--version"]).stdout
    kg.stop(sweep=False)
    # A's supervisor runs on from A's file, which dpkg replaced.
    assert os.readlink(f"/proc/{supervisor}/exe") == f"{SUPERVISOR} (deleted)", os.readlink(f"/proc/{supervisor}/exe")
    kg2 = Kgate(str(BIN), root).start()
    try:
        assert kg2.rest("GET", "/api")[2]["version"] == b
        assert wait_until(lambda: kernel_ids(kg2).get(kid, {}).get("execution_state") in ("busy", "idle"), 20), \
            kg2.log_tail(40)
        # (The model answers from the kernel table as the re-adoption begins; its log line comes
        # once the kernel answered.)
        assert wait_until(lambda: any("re-adopted" in line for line in kg2.log_lines), 20), kg2.log_tail(40)
        done = wait_job_end(kg2, running["job"], timeout=30)
        assert done["status"] == "ok" and done["result"] == "'done'", done
        assert done["output"].endswith("14\n15\n") and "kgate was away" in done["note"], done
        old = kg2.rest("GET", f"/api/kgate/jobs/{first['job']}")[2]
        assert old["status"] == "ok" and old["output"] == "set\n", old
        after = agent_run(kg2, kid, "x", "agent-1")
        assert after["result"] == "42", after
        assert job_num(after["job"]) > job_num(running["job"]) > job_num(first["job"]), (first, running, after)
        # The same kernel process, under the same (old) supervisor.
        assert str(kernel_pid) in open(f"/proc/{supervisor}/task/{supervisor}/children").read().split()

        # A downgrade is the same move back: B's kernel table and records are read by A.
        install(release)
        kg2.stop(sweep=False)
        kg3 = Kgate(str(BIN), root).start()
        try:
            assert kg3.rest("GET", "/api")[2]["version"] == a
            assert wait_until(lambda: kernel_ids(kg3).get(kid, {}).get("execution_state") == "idle", 20), \
                kg3.log_tail(40)
            again = agent_run(kg3, kid, "x + 1", "agent-1")
            assert again["result"] == "43" and job_num(again["job"]) > job_num(after["job"]), again
        finally:
            kg3.delete_kernel(kid, check=False)
            kg3.stop()
    finally:
        kg2.stop()
