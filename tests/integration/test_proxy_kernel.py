"""`kgate proxy-kernel` and `kgate install-kernelspec`: a notebook's kernel (started by a stock
jupyter_client KernelManager from the installed kernelspec) that attaches to the agent's kgate
kernel over kgate's websocket API (docs/jupyter.md "Notebooks and JupyterLab on kgate's kernels")."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from jupyter_client import KernelManager
from jupyter_client.connect import write_connection_file

from conftest import Kgate, free_port, pid_alive, wait_until
from records_util import list_jobs
from test_mcp_transcript import Mcp, owner_token_env

REPO = Path(__file__).resolve().parents[2]
CELL = "x = 41 + 1\nprint('hello from the notebook', x)"


@pytest.fixture(scope="module")
def mcp_binary(kgate_bin):
    binary = os.environ.get("KGATE_MCP_BIN") or str(Path(kgate_bin).resolve().parents[1] / "translator" / "kgate-mcp")
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        pytest.fail(f"kgate-mcp not found at {binary}: build it, or set KGATE_MCP_BIN", pytrace=False)
    return binary


@pytest.fixture
def spec_env(kgate_bin, tmp_path, monkeypatch):
    """Installs the proxy kernelspec under tmp_path/prefix and points jupyter_client at it.
    Returns a function that sets the gateway URL the proxies it starts will use."""
    prefix = tmp_path / "prefix"
    out = subprocess.run([kgate_bin, "install-kernelspec", "--prefix", str(prefix)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    spec_dir = prefix / "share" / "jupyter" / "kernels" / "kgate"
    assert str(spec_dir) in out.stdout, out.stdout
    spec = json.loads((spec_dir / "kernel.json").read_text())
    assert spec["argv"] == [kgate_bin, "proxy-kernel", "-f", "{connection_file}"], spec
    assert spec["interrupt_mode"] == "message" and spec["language"] == "python", spec
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))  # no gateways.toml of the user's
    monkeypatch.delenv("KGATE_TOKEN", raising=False)
    monkeypatch.delenv("KGATE_PROXY_KERNEL", raising=False)

    def use(url, state_home=None):
        """The proxy's gateway; it finds the token of the test's kgate at that URL as the owner's
        tools do, in the XDG_STATE_HOME that kgate keeps it under (`state_home` for one that is
        not running yet)."""
        monkeypatch.setenv("KGATE_URL", url)
        found = {"XDG_STATE_HOME": str(state_home)} if state_home else owner_token_env({"KGATE_URL": url})
        for key, value in found.items():
            monkeypatch.setenv(key, value)
    return use


@pytest.fixture
def notebooks():
    """Starts KernelManagers for the kgate spec; shuts down whatever is left at teardown."""
    started = []

    def start():
        km = KernelManager(kernel_name="kgate")
        km.start_kernel()
        kc = km.client()
        kc.start_channels()
        started.append((km, kc))
        try:
            kc.wait_for_ready(timeout=60)
        except RuntimeError as exc:
            pytest.fail(f"the proxy kernel did not answer kernel_info: {exc}")
        return km, kc

    yield start
    for km, kc in started:
        kc.stop_channels()
        if km.has_kernel:
            km.shutdown_kernel(now=True)


def run_cell(kc, code, timeout=60, **kw):
    """execute_interactive; returns (reply content, stdout text, iopub messages)."""
    seen = []
    reply = kc.execute_interactive(code, output_hook=seen.append, timeout=timeout, **kw)
    stdout = "".join(m["content"]["text"] for m in seen
                     if m["msg_type"] == "stream" and m["content"]["name"] == "stdout")
    return reply, stdout, seen


def mcp_call(p, id_, name, timeout=90, **args):
    p.send({"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": {"name": name, "arguments": args}})
    r = p.reply(id_, timeout=timeout)
    assert "result" in r, r
    return "\n".join(b.get("text", "") for b in r["result"]["content"])


def start_agent(binary, kg, home):
    p = Mcp(binary, home, {"KGATE_URL": kg.url})
    p.send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "proxy-test", "version": "1"}}})
    p.reply(0, timeout=30)
    p.notify("notifications/initialized")
    return p


def delete_all_kernels(kg):
    for k in kg.rest("GET", "/api/kernels")[2] or []:
        kg.delete_kernel(k["id"], check=False)


def claimed_kernel(kg):
    kernels = kg.rest("GET", "/api/kgate/kernels")[2]
    live = [k["id"] for k in kernels if (k.get("claim") or {}).get("alive")]
    return live[0] if len(live) == 1 else None


def test_notebook_attaches_to_the_agents_kernel(kgate, spec_env, notebooks, mcp_binary, tmp_path):
    kg = kgate
    spec_env(kg.url)
    agent = start_agent(mcp_binary, kg, tmp_path / "agent")
    try:
        text = mcp_call(agent, 1, "connect")
        assert "kernel" in text, text
        mcp_call(agent, 2, "execute", code="y = 'agent'")
        kid = wait_until(lambda: claimed_kernel(kg), 10)
        assert kid, f"no kernel has a live agent claim: {kg.rest('GET', '/api/kgate/kernels')[2]}"
        # A newer kernel that nobody claims: the proxy must still pick the agent's.
        other = kg.start_kernel()["id"]

        km, kc = notebooks()
        info = kc.kernel_info(reply=True, timeout=30)["content"]
        assert info["status"] == "ok", info
        assert f"attached to kgate kernel {kid}" in info["banner"], info["banner"]
        assert info["language_info"]["name"] == "python", info

        reply, stdout, seen = run_cell(kc, CELL)
        assert reply["content"]["status"] == "ok", reply
        assert stdout == "hello from the notebook 42\n", seen
        # Replies carry the notebook client's own request as their parent.
        assert reply["parent_header"]["session"] == kc.session.session, reply["parent_header"]

        # The agent sees the variable and is told that someone else ran a cell.
        text = mcp_call(agent, 3, "execute", code="x")
        assert text.startswith("42"), text
        assert "run by the user since your last call" in text, text

        # kgate recorded the cell as the notebook's, not the agent's.
        jobs = list_jobs(kg, kid)["jobs"]
        mine = [j for j in jobs if j["code"] == CELL]
        assert len(mine) == 1, jobs
        assert mine[0]["origin"] == "user" and mine[0]["status"] == "ok" and mine[0]["agent"] is None, mine[0]
        assert [j["origin"] for j in jobs if j["code"] == "x"] == ["mcp"], jobs
        assert not [j for j in list_jobs(kg, other)["jobs"]], "a cell went to the unclaimed kernel"

        # Restart from the notebook: only the proxy restarts; it reattaches and still sees x.
        old_pid = km.provisioner.process.pid
        km.restart_kernel(now=False)
        assert not wait_until(lambda: pid_alive(old_pid), 10), "the old proxy did not exit"
        kc.wait_for_ready(timeout=60)
        assert kg.kernel_model(kid)["execution_state"] != "dead"
        reply, stdout, _ = run_cell(kc, "print(x, y)")
        assert reply["content"]["status"] == "ok" and stdout == "42 agent\n", (reply, stdout)

        # Shutdown from the notebook: the proxy exits at once, with status 0; the kernel stays.
        proc = km.provisioner.process
        km.shutdown_kernel(now=False)
        assert proc.poll() == 0, f"the proxy exited with {proc.poll()}"
        assert kg.rest("GET", f"/api/kernels/{kid}")[0] == 200
        assert mcp_call(agent, 4, "execute", code="x + 1").startswith("43")
    finally:
        agent.close(timeout=10)  # EOF: its claim is freed at once
        agent.kill()
        delete_all_kernels(kg)


def test_stdin_and_interrupt_go_through(kgate, spec_env, notebooks):
    kg = kgate
    spec_env(kg.url)
    kid = kg.start_kernel()["id"]  # the only kernel nobody claims: the newest
    try:
        km, kc = notebooks()
        prompts = []

        def answer(msg):
            prompts.append(msg["content"]["prompt"])
            kc.input("through the proxy")

        reply, stdout, _ = run_cell(kc, "name = input('who? ')\nprint('hi', name)", allow_stdin=True,
                                    stdin_hook=answer)
        assert prompts == ["who? "], prompts
        assert reply["content"]["status"] == "ok" and stdout == "hi through the proxy\n", (reply, stdout)

        msg_id = kc.execute("import time\ntime.sleep(30)")
        began = wait_until(lambda: kg.kernel_model(kid)["execution_state"] == "busy", 15)
        assert began, "the sleeping cell did not start"
        time.sleep(0.3)
        t0 = time.monotonic()
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=15)
        assert reply["parent_header"]["msg_id"] == msg_id, reply
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt", reply
        assert time.monotonic() - t0 < 10
        # The proxy answered the interrupt_request (the manager sent it on its own control socket).
        assert km._control_socket.poll(10000), "no interrupt_reply"
        _, ctl = km.session.recv(km._control_socket)
        assert ctl["msg_type"] == "interrupt_reply" and ctl["content"]["status"] == "ok", ctl
    finally:
        delete_all_kernels(kg)


def test_without_kgate_requests_get_errors_and_it_attaches_later(kgate_bin, spec_env, notebooks, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spec_env(url, state_home=tmp_path / "late" / "state")  # the kgate below (and its token) comes later
    km, kc = notebooks()  # wait_for_ready passed: kernel_info is answered without kgate
    info = kc.kernel_info(reply=True, timeout=10)["content"]
    assert info["status"] == "ok" and f"no running kgate at {url}" in info["banner"], info

    reply, _, seen = run_cell(kc, "1 + 1", timeout=15)
    c = reply["content"]
    assert c["status"] == "error" and c["ename"] == "NoKgate" and f"no running kgate at {url}" in c["evalue"], c
    errors = [m for m in seen if m["msg_type"] == "error"]
    assert errors and "no running kgate" in errors[0]["content"]["evalue"], seen
    states = [m["content"]["execution_state"] for m in seen if m["msg_type"] == "status"]
    assert states[:1] == ["busy"] and states[-1:] == ["idle"], states

    # kgate comes up on that port: the proxy attaches by itself, and starts a kernel (there is none).
    kg = Kgate(kgate_bin, tmp_path / "late")
    kg.args[kg.args.index("--port") + 1] = str(port)
    kg.start()
    try:
        def attached():
            r = kc.kernel_info(reply=True, timeout=10)["content"]
            return "attached to kgate kernel" in r["banner"]
        assert wait_until(attached, 30, interval=0.5), "the proxy did not attach once kgate was up"
        reply, stdout, _ = run_cell(kc, "print(6 * 7)")
        assert reply["content"]["status"] == "ok" and stdout == "42\n", reply
        kernels = kg.rest("GET", "/api/kernels")[2]
        assert len(kernels) == 1, kernels
        kg._kernels.add(kernels[0]["id"])
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        kg.cleanup_kernels()
        kg.stop()


def test_signals_and_parent_death_end_the_proxy(kgate_bin, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KGATE_")}
    env["KGATE_URL"] = f"http://127.0.0.1:{free_port()}"
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")

    def connection_file(name):
        path, _ = write_connection_file(str(tmp_path / name), ip="127.0.0.1", key=b"k3y")
        return path

    # SIGTERM: a clean exit, status 0.
    p = subprocess.Popen([kgate_bin, "proxy-kernel", "-f", connection_file("a.json")], env=env,
                         stderr=subprocess.PIPE)
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    assert p.wait(5) == 0, p.stderr.read()
    p.stderr.close()

    # The process that launched it dies: it exits too.  The launcher sets JPY_PARENT_PID as
    # jupyter_client does, which also covers a parent that dies before the proxy is up.
    launcher = subprocess.Popen(
        [sys.executable, "-c", "import os, subprocess, sys, time\n"
         "p = subprocess.Popen(sys.argv[1:], env=dict(os.environ, JPY_PARENT_PID=str(os.getpid())))\n"
         "print(p.pid, flush=True)\ntime.sleep(60)\n",
         kgate_bin, "proxy-kernel", "-f", connection_file("b.json")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    pid = int(launcher.stdout.readline())
    assert pid_alive(pid)
    launcher.kill()
    launcher.wait()
    assert wait_until(lambda: not pid_alive(pid), 5), "the proxy outlived its parent"
    launcher.stdout.close()

    # A connection file that is not there: a clear error, status 2.
    r = subprocess.run([kgate_bin, "proxy-kernel", "-f", str(tmp_path / "missing.json")], env=env,
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "missing.json" in r.stderr, r


def test_install_kernelspec_and_kgate_does_not_launch_it(kgate_bin, tmp_path):
    prefix = tmp_path / "p"
    args = [kgate_bin, "install-kernelspec", "--prefix", str(prefix), "--kernel", "abc123"]
    first = subprocess.run(args, capture_output=True, text=True, timeout=30)
    assert first.returncode == 0, first.stderr
    spec_file = prefix / "share" / "jupyter" / "kernels" / "kgate" / "kernel.json"
    spec = json.loads(spec_file.read_text())
    assert spec["argv"][-2:] == ["--kernel", "abc123"], spec
    assert spec["display_name"] == "kgate (attach to the agent's kernel)", spec

    again = subprocess.run(args, capture_output=True, text=True, timeout=30)
    assert again.returncode == 0 and "already installed" in again.stdout, again

    other = args[:-2] + ["--kernel", "def456"]
    refused = subprocess.run(other, capture_output=True, text=True, timeout=30)
    assert refused.returncode == 1 and "--force" in refused.stderr, refused
    assert json.loads(spec_file.read_text()) == spec, "a refused install changed the spec"
    forced = subprocess.run(other + ["--force"], capture_output=True, text=True, timeout=30)
    assert forced.returncode == 0 and json.loads(spec_file.read_text())["argv"][-1] == "def456", forced

    bad = subprocess.run([kgate_bin, "install-kernelspec", "--prefix", str(prefix), "--name", "no/slash"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "not a kernelspec name" in bad.stderr, bad

    # JUPYTER_DATA_DIR is the default place.
    env = dict(os.environ, JUPYTER_DATA_DIR=str(tmp_path / "data"))
    user = subprocess.run([kgate_bin, "install-kernelspec", "--name", "KG2"], env=env,
                          capture_output=True, text=True, timeout=30)
    assert user.returncode == 0 and (tmp_path / "data" / "kernels" / "kg2" / "kernel.json").is_file(), user

    # kgate's own discovery lists the spec but never offers it as a kernel.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_", "KGATE_"))}
    env.update({"JUPYTER_PATH": str(prefix / "share" / "jupyter"), "JUPYTER_DATA_DIR": str(tmp_path / "d2")})
    cat = subprocess.run([kgate_bin, "kernelspecs", "--json"], env=env, capture_output=True, text=True, timeout=120)
    entries = {e["name"]: e for e in json.loads(cat.stdout)["entries"]}
    assert entries["kgate"]["launchable"] is False and "proxy kernel" in entries["kgate"]["reason"], entries["kgate"]
