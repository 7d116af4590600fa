"""The real Claude Code CLI (tests/claude: @anthropic-ai/claude-code, pinned) driving kgate-mcp or
kgate's /mcp, with a local stand-in for the Anthropic Messages API instead of a model.

The stand-in plays a script of tool calls, as a model would, and records what each tool call
returned: exactly what the model receives. Like a real model it first loads each deferred MCP
tool through Claude Code's ToolSearch. Requests that are not the main conversation (titles, quota
checks) get a short text. A shim between Claude Code and kgate-mcp logs their JSON-RPC, both ways,
and passes signals on."""

import json
import os
import pathlib
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPO = pathlib.Path(__file__).resolve().parents[2]
CLAUDE = REPO / "tests" / "claude" / "node_modules" / ".bin" / "claude"
SHIM = pathlib.Path(__file__).resolve().parent / "mcp_shim.py"
SERVER = "kernel"  # the MCP server's name in Claude Code's config: tools are mcp__kernel__<tool>


def tool_name(tool, server=SERVER):
    return f"mcp__{server}__{tool}"


class StandIn:
    """A Messages API that plays `script`: a list of (tool, input) for MCP tools (by their
    short name), then a final text. `results` gets, per step, the tool_result block the next
    request carried back."""

    def __init__(self, script, final="done", server=SERVER):
        """server: the MCP server's name in tool names (a plugin's is plugin_<plugin>_<server>)."""
        self.script = list(script)
        self.server = server
        self.final = final
        self.requests = []
        self.results = []  # (tool, input, tool_result block)
        self.searched = []  # the tools it had to load through ToolSearch first (deferred ones)
        self._lock = threading.Lock()
        self._issued = {}  # tool_use id -> (tool, input), ToolSearch included
        self._n = 0
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self.send_response(200)
                self.end_headers()

            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    req = json.loads(body)
                except ValueError:
                    req = {}
                if not self.path.startswith("/v1/messages") or self.path.startswith("/v1/messages/count_tokens"):
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(json.dumps({"input_tokens": 10}).encode())
                    return
                blocks, stop = standin.answer(req)
                if req.get("stream"):
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.end_headers()
                    for event in sse(blocks, stop, req.get("model", "stand-in")):
                        self.wfile.write(event)
                    self.wfile.flush()
                else:
                    msg = message(blocks, stop, req.get("model", "stand-in"))
                    data = json.dumps(msg).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def main_requests(self):
        """The requests of the conversation itself (they carry the tools), in order."""
        with self._lock:
            return [r for r in self.requests
                    if any(isinstance(t, dict) and (t.get("name") == "ToolSearch" or str(t.get("name", "")).startswith("mcp__"))
                           for t in r.get("tools", []))]

    def saw(self, text):
        """Whether any request of the conversation carried `text` (a task's notification, ...)."""
        with self._lock:
            return any(text in json.dumps(r.get("messages", [])) for r in self.requests)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def answer(self, req):
        tools = {t.get("name") for t in req.get("tools", []) if isinstance(t, dict)}
        main = "ToolSearch" in tools or any(n and n.startswith("mcp__") for n in tools)
        with self._lock:
            self.requests.append(req)
            if not main:
                return [{"type": "text", "text": "ok"}], "end_turn"
            # What came back for the calls this conversation made.
            for m in req.get("messages", []):
                if m.get("role") != "user" or not isinstance(m.get("content"), list):
                    continue
                for b in m["content"]:
                    if b.get("type") == "tool_result" and b.get("tool_use_id") in self._issued:
                        tool, inp = self._issued.pop(b["tool_use_id"])
                        if tool != "ToolSearch":
                            self.results.append((tool, inp, b))
            if not self.script:
                return [{"type": "text", "text": self.final}], "end_turn"
            tool, inp = self.script[0]
            if callable(inp):  # built from what came back so far (a job id, ...)
                inp = inp(self.results)
            self._n += 1
            uid = f"toolu_{self._n:04d}"
            if tool_name(tool, self.server) not in tools:  # deferred: load it first
                self.searched.append(tool)
                self._issued[uid] = ("ToolSearch", None)
                return [{"type": "tool_use", "id": uid, "name": "ToolSearch",
                         "input": {"query": f"select:{tool_name(tool, self.server)}", "max_results": 5}}], "tool_use"
            self.script.pop(0)
            self._issued[uid] = (tool, inp)
            return [{"type": "tool_use", "id": uid, "name": tool_name(tool, self.server), "input": inp}], "tool_use"


def message(blocks, stop, model):
    return {"id": "msg_standin", "type": "message", "role": "assistant", "model": model, "content": blocks,
            "stop_reason": stop, "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 10}}


def sse(blocks, stop, model):
    def ev(kind, data):
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()

    start = message([], None, model)
    yield ev("message_start", {"type": "message_start", "message": start})
    for i, b in enumerate(blocks):
        if b["type"] == "text":
            yield ev("content_block_start", {"type": "content_block_start", "index": i,
                                             "content_block": {"type": "text", "text": ""}})
            yield ev("content_block_delta", {"type": "content_block_delta", "index": i,
                                             "delta": {"type": "text_delta", "text": b["text"]}})
        else:
            yield ev("content_block_start", {"type": "content_block_start", "index": i,
                                             "content_block": {"type": "tool_use", "id": b["id"], "name": b["name"],
                                                               "input": {}}})
            yield ev("content_block_delta", {"type": "content_block_delta", "index": i,
                                             "delta": {"type": "input_json_delta",
                                                       "partial_json": json.dumps(b["input"])}})
        yield ev("content_block_stop", {"type": "content_block_stop", "index": i})
    yield ev("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                               "usage": {"output_tokens": 10}})
    yield ev("message_stop", {"type": "message_stop"})


def result_text(block):
    """A tool_result's text, as the model reads it (its text blocks joined)."""
    c = block.get("content")
    if isinstance(c, str):
        return c
    return "".join(b.get("text", "") for b in c or [] if b.get("type") == "text")


def stdio_config(path, mcp_bin, env, log):
    """An --mcp-config that runs kgate-mcp through the shim (which logs to `log`)."""
    cfg = {"mcpServers": {SERVER: {"command": sys.executable, "args": [str(SHIM), str(log), str(mcp_bin)],
                                   "env": env}}}
    path.write_text(json.dumps(cfg))
    return path


def http_config(path, url, token):
    cfg = {"mcpServers": {SERVER: {"type": "http", "url": url, "headers": {"Authorization": f"token {token}"}}}}
    path.write_text(json.dumps(cfg))
    return path


def claude_env(home, standin):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE", "KGATE_"))}
    home.mkdir(parents=True, exist_ok=True)
    env.update({
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": standin.url,
        "ANTHROPIC_API_KEY": "sk-ant-standin",
        "IS_SANDBOX": "1",  # --dangerously-skip-permissions as root
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
    })
    return env


def run_print(config, home, standin, cwd, timeout=240, env=None):
    """`claude -p` for one turn; returns the CompletedProcess (stream-json on stdout).
    config=None: no --mcp-config, only the servers of the user's settings and plugins.
    env: added to Claude Code's environment (which its stdio servers inherit)."""
    cmd = [str(CLAUDE), "-p", "go"]
    if config is not None:
        cmd += ["--mcp-config", str(config), "--strict-mcp-config"]
    cmd += ["--dangerously-skip-permissions", "--output-format", "stream-json", "--verbose"]
    return subprocess.run(cmd, cwd=cwd, env={**claude_env(home, standin), **(env or {})}, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def protocol_log(log):
    """The shim's log: (direction, message) pairs, '>' to kgate-mcp and '<' from it."""
    out = []
    if not pathlib.Path(log).exists():
        return out
    for line in pathlib.Path(log).read_text().splitlines():
        d, _, text = line.partition(" ")
        try:
            out.append((d, json.loads(text)))
        except ValueError:
            out.append((d, text))
    return out


def seed_home(home, cwd):
    """A HOME in which Claude Code starts straight into a conversation: onboarding done, the
    stand-in's key approved, `cwd` trusted, bypass-permissions mode accepted."""
    home.mkdir(parents=True, exist_ok=True)
    key = "sk-ant-standin"
    (home / ".claude.json").write_text(json.dumps({
        "hasCompletedOnboarding": True, "lastOnboardingVersion": "2.1.332", "theme": "dark",
        "customApiKeyResponses": {"approved": [key[-20:]], "rejected": []},
        "bypassPermissionsModeAccepted": True,
        "projects": {str(cwd): {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}},
    }))


class Interactive:
    """Claude Code's interactive UI in a tmux session of its own."""

    _n = 0

    def __init__(self, config, home, standin, cwd):
        Interactive._n += 1
        self.name = f"kgate-claude-{os.getpid()}-{Interactive._n}"
        seed_home(home, cwd)
        env = claude_env(home, standin)
        args = ["tmux", "new-session", "-d", "-s", self.name, "-x", "160", "-y", "50", "-c", str(cwd)]
        for k in ("HOME", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "IS_SANDBOX", "DISABLE_TELEMETRY",
                  "DISABLE_AUTOUPDATER", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
                  "CLAUDE_CODE_DISABLE_TERMINAL_TITLE", "PATH"):
            args += ["-e", f"{k}={env[k]}"]
        args += ["--", str(CLAUDE), "--mcp-config", str(config), "--strict-mcp-config",
                 "--dangerously-skip-permissions"]
        subprocess.run(args, check=True)

    def screen(self):
        r = subprocess.run(["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True, text=True)
        return r.stdout

    def keys(self, *keys):
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def type(self, text):
        subprocess.run(["tmux", "send-keys", "-t", self.name, "-l", text], check=True)

    def wait_screen(self, pred, timeout=60):
        import time
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.screen()
            if pred(s):
                return s
            time.sleep(0.3)
        return None

    def alive(self):
        return subprocess.run(["tmux", "has-session", "-t", self.name], capture_output=True).returncode == 0

    def close(self):
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)
