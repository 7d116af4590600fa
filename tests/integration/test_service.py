"""kgate install-service / uninstall-service, sd_notify readiness and the journald log format.

Nothing here touches the machine's systemd: the unit goes to a temporary XDG_CONFIG_HOME with
--no-enable, and the readiness test plays systemd's part with an AF_UNIX datagram socket.
"""

import os
import plistlib
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest

from conftest import Kgate, LISTEN_RE


def run_kgate(kgate_bin, args, home, env_extra=None, preexec=None):
    env = {k: v for k, v in os.environ.items()
           if k not in ("XDG_CONFIG_HOME", "NOTIFY_SOCKET", "JOURNAL_STREAM", "SUDO_USER")}
    env.update({"HOME": str(home), "XDG_CONFIG_HOME": str(Path(home) / "cfg")})
    env.update(env_extra or {})
    return subprocess.run([kgate_bin, *args], env=env, capture_output=True, text=True, timeout=30,
                          preexec_fn=preexec)


def unit_path(home):
    return Path(home) / "cfg" / "systemd" / "user" / "kgate.service"


def unit_settings(text):
    """{key: [values]} of a unit file (comments and section headers skipped)."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key, []).append(value)
    return out


def systemd_analyze_verify(path):
    """Errors from `systemd-analyze verify` about our unit, or None when it cannot run here."""
    exe = shutil.which("systemd-analyze")
    if not exe:
        return None
    proc = subprocess.run([exe, "verify", str(path)], capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0 and ("Failed to" in out and str(path) not in out):
        return None  # it could not start at all (no /run/systemd in some sandboxes)
    # Only lines about our file count: the host's other units may have their own complaints.
    mine = [l for l in out.splitlines() if path.name in l or str(path) in l]
    return mine if proc.returncode != 0 or mine else []


def test_install_user_no_enable_writes_unit(kgate_bin, tmp_path):
    proc = run_kgate(kgate_bin, ["install-service", "--user", "--no-enable"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    path = unit_path(tmp_path)
    assert path.is_file()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    text = path.read_text()
    s = unit_settings(text)
    assert s["ExecStart"] == [f"{os.path.realpath(kgate_bin)} serve"]
    assert s["Type"] == ["notify"]
    assert s["Restart"] == ["on-failure"]
    assert s["NoNewPrivileges"] == ["yes"]
    assert s["PrivateTmp"] == ["no"]
    assert s["KillMode"] == ["process"]  # kernels outlive kgate (docs/dev/readoption.md)
    assert s["WantedBy"] == ["default.target"]
    assert s["EnvironmentFile"] == [f"-{tmp_path / 'cfg' / 'kgate' / 'kgate.env'}"]
    assert "User" not in s and "Environment" not in s
    assert "@" not in "".join(l for l in text.splitlines() if not l.startswith("#"))
    assert str(path) in proc.stdout
    assert "systemctl --user daemon-reload" in proc.stdout
    assert "systemctl --user enable --now kgate.service" in proc.stdout


def test_install_with_config_and_odd_paths(kgate_bin, tmp_path):
    cfg = tmp_path / "my conf%1" / "kgate.toml"
    cfg.parent.mkdir()
    cfg.write_text("")
    proc = run_kgate(kgate_bin, ["install-service", "--no-enable", "--config", str(cfg)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    s = unit_settings(unit_path(tmp_path).read_text())
    assert s["ExecStart"] == [f'{os.path.realpath(kgate_bin)} serve --config "{tmp_path}/my conf%%1/kgate.toml"']


def test_systemd_analyze_verify(kgate_bin, tmp_path):
    proc = run_kgate(kgate_bin, ["install-service", "--user", "--no-enable"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    errors = systemd_analyze_verify(unit_path(tmp_path))
    if errors is None:
        pytest.skip("systemd-analyze verify cannot run here")
    assert errors == []
    # The system unit too (printed by --dry-run, which needs no root).
    # (as "daemon": systemd-analyze flags User=nobody itself as unsafe, rightly)
    proc = run_kgate(kgate_bin, ["install-service", "--system", "--dry-run"], tmp_path,
                     {"SUDO_USER": "daemon"})
    assert proc.returncode == 0, proc.stderr
    sysunit = tmp_path / "sys" / "kgate.service"
    sysunit.parent.mkdir()
    sysunit.write_text(proc.stdout)
    assert systemd_analyze_verify(sysunit) == []


def test_system_dry_run_has_user(kgate_bin, tmp_path):
    proc = run_kgate(kgate_bin, ["install-service", "--system", "--dry-run"], tmp_path, {"SUDO_USER": "nobody"})
    assert proc.returncode == 0, proc.stderr
    s = unit_settings(proc.stdout)
    assert s["User"] == ["nobody"]
    assert s["WantedBy"] == ["multi-user.target"]
    assert s["ProtectSystem"] == ["full"]
    assert s["EnvironmentFile"] == [f"-{pwd.getpwnam('nobody').pw_dir}/.config/kgate/kgate.env"]
    assert "/etc/systemd/system/kgate.service" in proc.stderr


def test_install_twice_overwrites_and_uninstall_removes(kgate_bin, tmp_path):
    path = unit_path(tmp_path)
    assert run_kgate(kgate_bin, ["install-service", "--no-enable"], tmp_path).returncode == 0
    path.write_text("stale\n")
    proc = run_kgate(kgate_bin, ["install-service", "--no-enable"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "replaced" in proc.stdout
    assert unit_settings(path.read_text())["Type"] == ["notify"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in path.parent.iterdir()) == ["kgate.service"]  # no temp file left

    proc = run_kgate(kgate_bin, ["uninstall-service", "--user"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not path.exists()
    assert "removed" in proc.stdout
    proc = run_kgate(kgate_bin, ["uninstall-service"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "nothing to remove" in proc.stdout


def test_install_enable_without_systemd_says_what_to_run(kgate_bin, tmp_path):
    if os.path.isdir("/run/systemd/system"):
        pytest.skip("systemd runs here: enabling would touch the real user manager")
    proc = run_kgate(kgate_bin, ["install-service"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert unit_path(tmp_path).is_file()
    assert "systemctl --user enable --now kgate.service" in proc.stdout


def test_system_as_non_root_is_a_clear_error(kgate_bin, tmp_path):
    setpriv = shutil.which("setpriv")
    if os.geteuid() == 0:
        if not setpriv:
            pytest.skip("running as root and setpriv is missing")
        cmd = [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups", kgate_bin]
    else:
        cmd = [kgate_bin]
    for verb in ("install-service", "uninstall-service"):
        proc = subprocess.run([*cmd, verb, "--system"], capture_output=True, text=True, timeout=30,
                              env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        assert proc.returncode == 1, (proc.stdout, proc.stderr)
        assert "needs root" in proc.stderr and "sudo" in proc.stderr, proc.stderr
        assert "/etc/systemd/system/kgate.service" in proc.stderr


def test_launchd_plist_dry_run(kgate_bin, tmp_path):
    cfg = tmp_path / "a&b" / "kgate.toml"
    proc = run_kgate(kgate_bin, ["install-service", "--dry-run", "--launchd", "--config", str(cfg)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    plist = plistlib.loads(proc.stdout.encode())
    assert plist["Label"] == "org.kgate.kgate"
    assert plist["ProgramArguments"] == [os.path.realpath(kgate_bin), "serve", "--config", str(cfg)]
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["RunAtLoad"] is True
    assert plist["StandardErrorPath"] == str(tmp_path / "Library" / "Logs" / "kgate.log")
    assert plist["WorkingDirectory"] == str(tmp_path)
    assert "Library/LaunchAgents/org.kgate.kgate.plist" in proc.stderr
    assert not (tmp_path / "Library").exists()
    if not hasattr(os, "uname") or os.uname().sysname != "Darwin":
        proc = run_kgate(kgate_bin, ["install-service", "--launchd"], tmp_path)
        assert proc.returncode == 1 and "--dry-run" in proc.stderr


# ---- readiness and logs ---------------------------------------------------------------------

def test_sd_notify_ready_after_listening_and_stopping(kgate_bin, tmp_path):
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(15)
    try:
        daemon = Kgate(kgate_bin, tmp_path)
        daemon.env["NOTIFY_SOCKET"] = str(sock_path)
        daemon.start()
        listened_at = time.monotonic()
        msg = sock.recv(4096).decode()
        fields = dict(l.split("=", 1) for l in msg.splitlines())
        assert fields["READY"] == "1", msg
        assert fields["STATUS"] == f"listening on http://127.0.0.1:{daemon.port}/", msg
        assert time.monotonic() >= listened_at
        daemon.proc.send_signal(signal.SIGTERM)
        msg = sock.recv(4096).decode()
        fields = dict(l.split("=", 1) for l in msg.splitlines())
        assert fields["STOPPING"] == "1", msg
        assert daemon.proc.wait(timeout=15) == 0
    finally:
        sock.close()


def _serve_with_stderr_pipe(kgate_bin, tmp_path, journal_stream):
    """Runs serve with stderr on a pipe; JOURNAL_STREAM is the pipe's dev:ino (or `journal_stream`)."""
    r, w = os.pipe()
    st = os.fstat(w)
    daemon = Kgate(kgate_bin, tmp_path)
    env = dict(daemon.env)
    env["JOURNAL_STREAM"] = journal_stream or f"{st.st_dev}:{st.st_ino}"
    proc = subprocess.Popen([*daemon.args, "--log-level", "debug"], env=env, cwd=str(tmp_path),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=w)
    os.close(w)
    lines = []
    try:
        with os.fdopen(r, "r", errors="replace") as f:
            deadline = time.monotonic() + 15
            for line in f:
                lines.append(line.rstrip("\n"))
                if LISTEN_RE.search(line):
                    proc.send_signal(signal.SIGTERM)
                if time.monotonic() > deadline:
                    break
        proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return lines


def test_journal_stream_log_format(kgate_bin, tmp_path):
    lines = _serve_with_stderr_pipe(kgate_bin, tmp_path, None)
    assert any(LISTEN_RE.search(l) for l in lines), lines
    for l in lines:
        assert l[:3] in ("<7>", "<6>", "<4>", "<3>", "<2>"), lines
    listen = next(l for l in lines if LISTEN_RE.search(l))
    assert listen.startswith("<6>info kgate "), listen  # no timestamp: journald adds it
    assert any(l.startswith("<6>info ") and "shutting down" in l for l in lines), lines


def test_inherited_journal_stream_is_ignored(kgate_bin, tmp_path):
    # JOURNAL_STREAM naming some other file (stderr was redirected): the usual timestamped lines.
    lines = _serve_with_stderr_pipe(kgate_bin, tmp_path, "1:1")
    listen = next(l for l in lines if LISTEN_RE.search(l))
    assert not listen.startswith("<"), listen
    assert listen[:4].isdigit(), listen
