"""kgate-mcp end to end, driven by the official MCP TypeScript SDK client (tests/e2e/e2e.mjs).

One kgate with a token serves every scenario; each scenario is its own conversation (its own
kgate-mcp process) with an isolated XDG_CONFIG_HOME.  Needs node (/usr/bin/node) and
tests/e2e/node_modules (`npm ci` in tests/e2e; scripts/bootstrap.sh does it).

kgate-mcp is $KGATE_MCP_BIN, else the kgate-mcp beside $KGATE_BIN's build tree
(<build>/translator/kgate-mcp for <build>/gateway/kgate).
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import _module_daemon, wait_until

REPO = Path(__file__).resolve().parents[2]
E2E_DIR = REPO / "tests" / "e2e"
E2E_SCRIPT = E2E_DIR / "e2e.mjs"
TOKEN = "kgate-e2e-token-9f3c1d"
SCENARIOS = ["connect", "matplotlib", "error", "long", "cancel", "foreign", "inspectors",
             "inspectors_broken", "display_outputs", "inline_images", "notebook_session",
             "notebook_lifecycle", "tasks", "input", "input_unsupported"]
SCENARIO_TIMEOUT = 170  # seconds; the suite's per-test limit is 180

STARTUP_PY = '''\
# the e2e test's startup.py: its output is the connect reply's banner
import os as _e2e_os
print("kgate-e2e-startup ran from", _e2e_os.path.basename(__file__))
'''


def node_bin():
    return shutil.which("node") or ("/usr/bin/node" if os.path.exists("/usr/bin/node") else None)


@pytest.fixture(scope="module")
def mcp_bin(kgate_bin):
    binary = os.environ.get("KGATE_MCP_BIN")
    if not binary:
        binary = str(Path(kgate_bin).resolve().parents[1] / "translator" / "kgate-mcp")
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        pytest.fail(f"kgate-mcp not found at {binary}: build the kgate-mcp target, or set "
                    "KGATE_MCP_BIN", pytrace=False)
    return binary


@pytest.fixture(scope="module")
def node():
    exe = node_bin()
    if exe is None:
        pytest.skip("node is not installed (apt-get install nodejs npm)")
    if not (E2E_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        pytest.skip(f"{E2E_DIR}/node_modules is missing: run `npm ci` in {E2E_DIR} "
                    "(scripts/bootstrap.sh does)")
    return exe


@pytest.fixture(scope="module")
def kgate_token(kgate_bin, tmp_path_factory):
    """A module daemon with a token: kgate-mcp gets it through KGATE_TOKEN only."""
    yield from _module_daemon(kgate_bin, tmp_path_factory, token=TOKEN)


# Over kgate's own /mcp (Streamable HTTP): the scenarios that need no kgate-mcp config of their
# own (the inspectors' come from the conversation's config dir, which /mcp does not have).
HTTP_SCENARIOS = ["connect", "matplotlib", "error", "long", "cancel", "foreign", "display_outputs",
                  "inline_images", "notebook_session", "tasks", "input", "input_unsupported"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_mcp_e2e(scenario, node, mcp_bin, kgate_token, tmp_path):
    run_scenario(scenario, "stdio", node, mcp_bin, kgate_token, tmp_path)


@pytest.mark.parametrize("scenario", HTTP_SCENARIOS)
def test_mcp_http_e2e(scenario, node, mcp_bin, kgate_token, tmp_path):
    """The same scenarios through kgate's /mcp with the SDK's StreamableHTTPClientTransport."""
    run_scenario(scenario, "http", node, mcp_bin, kgate_token, tmp_path)


def run_scenario(scenario, transport, node, mcp_bin, kgate_token, tmp_path):
    kg = kgate_token
    xdg = tmp_path / "xdg"
    (xdg / "kgate").mkdir(parents=True)
    (xdg / "kgate" / "startup.py").write_text(STARTUP_PY)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KGATE_", "XDG_CONFIG"))}
    env.update({
        "KGATE_MCP_BIN": mcp_bin,
        "KGATE_URL": kg.url,
        "KGATE_TOKEN": TOKEN,
        "XDG_CONFIG_HOME": str(xdg),
        "KGATE_E2E_RUNTIME_DIR": str(kg.runtime_dir),
        "KGATE_E2E_TRANSPORT": transport,
    })
    try:
        proc = subprocess.run([node, str(E2E_SCRIPT), scenario], cwd=str(E2E_DIR), env=env,
                              capture_output=True, text=True, timeout=SCENARIO_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"e2e.mjs {scenario} did not finish within {SCENARIO_TIMEOUT}s\n"
                    f"stdout: {exc.stdout}\nstderr: {exc.stderr}\n{kg.log_tail(40)}")
    reports = []
    for line in proc.stdout.splitlines():
        try:
            reports.append(json.loads(line))
        except ValueError:
            pass
    detail = (f"exit {proc.returncode}\nstdout:\n{proc.stdout[-6000:]}\n"
              f"stderr:\n{proc.stderr[-3000:]}\n{kg.log_tail(40)}")
    assert len(reports) == 1 and reports[0].get("scenario") == scenario, detail
    report = reports[0]
    assert report["ok"] and proc.returncode == 0, (
        f"{scenario}: {report.get('error')}\n"
        + json.dumps(report, indent=1)[:8000] + "\n" + kg.log_tail(40))
    # Every scenario stops the kernels it made (and a broken inspectors.py stops its own):
    # nothing is left on the gateway.
    left = wait_until(lambda: not kg.rest("GET", "/api/kernels")[2], 10)
    assert left, f"kernels left on the gateway after {scenario}: {kg.rest('GET', '/api/kernels')[2]}"
    # the token never went into kgate-mcp's log or a reply
    assert TOKEN not in json.dumps(report)


def test_eof_while_connect_runs_startup(mcp_bin, kgate_token, tmp_path):
    """The conversation ends while connect is still running a slow startup.py: kgate-mcp exits
    within its EOF grace (it does not wait for the setup), and the kernel it made is stopped,
    not left on the gateway."""
    from test_mcp_transcript import Mcp

    kg = kgate_token
    home = tmp_path / "home"
    (home / "config" / "kgate").mkdir(parents=True)
    (home / "config" / "kgate" / "startup.py").write_text("import time\ntime.sleep(120)\n")
    p = Mcp(mcp_bin, home, {"KGATE_URL": kg.url, "KGATE_TOKEN": TOKEN})
    try:
        p.request(1, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                    "clientInfo": {"name": "eof-test", "version": "1"}})
        p.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "connect", "arguments": {}}})
        made = wait_until(lambda: kg.rest("GET", "/api/kernels")[2], 60)
        assert made, "connect made no kernel\n" + p.stderr_text()
        busy = wait_until(lambda: any(k.get("execution_state") == "busy"
                                      for k in kg.rest("GET", "/api/kernels")[2]), 60)
        assert busy, "startup.py did not start running\n" + p.stderr_text()
        rc, took = p.close(timeout=30)
        assert rc == 0, p.stderr_text()
        assert took < 10, f"kgate-mcp took {took:.1f} s to exit after EOF\n{p.stderr_text()}"
        gone = wait_until(lambda: not kg.rest("GET", "/api/kernels")[2], 15)
        assert gone, f"the kernel was left on the gateway: {kg.rest('GET', '/api/kernels')[2]}"
        assert TOKEN not in p.stderr_text()
    finally:
        p.kill()
