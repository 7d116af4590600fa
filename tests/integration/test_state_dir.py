"""kgate's state directory (docs/dev/kernel-lifecycle.md): $XDG_STATE_HOME/kgate by default, --state-dir or
state_dir in kgate.toml; created 0700 and held by one kgate at a time."""
import os
import stat
import subprocess

from conftest import Kgate, make_jupyter_env


def serve_refused(kgate_bin, root, *args, env=None, timeout=30):
    env = env or make_jupyter_env(root)
    p = subprocess.run([kgate_bin, "serve", "--port", "0", *args], env=env, cwd=str(root),
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    return p.returncode, p.stderr.decode(errors="replace")


def test_default_is_xdg_state_home_and_private(kgate_factory):
    kg = kgate_factory()
    state = kg.root / "state" / "kgate"   # XDG_STATE_HOME is root/state (make_jupyter_env)
    assert any(f"state in {state}" in line for line in kg.log_lines), kg.log_tail()
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
    lock = state / "kgate.lock"
    assert stat.S_IMODE(os.stat(lock).st_mode) == 0o600
    assert lock.read_text() == f"{kg.proc.pid}\n"


def test_a_second_kgate_on_the_same_state_dir_is_refused(kgate_factory, kgate_bin, tmp_path):
    kg = kgate_factory()
    env = make_jupyter_env(tmp_path)                       # its own runtime dir and port ...
    env["XDG_STATE_HOME"] = str(kg.root / "state")         # ... but the first one's state
    rc, err = serve_refused(kgate_bin, tmp_path, env=env)
    assert rc == 1, err
    state = kg.root / "state" / "kgate"
    assert f"state directory {state}: another kgate (pid {kg.proc.pid}) is using it" in err, err
    assert "--state-dir" in err, err
    assert "listening on" not in err, err
    # The first one serves on, its lock file unchanged.
    assert kg.rest("GET", "/api")[0] == 200
    assert (state / "kgate.lock").read_text() == f"{kg.proc.pid}\n"


def test_state_dir_from_the_command_line_and_from_kgate_toml(kgate_bin, tmp_path):
    flag_dir = tmp_path / "by-flag"
    kg = Kgate(kgate_bin, tmp_path / "a", extra_args=["--state-dir", str(flag_dir)]).start()
    try:
        assert (flag_dir / "kgate.lock").read_text() == f"{kg.proc.pid}\n"
        assert not (kg.root / "state" / "kgate").exists()
        # kgate.toml names the same directory: refused while the first holds it
        (tmp_path / "b").mkdir()
        cfg = tmp_path / "b" / "kgate.toml"
        cfg.write_text(f'[server]\nstate_dir = "{flag_dir}"\n')
        rc, err = serve_refused(kgate_bin, tmp_path / "b", "--config", str(cfg))
        assert rc == 1 and f"another kgate (pid {kg.proc.pid})" in err, err
    finally:
        kg.stop()
    # Once the holder is gone (its lock went with it), the next kgate takes the directory.
    kg2 = Kgate(kgate_bin, tmp_path / "c", extra_args=["--state-dir", str(flag_dir)]).start()
    try:
        assert (flag_dir / "kgate.lock").read_text() == f"{kg2.proc.pid}\n"
    finally:
        kg2.stop()


def test_a_killed_kgate_leaves_no_lock_behind(kgate_bin, tmp_path):
    kg = Kgate(kgate_bin, tmp_path / "a").start()
    kg.proc.kill()
    kg.proc.wait()
    kg2 = Kgate(kgate_bin, tmp_path / "a").start()   # the same root: the same state directory
    try:
        assert (kg2.root / "state" / "kgate" / "kgate.lock").read_text() == f"{kg2.proc.pid}\n"
    finally:
        kg2.stop()


def test_bad_state_dirs_are_refused_with_the_reason(kgate_bin, tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    rc, err = serve_refused(kgate_bin, tmp_path, "--state-dir", str(not_a_dir))
    assert rc == 1 and f"state directory {not_a_dir}: not a directory" in err, err
    cfg = tmp_path / "kgate.toml"
    cfg.write_text('[server]\nstate_dir = ""\n')
    rc, err = serve_refused(kgate_bin, tmp_path, "--config", str(cfg))
    assert rc == 2 and "server.state_dir: must not be empty" in err, err
