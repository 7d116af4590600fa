"""The real Claude Code CLI (2.1.332, pinned in tests/claude) drives kgate-mcp (issue 43, point 8),
with a local stand-in for the model's API (claude_code.py). Each scenario asserts what the model
receives, and what went over the wire between Claude Code and kgate-mcp."""

import json
import time

import pytest

from claude_code import CLAUDE, StandIn, protocol_log, result_text, run_print, stdio_config
from test_mcp_transcript import mcp_bin, owner_token_env  # noqa: F401 (mcp_bin is a fixture)

pytestmark = pytest.mark.skipif(not CLAUDE.exists(), reason="tests/claude/node_modules is missing: "
                                "run scripts/bootstrap.sh (npm ci there)")

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
