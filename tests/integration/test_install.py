"""`cmake --install`: the installed layout, and an installed kgate that finds its own
kgate-supervise, serves a kernel under it, and writes a service for itself, where a build
folder's kgate is warned that its service would break.

The build under test is installed with DESTDIR into a temporary folder: nothing on the machine
is touched."""

import os
import subprocess
from pathlib import Path

import pytest

from conftest import Kgate
from test_service import run_kgate, unit_settings


def cache_value(build, key):
    for line in (build / "CMakeCache.txt").read_text().splitlines():
        name, _, value = line.partition("=")
        if name.split(":")[0] == key:
            return value
    raise AssertionError(f"{key} is not in {build}/CMakeCache.txt")


@pytest.fixture(scope="module")
def installed(kgate_bin, tmp_path_factory):
    """(prefix, root): the configured install prefix, and where DESTDIR put it."""
    build = Path(os.path.realpath(kgate_bin)).parents[1]
    if not (build / "CMakeCache.txt").is_file():
        pytest.skip(f"{kgate_bin} is not in a CMake build folder: there is nothing to install")
    dest = tmp_path_factory.mktemp("destdir")
    # A prefix other than the configured one: the units name the prefix of the install itself.
    prefix = "/opt/kgate-test"
    assert prefix != cache_value(build, "CMAKE_INSTALL_PREFIX")
    proc = subprocess.run(["cmake", "--install", str(build), "--prefix", prefix], env=dict(os.environ, DESTDIR=str(dest)),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return prefix, dest / prefix.lstrip("/"), build


def test_the_installed_layout(installed):
    prefix, root, build = installed
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert files == sorted([
        "bin/kgate", "bin/kgate-mcp", "lib/kgate/kgate-supervise",
        "lib/systemd/user/kgate.service", "lib/systemd/system/kgate@.service",
        "share/doc/kgate/examples/kgate.toml", "share/doc/kgate/examples/gateways.toml",
        "share/doc/kgate/examples/startup.py", "share/doc/kgate/examples/inspectors.py",
        "share/man/man1/kgate.1.gz", "share/man/man1/kgate-mcp.1.gz", "share/man/man5/kgate.toml.5.gz",
        "share/doc/kgate/copyright", "share/doc/kgate/changelog.gz",
    ]), files
    for exe in ("bin/kgate", "bin/kgate-mcp", "lib/kgate/kgate-supervise"):
        assert os.access(root / exe, os.X_OK), exe
    version = cache_value(build, "CMAKE_PROJECT_VERSION") + cache_value(build, "KGATE_VERSION_SUFFIX")
    for exe in ("bin/kgate", "bin/kgate-mcp"):
        out = subprocess.run([str(root / exe), "--version"], capture_output=True, text=True, timeout=10)
        assert out.returncode == 0 and version in out.stdout, (exe, out.stdout, out.stderr)

    user = (root / "lib/systemd/user/kgate.service").read_text()
    system = (root / "lib/systemd/system/kgate@.service").read_text()
    for text in (user, system):
        assert "@" not in text.replace("kgate@.service", ""), text  # every field filled in
        s = unit_settings(text)
        assert s["ExecStart"] == [f"{prefix}/bin/kgate serve"], s
        assert s["Type"] == ["notify"] and s["KillMode"] == ["process"], s
        assert s["Documentation"] == ["man:kgate(1) man:kgate.toml(5)"], s
    u, t = unit_settings(user), unit_settings(system)
    assert u["WantedBy"] == ["default.target"] and "User" not in u, u
    assert u["EnvironmentFile"] == ["-%h/.config/kgate/kgate.env"], u
    assert t["WantedBy"] == ["multi-user.target"] and t["User"] == ["%i"], t
    assert t["EnvironmentFile"] == ["-/etc/kgate/%i.env"], t
    assert t["ProtectSystem"] == ["full"], t


def test_the_man_pages_say_what_the_programs_and_the_sample_config_say(installed):
    prefix, root, build = installed
    env = dict(os.environ, MANPATH=str(root / "share/man"), MANWIDTH="200", MAN_KEEP_FORMATTING="")

    def page(name):
        where = subprocess.run(["man", "-w", name], env=env, capture_output=True, text=True, timeout=30)
        assert where.returncode == 0 and where.stdout.startswith(str(root)), (name, where.stdout, where.stderr)
        out = subprocess.run(["man", where.stdout.strip()], env=env, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and not out.stderr, (name, out.stderr)  # no roff warning
        return out.stdout

    kgate = page("kgate")
    # Every subcommand's own --help is a section, each option as the program prints it.
    for sub in ("serve", "install-service", "stop", "proxy-kernel"):
        assert f"kgate {sub}" in kgate, sub
    serve_help = subprocess.run([str(root / "bin/kgate"), "serve", "--help"], capture_output=True, text=True).stdout
    for line in serve_help.splitlines():
        if line.strip().startswith("--"):
            assert line.strip().split()[0] in kgate, line
    assert "kgate-mcp(1)" in kgate and "kgate.toml(5)" in kgate
    assert "--log-level" in page("kgate-mcp")
    toml = page("kgate.toml")
    sample = (Path(__file__).resolve().parents[2] / "config/kgate.toml").read_text()
    for key in ("[server]", "ip = \"127.0.0.1\"", "port = 8787"):
        assert key in sample and key in toml, key


def test_an_installed_kgate_runs_kernels_under_its_own_supervisor(installed, tmp_path):
    prefix, root, build = installed
    kg = Kgate(str(root / "bin/kgate"), tmp_path / "kg").start()
    try:
        kid = kg.start_kernel()["id"]
        supervisor = root / "lib/kgate/kgate-supervise"
        exes = {os.path.realpath(f"/proc/{pid}/exe") for pid in kg.supervised()}  # kgate's children
        assert str(supervisor.resolve()) in exes, (exes, kg.log_tail())
        assert not any("kgate-supervise is not beside" in line for line in kg.log_lines), kg.log_tail()
        kg.delete_kernel(kid)
    finally:
        kg.stop()


def test_install_service_names_the_installed_kgate_and_warns_for_a_build_folder(installed, kgate_bin, tmp_path):
    prefix, root, build = installed
    proc = run_kgate(str(root / "bin/kgate"), ["install-service", "--user", "--dry-run"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert unit_settings(proc.stdout)["ExecStart"] == [f"{root}/bin/kgate serve"], proc.stdout
    assert unit_settings(proc.stdout)["Documentation"] == ["man:kgate(1) man:kgate.toml(5)"], proc.stdout
    assert "build folder" not in proc.stderr, proc.stderr

    proc = run_kgate(kgate_bin, ["install-service", "--user", "--dry-run"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "is a build folder's binary" in proc.stderr and "cmake --install" in proc.stderr, proc.stderr
    assert "Documentation" not in unit_settings(proc.stdout), proc.stdout  # no man page to name
