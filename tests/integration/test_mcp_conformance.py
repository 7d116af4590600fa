"""The official MCP conformance suite (@modelcontextprotocol/conformance, server mode) against
kgate's own /mcp, one scenario at a time.  Needs tests/conformance/node_modules (`npm ci` there;
scripts/bootstrap.sh does it), which brings the Node 22 the suite needs.

Every scenario that applies to a server with tools and nothing else must pass.  The others, and
why they do not apply, are listed in NOT_APPLICABLE; the test checks that they still fail for
that reason (a fixture tool or a capability kgate does not have), so a change in the suite is
noticed rather than hidden."""

import re
import subprocess
from pathlib import Path

import pytest

from conftest import _module_daemon

REPO = Path(__file__).resolve().parents[2]
SUITE_DIR = REPO / "tests" / "conformance"
NODE = SUITE_DIR / "node_modules" / ".bin" / "node"
CLI = SUITE_DIR / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
TOKEN = "kgate-conformance-token-2b77"

APPLICABLE = ["server-initialize", "ping", "tools-list", "server-sse-multiple-streams", "dns-rebinding-protection"]
# scenario -> why it does not apply to kgate's /mcp
FIXTURE = "calls a fixture tool of the suite's reference server (test_*), which kgate does not have"
NOT_APPLICABLE = {
    "logging-set-level": "logging/setLevel: kgate declares no logging capability",
    "completion-complete": "completion/complete: no prompts or resource templates to complete",
    "tools-call-simple-text": FIXTURE,
    "tools-call-image": FIXTURE,
    "tools-call-audio": FIXTURE,
    "tools-call-embedded-resource": FIXTURE,
    "tools-call-mixed-content": FIXTURE,
    "tools-call-with-logging": FIXTURE,
    "tools-call-error": FIXTURE,
    "tools-call-with-progress": FIXTURE,
    "tools-call-sampling": FIXTURE,
    "tools-call-elicitation": FIXTURE,
    "elicitation-sep1034-defaults": FIXTURE,
    "elicitation-sep1330-enums": FIXTURE,
    "json-schema-2020-12": "looks for a fixture tool, json_schema_2020_12_tool",
    "resources-list": "resources: kgate serves tools only",
    "resources-read-text": "resources: kgate serves tools only",
    "resources-read-binary": "resources: kgate serves tools only",
    "resources-templates-read": "resources: kgate serves tools only",
    "resources-subscribe": "resources: kgate serves tools only",
    "resources-unsubscribe": "resources: kgate serves tools only",
    "prompts-list": "prompts: kgate serves tools only",
    "prompts-get-simple": "prompts: kgate serves tools only",
    "prompts-get-with-args": "prompts: kgate serves tools only",
    "prompts-get-embedded-resource": "prompts: kgate serves tools only",
    "prompts-get-with-image": "prompts: kgate serves tools only",
}


@pytest.fixture(scope="module")
def suite():
    if not (NODE.exists() and CLI.exists()):
        pytest.skip(f"{SUITE_DIR}/node_modules is missing: run `npm ci` in {SUITE_DIR} (scripts/bootstrap.sh does)")
    return [str(NODE), str(CLI)]


@pytest.fixture(scope="module")
def kg(kgate_bin, tmp_path_factory):
    # kgate's own token, which the suite's client sends in the URL (?token=: it has no header
    # option); on loopback the Host and Origin checks apply too: dns-rebinding-protection.
    yield from _module_daemon(kgate_bin, tmp_path_factory)


def run(suite, kg, scenario):
    proc = subprocess.run(suite + ["server", "--url", f"{kg.url}/mcp?token={kg.token}", "--scenario", scenario],
                          capture_output=True, text=True, timeout=120, cwd=str(SUITE_DIR))
    out = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)
    m = re.search(r"Passed: (\d+)/(\d+), (\d+) failed", out)
    assert m, f"no result line from the suite for {scenario}:\n{out[-3000:]}"
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), out


def test_the_suite_lists_no_scenario_we_do_not_know(suite):
    proc = subprocess.run(suite + ["list", "--server"], capture_output=True, text=True, timeout=60, cwd=str(SUITE_DIR))
    listed = set(re.findall(r"^\s*-\s*([a-z0-9-]+)", proc.stdout, re.M))
    assert listed, proc.stdout + proc.stderr
    unknown = listed - set(APPLICABLE) - set(NOT_APPLICABLE) - {"server-sse-polling"}
    assert not unknown, f"scenarios to sort into APPLICABLE or NOT_APPLICABLE: {sorted(unknown)}"


@pytest.mark.parametrize("scenario", APPLICABLE)
def test_applicable_scenario_passes(suite, kg, scenario):
    passed, total, failed, out = run(suite, kg, scenario)
    assert total > 0 and failed == 0 and passed == total, out[-3000:]


def test_sse_polling_has_nothing_to_check(suite, kg):
    """server-sse-polling checks resumable event streams; kgate answers with JSON, so there is
    no stream to poll and the scenario checks nothing."""
    passed, total, failed, out = run(suite, kg, "server-sse-polling")
    assert failed == 0, out[-3000:]


@pytest.mark.parametrize("scenario", sorted(NOT_APPLICABLE))
def test_not_applicable_scenario_fails_for_its_reason(suite, kg, scenario):
    passed, total, failed, out = run(suite, kg, scenario)
    assert failed > 0, f"{scenario} passes now: move it to APPLICABLE\n{out[-2000:]}"
    assert re.search(r"Unknown tool|not found|Method not found|-32601|-32602|not support|capabilit", out, re.I), \
        f"{scenario} fails for another reason than '{NOT_APPLICABLE[scenario]}':\n{out[-3000:]}"
