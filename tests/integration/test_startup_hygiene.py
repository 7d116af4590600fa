"""The small ways in of issue 59, each closed at start: `"null"` as open as `"*"`, a --no-token
error that names $KGATE_TOKEN, the token gone from kgate's start-up environment block, a token
file others could read replaced, and a relative runtime dir made absolute."""

import json
import os
import stat
import subprocess

from conftest import Kgate, make_jupyter_env


def serve(kgate_bin, tmp_path, *args, env=None):
    e = make_jupyter_env(tmp_path)
    e.update(env or {})
    return subprocess.run([kgate_bin, "serve", "--port", "0", *args], env=e, capture_output=True, timeout=30,
                          cwd=str(tmp_path))


def test_a_null_origin_needs_a_token(kgate_bin, tmp_path):
    cfg = tmp_path / "kgate.toml"
    cfg.write_text('[server]\nallow_origins = ["http://app.example", "null"]\ntoken = ""\n')
    p = serve(kgate_bin, tmp_path, "--config", str(cfg))
    assert p.returncode == 2, p.stderr
    assert b'refusing allow_origins = ["null"] without a token' in p.stderr and b"sandboxed iframe" in p.stderr


def test_no_token_with_the_variable_set_names_the_variable(kgate_bin, tmp_path):
    p = serve(kgate_bin, tmp_path, "--no-token", env={"KGATE_TOKEN": "abc"})
    assert p.returncode == 2, p.stderr
    assert b"$KGATE_TOKEN is set in the environment" in p.stderr and b"--token" not in p.stderr, p.stderr
    p = serve(kgate_bin, tmp_path, "--no-token", "--token", "abc")
    assert p.returncode == 2 and b"--no-token and --token exclude each other" in p.stderr, p.stderr


def test_the_token_is_not_in_kgates_start_up_environment(kgate_bin, tmp_path):
    secret = "kgate-environ-secret-59"
    kg = Kgate(kgate_bin, tmp_path)
    kg.env["KGATE_TOKEN"] = secret
    kg.token = secret
    kg.start()
    try:
        with open(f"/proc/{kg.proc.pid}/environ", "rb") as f:
            block = f.read()
        assert secret.encode() not in block
        assert kg.rest("GET", "/api/kernels")[0] == 200  # and it is still the token
    finally:
        kg.stop()


def test_a_token_file_others_could_read_is_replaced(kgate_bin, tmp_path):
    first = Kgate(kgate_bin, tmp_path).start()
    old = first.token
    token_file = first.own_token_file
    first.stop()
    os.chmod(token_file, 0o644)
    again = Kgate(kgate_bin, tmp_path).start()
    try:
        assert again.own_token_file == token_file
        assert again.token != old and len(again.token) == 64
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        assert any("was mode 0644, readable by other users: kgate made a new token" in line
                   for line in again.log_lines), again.log_tail()
        assert again.rest("GET", "/api/kernels")[0] == 200
        status, _, _ = again.http("GET", "/api/kernels", headers={"Authorization": f"token {old}"}, auth=False)
        assert status == 401
    finally:
        again.stop()


def test_a_relative_runtime_dir_is_made_absolute(kgate_bin, tmp_path):
    cfg = tmp_path / "kgate.toml"
    cfg.write_text("[pool]\nsize = 0\n")
    kg = Kgate(kgate_bin, tmp_path, config=cfg, extra_args=["--runtime-dir", "rel-runtime"])
    kg.runtime_dir = tmp_path / "rel-runtime"
    kg.start()
    try:
        assert any(f"connection files in {tmp_path}/rel-runtime" in line for line in kg.log_lines), kg.log_tail()
        (tmp_path / "sub").mkdir()
        kid = kg.start_kernel({"path": "sub/x.ipynb"})["id"]  # a kernel whose cwd is not kgate's
        info = json.loads((tmp_path / "rel-runtime" / f"kernel-{kid}.json").read_text())
        assert info["ip"].startswith(str(tmp_path / "rel-runtime") + "/"), info
        with kg.connect(kid) as ws:
            assert ws.run("print(3 * 3)").strip() == "9"
        kg.delete_kernel(kid)
    finally:
        kg.stop()
    assert not any(name.startswith("kernel-") for name in os.listdir("/"))


def test_a_runtime_dir_below_another_users_folder_is_refused(kgate_bin, tmp_path):
    """Issue 59's symlink swap: a folder above the runtime dir that another user owns (or may
    write to) lets them swap the way to it after kgate checked it. kgate does not start there."""
    if os.geteuid() != 0:
        import pytest
        pytest.skip("needs root to chown a folder to another user")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    mine = theirs / "mine"
    mine.mkdir(mode=0o700)  # made by root inside it: kgate's own, but nobody can rename it
    p = serve(kgate_bin, tmp_path, "--runtime-dir", str(mine / "runtime"))
    assert p.returncode != 0, p.stderr
    assert f"its parent folder {theirs} is owned by uid 65534".encode() in p.stderr, p.stderr
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    p = serve(kgate_bin, tmp_path, "--state-dir", str(open_dir / "state"))
    assert p.returncode != 0, p.stderr
    assert f"its parent folder {open_dir} is writable by other users (mode 0777)".encode() in p.stderr, p.stderr
