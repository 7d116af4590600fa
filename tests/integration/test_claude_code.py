"""The real Claude Code CLI (2.1.332, pinned in tests/claude) drives kgate-mcp (issue 43, point 8),
with a local stand-in for the model's API (claude_code.py). Each scenario asserts what the model
receives, and what went over the wire between Claude Code and kgate-mcp."""

import json
import os
import re
import subprocess
import time

import pytest

from claude_code import (CLAUDE, REPO, Interactive, StandIn, claude_env, http_config, protocol_log, result_text,
                         run_print, stdio_config)
from conftest import wait_until
from test_mcp_transcript import mcp_bin, owner_token_env  # noqa: F401 (mcp_bin is a fixture)

pytestmark = [
    pytest.mark.skipif(not CLAUDE.exists(), reason="tests/claude/node_modules is missing: "
                       "run scripts/bootstrap.sh (npm ci there)"),
    # The client is the point here; kgate's side of each path runs sanitized in test_mcp_mrtr.py,
    # test_mcp_tasks_ext.py and test_mcp_http.py. Once, in the plain stage, is enough (CI time).
    pytest.mark.skipif(os.environ.get("KGATE_SANITIZED") == "1", reason="run in the plain stage only"),
]

PLOT = ("import io\nimport matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "from IPython.display import Image, display\n"
        "fig = plt.figure(figsize=(2, 2)); plt.plot([1, 2, 3]); buf = io.BytesIO()\n"
        "fig.savefig(buf, format='png'); plt.close(fig); display(Image(buf.getvalue()))\n"
        "print('hello')\n6 * 7")


def kernel_ids(kg):
    status, _, body = kg.rest("GET", "/api/kernels")
    assert status == 200, body
    return {k["id"] for k in body}


@pytest.fixture
def standin():
    s = StandIn([])
    yield s
    s.close()


def test_print_mode_execute_error_and_the_end_of_the_conversation(kgate, mcp_bin, tmp_path, standin):  # noqa: F811
    """`claude -p`: the 2026-07-28 era over stdio; an execute with stdout, a result and an image;
    an error; input() answered by a retry (-p mode cancels the form); no auto kernel left."""
    standin.script = [
        ("execute", {"code": PLOT}),
        ("execute", {"code": "1 / 0"}),
        ("execute", {"code": "name = input('name? ')\nprint('hi', name)"}),
    ]
    log = tmp_path / "rpc.log"
    env = {"KGATE_URL": kgate.url}
    cfg = stdio_config(tmp_path / "mcp.json", mcp_bin, {**env, **owner_token_env(env)}, log)
    before = kernel_ids(kgate)
    run = run_print(cfg, tmp_path / "home", standin, tmp_path)
    ended = time.monotonic()
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    assert [r[0] for r in standin.results] == ["execute"] * 3, (standin.results, run.stdout[-3000:])

    # 1. stdout, the result and the image, as the model gets them.
    plot = standin.results[0][2]
    assert not plot.get("is_error"), plot
    kinds = [b["type"] for b in plot["content"]]
    assert "image" in kinds, json.dumps(plot)[:3000]
    text = result_text(plot)
    assert "hello\n" in text and "42" in text, text
    # 2. The error, flattened into one string by Claude Code.
    err = standin.results[1][2]
    assert err.get("is_error") and "ZeroDivisionError" in result_text(err), err
    # 3. input(): -p mode declines forms; the cell was interrupted and the model is told.
    asked = standin.results[2][2]
    assert "input() prompt" in result_text(asked) and "interrupted" in result_text(asked), asked

    rpc = protocol_log(log)
    sent = [m for d, m in rpc if d == ">" and isinstance(m, dict)]
    assert sent[0]["method"] == "server/discover", sent[0]
    assert not any(m.get("method") == "initialize" for m in sent), "Claude Code fell back to initialize"
    meta = sent[0]["params"]["_meta"]
    assert meta["io.modelcontextprotocol/protocolVersion"] == "2026-07-28", meta
    # The input() call went input_required, and Claude Code retried it with an answer.
    got = [m for d, m in rpc if d == "<" and isinstance(m, dict) and isinstance(m.get("result"), dict)]
    assert any(m["result"].get("resultType") == "input_required" for m in got), got
    retries = [m for m in sent if m.get("method") == "tools/call" and "requestState" in m.get("params", {})]
    assert len(retries) == 1 and retries[0]["params"]["inputResponses"], retries
    print("input() retry carried:", retries[0]["params"]["inputResponses"])

    # The end: Claude Code ends kgate-mcp with a signal; no auto kernel of its own is left.
    assert any(d == "!" and m in ("SIGINT", "SIGTERM", "EOF") for d, m in rpc), rpc[-5:]
    mine = kernel_ids(kgate) - before
    while mine and time.monotonic() - ended < 3:
        time.sleep(0.2)
        mine = kernel_ids(kgate) - before
    assert not mine, f"the conversation's auto kernel outlived it: {mine}"


def test_print_mode_background_task_followed_to_its_end(kgate, mcp_bin, tmp_path, standin):  # noqa: F811
    """A background task stays running until it really ends (issue 43, point 6): execute is
    refused meanwhile, and poll_job follows it to its last line."""
    loop = "import time\nfor i in range(8):\n    print('tick', i, flush=True)\n    time.sleep(1)"

    def job_of(results):
        import re
        return {"job": re.search(r"job-\d+", result_text(results[0][2])).group(0), "wait": 30}

    standin.script = [("execute", {"code": loop, "background": True}),
                      ("execute", {"code": "1 + 1"}),
                      ("poll_job", job_of)]
    env = {"KGATE_URL": kgate.url}
    cfg = stdio_config(tmp_path / "mcp.json", mcp_bin, {**env, **owner_token_env(env)}, tmp_path / "rpc.log")
    run = run_print(cfg, tmp_path / "home", standin, tmp_path)
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    started, refused, polled = (result_text(r[2]) for r in standin.results)
    assert "runs in the background" in started, started
    assert "background task" in refused and "refused" in refused, refused
    assert "tick 7" in polled and ": ok" in polled, polled


@pytest.fixture
def own_kgate(kgate_factory):
    return kgate_factory()


def interactive(kg, mcp_bin, tmp_path, standin):  # noqa: F811
    env = {"KGATE_URL": kg.url}
    log = tmp_path / "rpc.log"
    cfg = stdio_config(tmp_path / "mcp.json", mcp_bin, {**env, **owner_token_env(env)}, log)
    ui = Interactive(cfg, tmp_path / "home", standin, tmp_path)
    assert ui.wait_screen(lambda s: "bypass permissions on" in s, 60), ui.screen()
    ui.type("go")
    ui.keys("Enter")
    return ui, log


def test_interactive_a_long_cell_runs_as_a_task(own_kgate, mcp_bin, tmp_path, standin):  # noqa: F811
    """Interactive Claude Code declares the tasks extension: a cell over 5 s becomes a task,
    which Claude Code moves to the background, polls, and reports to the model when it ends."""
    code = "import time\nfor i in range(8):\n    time.sleep(1)\nprint('slept', 8)"
    standin.script = [("execute", {"code": code})]
    ui, log = interactive(own_kgate, mcp_bin, tmp_path, standin)
    try:
        assert wait_until(lambda: standin.results, 60), ui.screen()
        first = result_text(standin.results[0][2])
        assert "started server-side task" in first, first
        # Its end reaches the model as a task notification, with the cell's output.
        assert wait_until(lambda: standin.saw("slept 8") and standin.saw("<status>completed</status>"), 60), \
            ui.screen()
        rpc = protocol_log(log)
        answers = [m["result"] for d, m in rpc if d == "<" and isinstance(m, dict) and isinstance(m.get("result"), dict)]
        assert any(a.get("resultType") == "task" for a in answers), answers
        done = [a for a in answers if a.get("status") == "completed"]
        assert done and any("slept 8" in b.get("text", "") for b in done[0]["result"]["content"]), done
        caps = next(m for d, m in rpc if d == ">" and isinstance(m, dict) and m.get("method") == "tools/call")
        assert "io.modelcontextprotocol/tasks" in \
            caps["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]["extensions"], caps
    finally:
        ui.close()


def test_interactive_input_is_answered_through_the_form(own_kgate, mcp_bin, tmp_path, standin):  # noqa: F811
    code = "name = input('name? ')\nprint('hi', name)"
    standin.script = [("execute", {"code": code})]
    ui, log = interactive(own_kgate, mcp_bin, tmp_path, standin)
    try:
        assert ui.wait_screen(lambda s: "The running cell asks for input: name?" in s, 60), ui.screen()
        time.sleep(1)
        ui.type("Ada")
        assert ui.wait_screen(lambda s: "Ada" in s, 10), ui.screen()
        ui.keys("Enter")  # the field is filled in; then Accept
        assert ui.wait_screen(lambda s: '✔ "name? ": Ada' in s and "❯ Accept" in s, 10), ui.screen()
        time.sleep(1)  # the form takes a key only once it has settled
        ui.keys("Enter")
        assert wait_until(lambda: standin.saw("hi Ada"), 60), (ui.screen(), protocol_log(log)[-6:])
        rpc = protocol_log(log)
        updates = [m for d, m in rpc if d == ">" and isinstance(m, dict) and m.get("method") == "tasks/update"]
        assert updates and list(updates[0]["params"]["inputResponses"].values())[0]["action"] == "accept", updates
        # The end of the conversation: /exit, and no kernel of its own is left 3 s after.
        mine = kernel_ids(own_kgate)
        assert mine, "no auto kernel was made"
        ui.type("/exit")
        time.sleep(0.5)
        ui.keys("Enter")
        assert wait_until(lambda: not ui.alive(), 30), ui.screen()
        ended = time.monotonic()
        assert wait_until(lambda: not (kernel_ids(own_kgate) & mine), 3), (kernel_ids(own_kgate), mine)
        print(f"interactive /exit: the auto kernel gone {time.monotonic() - ended:.2f} s after Claude Code")
        assert any(d == "!" for d, _ in protocol_log(log)[-3:]), protocol_log(log)[-3:]
    finally:
        ui.close()


def test_print_mode_over_kgates_own_mcp(kgate_factory, tmp_path, standin):
    """`claude mcp add --transport http` with a token: stateless 2026-07-28 requests. The first
    execute needs no connect (it makes a kernel and names it), and a 70 s cell reaches the model
    whole: its progress keeps Claude Code's HTTP transport (60 s without a word) waiting."""
    token = "kgate-claude-http-token-51c3"
    kg = kgate_factory(token=token)

    def on_that_kernel(results):
        kid = result_text(results[0][2]).split("pass kernel='")[1].split("'")[0]
        return {"code": "import time\ntime.sleep(70)\nprint('awake after 70 s')", "kernel": kid, "timeout": 120}

    standin.script = [("execute", {"code": "x = 6 * 7\nprint('first', x)"}),
                      ("execute", on_that_kernel)]
    cfg = http_config(tmp_path / "mcp.json", kg.url + "/mcp", token)
    run = run_print(cfg, tmp_path / "home", standin, tmp_path, timeout=300)
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    first, slow = (result_text(r[2]) for r in standin.results)
    assert first.endswith(")\nfirst 42") and not standin.results[0][2].get("is_error"), first
    assert "awake after 70 s" in slow and not standin.results[1][2].get("is_error"), slow


def test_the_plugin_gives_claude_code_the_kernel_tools_of_the_installed_kgate_mcp(kgate, mcp_bin, tmp_path):  # noqa: F811
    """The repository's plugin (.claude-plugin/marketplace.json and plugin/, issue 45): valid to
    Claude Code's strict check, at kgate's version, added as a marketplace and installed with
    Claude Code's own commands; its server is the kgate-mcp on PATH (the package puts it in
    /usr/bin; here a link to the build's), which runs a cell."""
    project = re.search(r"project\(kgate VERSION (\S+)", (REPO / "CMakeLists.txt").read_text()).group(1)
    market = json.loads((REPO / ".claude-plugin/marketplace.json").read_text())
    manifest = json.loads((REPO / "plugin/.claude-plugin/plugin.json").read_text())
    entry = next(p for p in market["plugins"] if p["name"] == "kgate")
    assert manifest["version"] == entry["version"] == project, (manifest, entry, project)
    assert json.loads((REPO / "plugin/.mcp.json").read_text())["mcpServers"]["kernel"]["command"] == "kgate-mcp"

    standin = StandIn([("execute", {"code": "print('from the plugin')\n6 * 7"})], server="plugin_kgate_kernel")
    try:
        home = tmp_path / "home"
        env = claude_env(home, standin)

        def claude(*args):
            proc = subprocess.run([str(CLAUDE), *args], env=env, cwd=tmp_path, capture_output=True, text=True,
                                  timeout=120, stdin=subprocess.DEVNULL)
            assert proc.returncode == 0, (args, proc.stdout[-3000:], proc.stderr[-3000:])
            return proc.stdout
        for path in (REPO, REPO / "plugin"):
            claude("plugin", "validate", "--strict", str(path))
        claude("plugin", "marketplace", "add", str(REPO))
        claude("plugin", "install", "kgate@kgate")
        assert "kgate@kgate" in claude("plugin", "list")

        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "kgate-mcp").symlink_to(mcp_bin)
        extra = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "KGATE_URL": kgate.url}
        extra.update(owner_token_env(extra))
        run = run_print(None, home, standin, tmp_path, env=extra)
        assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
        assert [r[0] for r in standin.results] == ["execute"], (standin.results, run.stdout[-3000:])
        got = standin.results[0][2]
        assert not got.get("is_error") and "from the plugin\n" in result_text(got) and "42" in result_text(got), got
    finally:
        standin.close()


def test_execute_is_loaded_with_the_first_request_and_a_declined_input_is_short(kgate_factory, tmp_path, standin):
    """Issue 60 over kgate's /mcp (stateless): `execute` carries _meta anthropic/alwaysLoad, so the
    model's first request already has its schema and needs no ToolSearch turn (the other tools
    stay deferred); a kernel made by a call that asked for input() is named by the retry's answer,
    so the next call finds `x` there and only one kernel is made; the declined input() reaches the
    model in a line or two, without ipykernel's frames."""
    token = "kgate-claude-http-token-60a1"
    kg = kgate_factory(token=token)
    before = kernel_ids(kg)

    def on_that_kernel(results):
        kid = result_text(results[0][2]).split("pass kernel='")[1].split("'")[0]
        return {"code": "print(x)", "kernel": kid}

    standin.script = [("execute", {"code": "x = 42\nname = input('your name? ')"}),
                      ("execute", on_that_kernel)]
    cfg = http_config(tmp_path / "mcp.json", kg.url + "/mcp", token)
    run = run_print(cfg, tmp_path / "home", standin, tmp_path, timeout=180)
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    first = standin.main_requests()[0]
    tools = {t["name"]: t for t in first["tools"] if isinstance(t, dict)}
    execute = tools.get("mcp__kernel__execute")
    assert execute and "code" in json.dumps(execute.get("input_schema", {})), sorted(tools)
    assert "mcp__kernel__poll_job" not in tools, "the other tools should stay deferred"
    assert standin.searched == [], standin.searched  # no ToolSearch turn before the first execute
    asked, printed = (result_text(r[2]) for r in standin.results)
    assert "(created" in asked and "pass kernel='" in asked, asked
    assert "your name? " in asked and "interrupted" in asked and "kernelbase" not in asked, asked
    body = asked.split("\n", 1)[1]  # after the line naming the kernel
    assert len(body) < 300, (len(body), body)
    assert printed.strip().endswith("42"), printed
    made = kernel_ids(kg) - before
    assert len(made) == 1, made  # the one kernel, culled once idle


def test_a_kgate_restart_during_a_wait_is_named_with_the_time_really_waited(kgate_bin, mcp_bin, tmp_path, standin):  # noqa: F811
    """Issue 60, point 2: kgate restarted 5 s into a `timeout: 60` cell. The wait goes on for it
    to come back, the kernel is re-adopted with its job, and the reply names the restart and the
    time really waited, with the cell's output."""
    import threading

    from conftest import Kgate, free_port
    port = free_port()
    kg = Kgate(kgate_bin, tmp_path / "kg", port=port).start()
    again = None
    try:
        standin.script = [("execute", {"code": "import time\ntime.sleep(12)\nprint('slept 12')", "timeout": 60})]
        env = {"KGATE_URL": kg.url}
        cfg = stdio_config(tmp_path / "mcp.json", mcp_bin, {**env, **owner_token_env(env)}, tmp_path / "rpc.log")
        out = {}
        runner = threading.Thread(target=lambda: out.update(run=run_print(cfg, tmp_path / "home", standin, tmp_path)))
        runner.start()
        assert wait_until(lambda: any(k["execution_state"] == "busy" for k in kg.rest("GET", "/api/kernels")[2]), 90), \
            kg.log_tail()
        time.sleep(5)
        kg.stop(sweep=False)  # SIGTERM: the kernel and its cell go on, for the next kgate
        again = Kgate(kgate_bin, tmp_path / "kg", port=port).start()
        runner.join(180)
        run = out["run"]
        assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
        text = result_text(standin.results[0][2])
        assert "slept 12" in text, text
        m = re.search(r"kgate restarted ([\d.]+) s into the wait and re-adopted the kernel; job-\d+ went on\. "
                      r"It ended after ([\d.]+) s of waiting", text)
        assert m, text
        assert 3 < float(m.group(1)) < 9 and 10 < float(m.group(2)) < 30, m.groups()
    finally:
        if again:
            again.cleanup_kernels()
            again.stop()
        else:
            kg.stop()
