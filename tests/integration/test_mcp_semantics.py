"""What kgate-mcp's tools mean, driven through the real binary over stdio against a real kgate
and real ipykernels:

- interrupt waits until the job has ended and says how it ended, so the next execute runs;
- isError is true when a tool could not do what it was asked (a cell that raised, an unknown
  job, an unreachable gateway, a busy or claim refusal), and false otherwise;
- every call's arguments are checked against the tool's published inputSchema (types, required,
  unknown arguments, bounds), and a bad one is a tool error that names the argument;
- an agent that exits frees its claim at once, whichever tool it used first, and the kernel
  listing says the same as the claim check.

kgate-mcp is $KGATE_MCP_BIN, else the kgate-mcp beside $KGATE_BIN's build tree.
"""

import re
import time

import pytest

from conftest import wait_until
from test_mcp_transcript import Mcp, initialize, mcp_bin  # noqa: F401 (mcp_bin: a fixture)

REPLY = 90  # seconds a tool call may take (a kernel start on a busy machine)


class Agent:
    """One conversation: a kgate-mcp process pointed at `url`."""

    def __init__(self, binary, home, url):
        self.m = Mcp(binary, home, {"KGATE_URL": url})
        initialize(self.m)
        self.next_id = 0

    def call(self, name, reply_timeout=REPLY, **args):
        """The tools/call reply's result: {"content": [...], "isError": bool}."""
        self.next_id += 1
        self.m.send({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call",
                     "params": {"name": name, "arguments": args}})
        r = self.m.reply(self.next_id, timeout=reply_timeout)
        assert "result" in r, f"{name}{args}: not a tool result: {r}"
        return r["result"]

    def text(self, result):
        return "\n".join(b.get("text", "") for b in result["content"] if b.get("type") == "text")

    def ok(self, name, **args):
        res = self.call(name, **args)
        assert res["isError"] is False, f"{name}{args} -> isError:\n{self.text(res)}\n{self.m.stderr_text()[-3000:]}"
        return self.text(res)

    def error(self, name, **args):
        res = self.call(name, **args)
        assert res["isError"] is True, f"{name}{args} -> isError false:\n{self.text(res)}"
        return self.text(res)

    def exit(self):
        rc, took = self.m.close(timeout=30)
        assert rc == 0, self.m.stderr_text()
        return took

    def kill(self):
        self.m.kill()


@pytest.fixture
def agents(mcp_bin, kgate, tmp_path):
    started = []

    def start(url=None):
        a = Agent(mcp_bin, tmp_path / f"agent{len(started)}", url or kgate.url)
        started.append(a)
        return a

    yield start
    for a in started:
        a.kill()


def claim_of(kgate, kernel):
    status, _, body = kgate.rest("GET", f"/api/kgate/kernels/{kernel}")
    assert status == 200, body
    return body.get("claim")


def listed_claim(kgate, kernel):
    status, _, body = kgate.rest("GET", "/api/kgate/kernels")
    assert status == 200, body
    (k,) = [k for k in body if k["id"] == kernel]
    return k.get("claim")


# --------------------------------------------------------------------------
# interrupt
# --------------------------------------------------------------------------

def test_interrupt_waits_for_the_job_to_end_and_the_next_execute_runs(agents, kgate):
    a = agents()
    a.ok("connect")
    text = a.ok("execute", code="import time; time.sleep(30)", timeout=1)
    job = re.search(r"job-\d+", text).group(0)
    assert "still running" in text, text
    start = time.monotonic()
    text = a.ok("interrupt")
    took = time.monotonic() - start
    assert took < 6, f"interrupt took {took:.1f} s"
    assert job in text and "ended interrupted" in text, text
    # At once: the job has ended, so nothing refuses the next cell.
    assert a.ok("execute", code="6*7") == "42"
    status, _, rec = kgate.rest("GET", f"/api/kgate/jobs/{job}")
    assert status == 200 and rec["status"] == "interrupted", rec
    a.ok("stop_kernel")


def test_interrupt_with_nothing_running_is_an_error(agents):
    a = agents()
    a.ok("connect")
    assert "nothing to interrupt" in a.error("interrupt")
    a.ok("stop_kernel")


# --------------------------------------------------------------------------
# isError
# --------------------------------------------------------------------------

def test_is_error_says_whether_the_tool_did_what_it_was_asked(agents, kgate):
    a = agents()
    a.ok("connect")
    assert a.ok("execute", code="1+1") == "2"
    assert "ZeroDivisionError" in a.error("execute", code="1/0")
    assert "No such job 'job-987654'." in a.error("poll_job", job="job-987654")
    # busy: our own job still runs; the refusal is a sentence of its own before the hint
    text = a.ok("execute", code="import time; time.sleep(20)", timeout=0.5)
    job = re.search(r"job-\d+", text).group(0)
    text = a.error("execute", code="2+2")
    assert f"{job} (yours) is still running" in text, text
    assert re.search(r"[.;:!?] Wait for it with poll_job\('" + job + r"'\)\.", text), text
    assert "ended interrupted" in a.ok("interrupt")
    a.ok("stop_kernel")


def test_is_error_for_an_unreachable_gateway(agents):
    a = agents(url="http://127.0.0.1:9")
    assert "cannot reach the gateway" in a.error("execute", code="1+1")
    a.error("server_status")
    a.error("list_kernels")


def test_is_error_for_a_claim_refusal(agents, kgate):
    kernel = kgate.start_kernel()["id"]
    a, b = agents(), agents()
    assert a.ok("execute", code="x = 1", kernel=kernel) == "(no output)"
    text = b.error("execute", code="x", kernel=kernel)
    assert "in use by another agent" in text, text
    assert claim_of(kgate, kernel)["alive"] is True
    a.exit()
    kgate.delete_kernel(kernel)


# --------------------------------------------------------------------------
# arguments against inputSchema
# --------------------------------------------------------------------------

@pytest.mark.parametrize("tool,args,names", [
    ("execute", {"code": "1", "timeout": "abc"}, ["timeout", "number"]),
    ("execute", {"code": "1", "bogus": 1}, ["bogus", "code", "timeout", "kernel"]),
    ("execute", {}, ["code", "required"]),
    ("execute", {"code": 5}, ["code", "string"]),
    ("execute", {"code": "1", "timeout": -1}, ["timeout", "0"]),
    ("execute", {"code": "1", "timeout": 99999}, ["timeout", "3600"]),
    ("poll_job", {"job": "job-1", "wait": 31}, ["wait", "30"]),
    ("poll_job", {"job": ["job-1"]}, ["job", "string"]),
    ("connect", {"kernel": 12}, ["kernel", "string"]),
    ("server_status", {"verbose": True}, ["verbose"]),
])
def test_arguments_are_checked_against_the_input_schema(agents, tool, args, names):
    a = agents(url="http://127.0.0.1:9")  # nothing may reach a gateway: the check comes first
    text = a.error(tool, **args)
    for n in names:
        assert n in text, (args, text)
    assert "cannot reach" not in text, text


def test_the_published_schemas_declare_the_bounds(agents):
    a = agents(url="http://127.0.0.1:9")
    r = a.m.request(99, "tools/list")
    tools = {t["name"]: t["inputSchema"] for t in r["result"]["tools"]}
    assert tools["execute"]["properties"]["timeout"]["minimum"] == 0
    assert tools["execute"]["properties"]["timeout"]["maximum"] == 3600
    assert tools["poll_job"]["properties"]["wait"]["maximum"] == 30
    assert all(s["additionalProperties"] is False for s in tools.values())


# --------------------------------------------------------------------------
# liveness of a claim
# --------------------------------------------------------------------------

def test_an_agent_that_exits_frees_its_claim_at_once(agents, kgate):
    """The first agent acts on a kernel by id without connect, then its stdin closes: the next
    agent's execute runs at once, and the listing never calls the gone agent alive."""
    kernel = kgate.start_kernel()["id"]
    a = agents()
    assert a.ok("execute", code="shared = 41", kernel=kernel) == "(no output)"
    claim = listed_claim(kgate, kernel)
    assert claim and claim["alive"] is True, claim
    first = claim["agent"]
    a.exit()
    gone_at = time.monotonic()
    claim = listed_claim(kgate, kernel)
    assert claim["agent"] == first and claim["alive"] is False, claim
    assert claim_of(kgate, kernel)["alive"] is False
    b = agents()
    b.ok("connect", kernel=kernel)
    assert b.ok("execute", code="shared + 1") == "42"
    took = time.monotonic() - gone_at
    assert took < 5, f"the second agent ran {took:.1f} s after the first exited"
    claim = listed_claim(kgate, kernel)
    assert claim["agent"] != first and claim["alive"] is True, claim
    b.exit()
    assert listed_claim(kgate, kernel)["alive"] is False
    kgate.delete_kernel(kernel)


def test_a_dropped_agent_is_not_called_alive(agents, kgate):
    """An agent killed outright (its link dropped without a close frame) keeps its claim only for
    the grace a reconnect gets. The refusal meanwhile says its connection dropped and when the
    claim lapses, not that the agent is alive, and the next execute after that runs."""
    kernel = kgate.start_kernel()["id"]
    a = agents()
    assert a.ok("execute", code="z = 1", kernel=kernel) == "(no output)"
    a.m.proc.kill()
    a.m.proc.wait()
    b = agents()
    dropped = wait_until(lambda: listed_claim(kgate, kernel).get("connected") is False, 5)
    assert dropped, listed_claim(kgate, kernel)
    text = b.error("execute", code="z", kernel=kernel)
    assert "dropped" in text and "lapses" in text, text
    assert "while that agent is alive" not in text and "Tell the user" not in text, text
    assert wait_until(lambda: listed_claim(kgate, kernel)["alive"] is False, 15)
    assert b.ok("execute", code="z + 1", kernel=kernel) == "2"
    b.exit()
    kgate.delete_kernel(kernel)
