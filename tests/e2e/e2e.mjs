#!/usr/bin/env node
// End-to-end test of kgate-mcp driven by the official MCP TypeScript SDK client
// (@modelcontextprotocol/sdk: Client + StdioClientTransport), against a real kgate and real
// ipykernels.  Each scenario is one "conversation": it starts kgate-mcp over stdio, calls
// tools, stops the kernels it made and closes stdin.
//
//   node e2e.mjs [--list] [scenario ...]     (no scenario: all of them, in order)
//
// Environment (given by the caller, e.g. tests/integration/test_mcp_e2e.py):
//   KGATE_MCP_BIN    the translator (default <repo>/build/translator/kgate-mcp)
//   KGATE_URL        the gateway; KGATE_TOKEN its token (passed to kgate-mcp, never as a tool
//                    argument; a scenario fails if it shows up in a reply or in the log)
//   XDG_CONFIG_HOME  kgate-mcp's config root ($XDG_CONFIG_HOME/kgate/{startup,inspectors}.py,
//                    gateways.toml).  The inspector scenarios make their own.
//   KGATE_E2E_RUNTIME_DIR  optional: kgate's runtime dir, used to find a connection file if
//                    server_status does not show one.
//
// Output: one JSON line per scenario, {"scenario", "ok", "ms", ...}; exit 1 if any failed.
//
// Texts are matched loosely (substrings and patterns such as /job-\d+/, "interrupted"),
// because their exact wording lives in the translator's C++ and may change; what is checked
// is what an agent relies on: ids, verdicts, image sizes, caps, the absence of ANSI codes.

import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

import { KernelManager, ServerConnection, SessionManager } from "@jupyterlab/services";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CallToolResultSchema, ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const REPO = path.resolve(HERE, "..", "..");
const MCP_BIN = process.env.KGATE_MCP_BIN || path.join(REPO, "build", "translator", "kgate-mcp");
const PYTHON = "/usr/bin/python3";
const TOKEN = process.env.KGATE_TOKEN || "";
// stdio: each conversation is a kgate-mcp process. http: it is a session of kgate's own /mcp
// (Streamable HTTP, the SDK's client transport), with the token as a bearer token.
const TRANSPORT = process.env.KGATE_E2E_TRANSPORT || "stdio";
const CALL_TIMEOUT_MS = 120_000; // per tool call; kernel start + matplotlib import fit easily
const IMAGE_MAX_PIXELS = 768 * 768;
const UUID_RE = /[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/;
const JOB_RE = /job-\d+/g;
const ANSI_RE = /\x1b\[/;

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------

class Failure extends Error {}

function check(cond, what, detail) {
  if (!cond) {
    const extra = detail === undefined ? "" : `: ${clip(typeof detail === "string" ? detail : JSON.stringify(detail))}`;
    throw new Failure(`${what}${extra}`);
  }
}

function clip(s, n = 1500) {
  return s.length > n ? `${s.slice(0, n)}… (${s.length} chars)` : s;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function textOf(result) {
  return (result.content || []).filter((b) => b.type === "text").map((b) => b.text).join("\n");
}

function jobsIn(text) {
  return [...new Set(text.match(JOB_RE) || [])];
}

function jobNumber(job) {
  return Number(job.slice(4));
}

/** Width and height from a PNG (IHDR) or JPEG (first SOFn marker) header. */
function imageSize(buf, mimeType) {
  if (mimeType === "image/png") {
    const sig = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];
    check(buf.length >= 24 && sig.every((b, i) => buf[i] === b), "PNG signature");
    check(buf.toString("latin1", 12, 16) === "IHDR", "PNG starts with IHDR");
    return { width: buf.readUInt32BE(16), height: buf.readUInt32BE(20) };
  }
  if (mimeType === "image/jpeg") {
    check(buf[0] === 0xff && buf[1] === 0xd8, "JPEG SOI marker");
    let i = 2;
    while (i + 4 <= buf.length) {
      if (buf[i] !== 0xff) throw new Failure(`JPEG: no marker at byte ${i}`);
      const marker = buf[i + 1];
      if (marker === 0xff) { i += 1; continue; } // fill byte
      if (marker === 0xd8 || marker === 0x01 || (marker >= 0xd0 && marker <= 0xd7)) { i += 2; continue; }
      const len = buf.readUInt16BE(i + 2);
      // SOF0..SOF15 except DHT (c4), JPG (c8) and DAC (cc)
      if (marker >= 0xc0 && marker <= 0xcf && ![0xc4, 0xc8, 0xcc].includes(marker)) {
        check(i + 9 <= buf.length, "JPEG SOF segment complete");
        return { height: buf.readUInt16BE(i + 5), width: buf.readUInt16BE(i + 7) };
      }
      if (marker === 0xd9 || marker === 0xda) break; // EOI / SOS before any SOF
      i += 2 + len;
    }
    throw new Failure("JPEG: no SOF marker");
  }
  throw new Failure(`unexpected image mimeType ${mimeType}`);
}

/** Run a Python snippet with Debian's interpreter; resolves to {code, stdout, stderr}. */
function python(source, args = [], timeoutMs = 60_000) {
  return new Promise((resolve, reject) => {
    const child = spawn(PYTHON, ["-c", source, ...args], { stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => { stdout += d; });
    child.stderr.on("data", (d) => { stderr += d; });
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.on("error", reject);
    child.on("close", (code) => { clearTimeout(timer); resolve({ code, stdout, stderr }); });
  });
}

/** A GET on the gateway's REST API (the scenarios use it only to look things up). */
async function gatewayGet(urlPath) {
  const base = (process.env.KGATE_URL || "http://127.0.0.1:8787").replace(/\/$/, "");
  const headers = TOKEN ? { Authorization: `token ${TOKEN}` } : {};
  const resp = await fetch(`${base}${urlPath}`, { headers });
  const body = await resp.text();
  check(resp.ok, `GET ${urlPath} -> ${resp.status}`, body);
  return JSON.parse(body);
}

// ---------------------------------------------------------------------------------------------
// One conversation: kgate-mcp over stdio
// ---------------------------------------------------------------------------------------------

class Conversation {
  constructor(name, { xdg, elicitation } = {}) {
    this.name = name;
    this.calls = []; // [{tool, args, ms, isError, text}] for the report
    this.kernels = new Set();
    this.stderr = "";
    this.protocolErrors = [];
    const env = {};
    for (const [k, v] of Object.entries(process.env)) {
      if (k.startsWith("KGATE_") || k === "SPDLOG_LEVEL") env[k] = v;
    }
    const xdgHome = xdg || process.env.XDG_CONFIG_HOME;
    if (xdgHome) env.XDG_CONFIG_HOME = xdgHome;
    if (TRANSPORT === "http") {
      const base = (process.env.KGATE_URL || "http://127.0.0.1:8787").replace(/\/$/, "");
      this.transport = new StreamableHTTPClientTransport(new URL(`${base}/mcp`), {
        requestInit: { headers: TOKEN ? { Authorization: `Bearer ${TOKEN}` } : {} },
      });
    } else {
      this.transport = new StdioClientTransport({
        command: MCP_BIN, args: [], env, stderr: "pipe", cwd: os.tmpdir(),
      });
      this.transport.stderr.on("data", (d) => { this.stderr += d; });
    }
    this.client = new Client({ name: "kgate-e2e", version: "0.0.0" },
      { capabilities: elicitation ? { elicitation: {} } : {} });
    // With elicitation: each elicitation/create takes the next of `answers` (the test fills it).
    this.elicited = [];
    this.answers = [];
    if (elicitation) {
      this.client.setRequestHandler(ElicitRequestSchema, async (req) => {
        this.elicited.push(req.params);
        return this.answers.shift() || { action: "cancel" };
      });
    }
    this.client.onerror = (err) => { this.protocolErrors.push(String(err && err.message || err)); };
  }

  async open() {
    if (TRANSPORT !== "http") check(fs.existsSync(MCP_BIN), `kgate-mcp not found at ${MCP_BIN} (set KGATE_MCP_BIN)`);
    await this.client.connect(this.transport, { timeout: 30_000 });
    const info = this.client.getServerVersion();
    check(info && info.name, "initialize answered with serverInfo", info);
    return this;
  }

  /** Call a tool; returns {result, text, ms}. Tool errors (isError) are returned, not thrown. */
  async call(tool, args = {}, options = {}) {
    const t0 = Date.now();
    const entry = { tool, args };
    this.calls.push(entry);
    try {
      const result = await this.client.callTool({ name: tool, arguments: args }, undefined, {
        timeout: CALL_TIMEOUT_MS, ...options,
      });
      entry.ms = Date.now() - t0;
      entry.isError = !!result.isError;
      const text = textOf(result);
      entry.text = clip(text, 600);
      if (TOKEN) check(!JSON.stringify(result).includes(TOKEN), `${tool}: the token appears in a reply`);
      this.noteKernels(text);
      return { result, text, ms: entry.ms };
    } catch (err) {
      entry.ms = Date.now() - t0;
      entry.threw = String(err && err.message || err);
      throw err;
    }
  }

  /** Like call(), but the reply must not be a tool error. */
  async ok(tool, args = {}, options = {}) {
    const r = await this.call(tool, args, options);
    check(!r.result.isError, `${tool} ${JSON.stringify(args).slice(0, 200)} returned isError`, r.text);
    return r;
  }

  noteKernels(text) {
    const m = text.match(new RegExp(UUID_RE.source, "g"));
    if (m) for (const id of m) this.kernels.add(id);
  }

  async close() {
    // Connected kernels are never stopped implicitly: stop every kernel this conversation saw.
    for (const id of this.kernels) {
      try { await this.call("stop_kernel", { kernel: id }, { timeout: 30_000 }); } catch { /* gone */ }
    }
    // Closing stdin must be enough: the SDK sends SIGTERM only after 2 s without an exit.
    // (_process is the SDK's private handle on the child; only read here, if present.)
    const child = this.transport._process;
    const t0 = Date.now();
    if (TRANSPORT === "http") {
      // DELETE /mcp: the session ends at once (its claims freed, an auto kernel stopped).
      check(this.transport.sessionId, "kgate's /mcp gave the session an Mcp-Session-Id");
      await this.transport.terminateSession();
    }
    try { await this.client.close(); } catch { /* already closed */ }
    this.closeMs = Date.now() - t0;
    if (child) {
      this.exit = { code: child.exitCode, signal: child.signalCode };
      check(child.signalCode === null && child.exitCode === 0,
        `kgate-mcp exits by itself (status 0) on stdin EOF (${this.closeMs} ms)`, this.exit);
    }
    if (TOKEN) check(!this.stderr.includes(TOKEN), "the token appears in kgate-mcp's log");
  }
}

// ---------------------------------------------------------------------------------------------
// Scenarios: each gets a fresh Conversation and returns details for the report
// ---------------------------------------------------------------------------------------------

const EXPECTED_TOOLS = ["connect", "execute", "poll_job", "list_kernels", "stop_kernel", "restart",
  "interrupt", "server_status", "verify"];

async function connectFresh(conv) {
  const r = await conv.ok("connect", {});
  const m = r.text.match(UUID_RE);
  check(m, "connect names the new kernel id", r.text);
  return { kernel: m[0], text: r.text };
}

/** @jupyterlab/services (what JupyterLab, VS Code's Jupyter extension and nteract use) pointed
 *  straight at kgate: its KernelManager and SessionManager, with their own polling. */
function jupyterlabManagers() {
  const baseUrl = `${(process.env.KGATE_URL || "http://127.0.0.1:8787").replace(/\/$/, "")}/`;
  const serverSettings = ServerConnection.makeSettings({ baseUrl, token: TOKEN });
  const kernelManager = new KernelManager({ serverSettings });
  const sessionManager = new SessionManager({ kernelManager, serverSettings });
  return {
    kernelManager, sessionManager,
    dispose() { sessionManager.dispose(); kernelManager.dispose(); },
  };
}

/** Runs `code` on a session's kernel connection; resolves to {status, stdout}. */
async function labRun(session, code) {
  let stdout = "";
  const future = session.kernel.requestExecute({ code });
  future.onIOPub = (msg) => {
    if (msg.header.msg_type === "stream") stdout += msg.content.text;
  };
  const reply = await future.done;
  return { status: reply.content.status, stdout, reply: reply.content };
}

const scenarios = {
  /** connect creates a kernel and names it; execute('1+1') -> 2. */
  async connect(conv) {
    const listed = await conv.client.listTools();
    const names = listed.tools.map((t) => t.name);
    for (const t of EXPECTED_TOOLS) check(names.includes(t), `tools/list has ${t}`, names);
    const exec = listed.tools.find((t) => t.name === "execute");
    check(!exec.outputSchema, "execute has no outputSchema (Claude Code would then hide images)");
    check(exec.inputSchema?.properties?.code, "execute takes `code`", exec.inputSchema);
    // Tool annotations: what a client may run without asking, and what it should confirm.
    const ann = Object.fromEntries(listed.tools.map((t) => [t.name, t.annotations || {}]));
    for (const t of ["list_kernels", "server_status", "poll_job"]) check(ann[t].readOnlyHint === true, `${t} is read-only`, ann[t]);
    for (const t of ["stop_kernel", "restart", "execute"]) {
      check(ann[t].readOnlyHint === false && ann[t].destructiveHint === true, `${t} is destructive`, ann[t]);
    }
    check(ann.stop_kernel.idempotentHint === true && ann.interrupt.idempotentHint === true, "stop and interrupt are idempotent", ann);
    check(ann.interrupt.destructiveHint === false && ann.execute.openWorldHint === true, "interrupt destroys nothing; execute reaches out", ann);
    check(listed.tools.every((t) => typeof t.title === "string" && t.title.length > 0), "every tool has a title");

    const { kernel, text } = await connectFresh(conv);
    const startup = path.join(process.env.XDG_CONFIG_HOME || "", "kgate", "startup.py");
    if (TRANSPORT === "stdio" && process.env.XDG_CONFIG_HOME && fs.existsSync(startup)
        && fs.readFileSync(startup, "utf8").includes("kgate-e2e-startup")) {
      check(text.includes("kgate-e2e-startup"), "connect returns the startup output", text);
    }
    const r = await conv.ok("execute", { code: "1+1" });
    check(/^2\s*$/m.test(r.text.split("\n")[0]), "execute('1+1') -> 2", r.text);
    const kernels = await conv.ok("list_kernels", {});
    check(kernels.text.includes(kernel), "list_kernels lists the new kernel", kernels.text);
    const info = await gatewayGet(`/api/kgate/kernels/${kernel}`);
    const labelled = TRANSPORT === "http" ? /^kgate-e2e \(kgate \/mcp session [0-9a-f]{8}\)$/ : /^kgate-e2e \(kgate-mcp pid \d+\)$/;
    check(info.claim && labelled.test(info.claim.label),
      "the claim is labelled with the client's name (initialize clientInfo)", info.claim);
    return { kernel, connect_text: clip(text, 300), execute_ms: r.ms };
  },

  /** A matplotlib figure comes back as an image block within 768x768 pixels, plus text. */
  async matplotlib(conv) {
    await connectFresh(conv);
    const code = [
      "import matplotlib",
      'matplotlib.use("agg")',
      "import matplotlib.pyplot as plt",
      "# agg draws nothing by itself: let IPython render figures as PNG for display()",
      "from IPython.core.pylabtools import select_figure_formats",
      'select_figure_formats(get_ipython(), {"png"})',
      "fig = plt.figure(figsize=(12, 12), dpi=100)  # 1200x1200: must be scaled down",
      "plt.plot([1, 2, 3])",
      "display(fig)",
      "plt.close(fig)",
      'print("plotted")',
    ].join("\n");
    const r = await conv.ok("execute", { code, timeout: 110 });
    const blocks = r.result.content;
    const images = blocks.filter((b) => b.type === "image");
    check(images.length === 1, "one image block", blocks.map((b) => b.type));
    const img = images[0];
    check(["image/png", "image/jpeg"].includes(img.mimeType), "image mimeType png or jpeg", img.mimeType);
    const buf = Buffer.from(img.data, "base64");
    const { width, height } = imageSize(buf, img.mimeType);
    check(width > 0 && height > 0 && width * height <= IMAGE_MAX_PIXELS,
      `image within 768x768 pixels (got ${width}x${height})`);
    check(blocks.some((b) => b.type === "text"), "text blocks beside the image", blocks.map((b) => b.type));
    check(blocks[blocks.length - 1].type === "text", "the rendered text is the last block");
    check(r.text.includes("plotted"), "the stdout is in the text", r.text);
    check(!r.text.includes(img.data.slice(0, 64)), "no base64 in the text");
    return { blocks: blocks.map((b) => b.type), mimeType: img.mimeType, width, height, bytes: buf.length };
  },

  /** An error: the exception is named, no ANSI codes, long traceback lines capped, the
   *  exception line kept whole. */
  async error(conv) {
    await connectFresh(conv);
    const r1 = await conv.call("execute", { code: "1/0" });
    check(r1.text.includes("ZeroDivisionError"), "1/0 names ZeroDivisionError", r1.text);
    check(!ANSI_RE.test(r1.text), "no ANSI escapes in the text", JSON.stringify(r1.text));

    const longSource = "x".repeat(600);
    const code = `def f():\n    raise ValueError("${longSource}" and "V" * 500)\n\nf()`;
    const r2 = await conv.call("execute", { code });
    check(r2.text.includes("ValueError"), "the ValueError is named", r2.text);
    check(!ANSI_RE.test(r2.text), "no ANSI escapes in the text", JSON.stringify(r2.text));
    check(!r2.text.includes(longSource), "the 600-char source line in the traceback is capped", r2.text);
    check(r2.text.includes(`ValueError: ${"V".repeat(500)}`), "the exception line is kept whole", r2.text);
    const longest = Math.max(...r2.text.split("\n").filter((l) => !l.includes("V".repeat(500))).map((l) => l.length));
    check(longest <= 400, `traceback lines are capped (longest ${longest} chars)`);
    return { isError: [!!r1.result.isError, !!r2.result.isError], longest_line: longest };
  },

  /** A cell longer than `timeout` returns a job id; interrupt names it; poll_job shows it
   *  interrupted. */
  async long(conv) {
    await connectFresh(conv);
    const r = await conv.ok("execute", { code: "import time; time.sleep(30)", timeout: 1 });
    check(r.ms < 8000, `execute with timeout=1 returned within a few seconds (${r.ms} ms)`);
    const jobs = jobsIn(r.text);
    check(jobs.length >= 1, "the reply names the job (job-N)", r.text);
    const job = jobs[jobs.length - 1];
    // A wait on it reports progress (over HTTP, on the POST's event stream).
    const progress = [];
    const waited = await conv.ok("poll_job", { job, wait: 3 }, { onprogress: (p) => progress.push(p) });
    check(/running/.test(waited.text), `${job} still runs after a 3 s wait`, waited.text);
    check(progress.length >= 1 && progress.every((p) => p.total === 3 && /running/.test(p.message || "")),
      "the wait sent progress notifications", progress);
    const intr = await conv.ok("interrupt", {});
    check(intr.text.includes(job), `interrupt names ${job}`, intr.text);
    const final = await pollUntilDone(conv, job);
    check(/interrupt/i.test(final.text) || final.text.includes("KeyboardInterrupt"),
      `${job} ended interrupted`, final.text);
    return { job, execute_ms: r.ms, progress: progress.length, poll: clip(final.text, 300) };
  },

  /** Cancelling a tools/call (the SDK sends notifications/cancelled) interrupts its cell. */
  async cancel(conv) {
    const { kernel } = await connectFresh(conv);
    const before = await newestJob(kernel);
    const controller = new AbortController();
    const t0 = Date.now();
    setTimeout(() => controller.abort("e2e: cancelled after 1 s"), 1000);
    let threw = null;
    try {
      await conv.call("execute", { code: "import time; time.sleep(30)", timeout: 60 },
        { signal: controller.signal });
    } catch (err) {
      threw = String(err && err.message || err);
    }
    check(threw !== null, "the cancelled call rejects on the client side");
    check(Date.now() - t0 < 5000, "the cancelled call rejected promptly");
    let job = null;
    for (let i = 0; i < 50 && !job; i++) {
      const newest = await newestJob(kernel);
      if (newest && newest !== before) job = newest;
      else await sleep(100);
    }
    check(job, "the cancelled call started a job on the kernel");
    const final = await pollUntilDone(conv, job);
    check(/interrupt/i.test(final.text) || final.text.includes("KeyboardInterrupt"),
      `the cancelled call's ${job} ended interrupted`, final.text);
    // The kernel is usable again at once.
    const after = await conv.ok("execute", { code: "40+2" });
    check(after.text.includes("42"), "the kernel runs the next cell", after.text);
    return { job, rejected_with: clip(threw, 200), late_responses: conv.protocolErrors.length };
  },

  /** A cell run by a BlockingKernelClient attached by connection file shows up in the next
   *  reply as a note naming its job, exactly once. */
  async foreign(conv) {
    const { kernel } = await connectFresh(conv);
    await conv.ok("execute", { code: "x_agent = 1" }); // the agent claims the kernel
    const status = await conv.ok("server_status", {});
    let file = (status.text.match(/[^\s'"`]+\.json/g) || []).find((f) => f.includes(kernel));
    if (!file && process.env.KGATE_E2E_RUNTIME_DIR) {
      file = path.join(process.env.KGATE_E2E_RUNTIME_DIR, `kernel-${kernel}.json`);
    }
    check(file && fs.existsSync(file), "server_status shows the kernel's connection file", status.text);
    const user = await python(`
import sys
from jupyter_client import BlockingKernelClient
kc = BlockingKernelClient(connection_file=sys.argv[1])
kc.load_connection_file()
kc.start_channels()
kc.wait_for_ready(timeout=30)
reply = kc.execute_interactive("x_user = 5", timeout=30, output_hook=lambda m: None)
print(reply["content"]["status"])
kc.stop_channels()
`, [file]);
    check(user.code === 0 && user.stdout.trim() === "ok", "the user's client ran its cell", user);
    await sleep(300); // the gateway records the end from the kernel's iopub
    const r1 = await conv.ok("execute", { code: "1" });
    const jobs1 = jobsIn(r1.text);
    check(jobs1.length >= 1, "the next reply has a note naming the user's job", r1.text);
    check(/user/i.test(r1.text), "the note says the user ran it", r1.text);
    const r2 = await conv.ok("execute", { code: "x_user" });
    check(/^5\s*$/m.test(r2.text.split("\n")[0]), "the user's variable is visible", r2.text);
    for (const j of jobs1) check(!r2.text.includes(j), `the note about ${j} is not repeated`, r2.text);
    return { connection_file: file, note: clip(r1.text, 400) };
  },

  /** input() in a cell, asked of the user through MCP elicitation: answered, declined, and a
   *  getpass() that is never asked (MCP forbids eliciting secrets). */
  async input(conv) {
    await connectFresh(conv);
    conv.answers.push({ action: "accept", content: { value: "ada" } });
    const r = await conv.ok("execute", { code: "name = input('Your name? ')\nprint('hi', name)" });
    check(r.text.includes("hi ada"), "the cell got the user's answer", r.text);
    check(conv.elicited.length === 1 && conv.elicited[0].message.includes("Your name?"),
      "the user was asked the cell's prompt", conv.elicited);
    check(conv.elicited[0].requestedSchema?.properties?.value?.type === "string", "a string is asked for",
      conv.elicited[0]);

    conv.answers.push({ action: "decline" });
    const d = await conv.call("execute", { code: "input('Again? ')" });
    check(d.result.isError && /declined/.test(d.text) && /interrupted/i.test(d.text),
      "a declined prompt interrupts the cell and says so", d.text);

    const p = await conv.call("execute", { code: "import getpass\ngetpass.getpass('Password: ')" });
    check(conv.elicited.length === 2, "getpass() is never asked of the user", conv.elicited);
    check(/secrets/.test(p.text) && /environment/.test(p.text), "the reply says why getpass() got no answer", p.text);

    const after = await conv.ok("execute", { code: "name" });
    check(after.text.includes("'ada'"), "the kernel goes on after all that", after.text);
    return { asked: conv.elicited.length };
  },

  /** Without elicitation, input() raises, and the reply says why. */
  async input_unsupported(conv) {
    await connectFresh(conv);
    const r = await conv.call("execute", { code: "input('x? ')" });
    check(r.result.isError && r.text.includes("StdinNotImplementedError"), "input() raises", r.text);
    check(/elicitation/.test(r.text), "the reply names what is missing", r.text);
    return {};
  },

  /** MCP tasks (2025-11-25) through the SDK's experimental client: a cell run as a task ends
   *  with its output from tasks/result; tasks/cancel interrupts exactly that cell. */
  async tasks(conv) {
    await connectFresh(conv);
    const caps = conv.client.getServerCapabilities();
    check(caps?.tasks?.requests?.tools?.call, "the server offers task-augmented tools/call", caps);
    const listed = await conv.client.listTools();
    check(listed.tools.find((t) => t.name === "execute")?.execution?.taskSupport === "optional",
      "execute may run as a task", listed.tools.find((t) => t.name === "execute"));
    const tasks = conv.client.experimental.tasks;
    const seen = [];
    let result = null;
    for await (const m of tasks.callToolStream({ name: "execute", arguments: { code: "import time\ntime.sleep(1.5)\nprint('task done')" } },
      undefined, { task: { ttl: 120_000 }, timeout: CALL_TIMEOUT_MS })) {
      seen.push(m.type);
      if (m.type === "result") result = m.result;
      if (m.type === "error") throw new Failure(`the task failed: ${m.error?.message}`);
    }
    check(seen[0] === "taskCreated" && result, "a task was created and ended with a result", seen);
    check(textOf(result).includes("task done"), "tasks/result carries the cell's output", textOf(result));

    // A long cell as a task, cancelled: it is interrupted, and the kernel is free at once.
    const stream = tasks.callToolStream({ name: "execute", arguments: { code: "import time\ntime.sleep(60)" } },
      undefined, { task: { ttl: 120_000 }, timeout: CALL_TIMEOUT_MS });
    const first = await stream.next();
    check(first.value?.type === "taskCreated", "the long cell became a task", first.value);
    const taskId = first.value.task.taskId;
    await sleep(1000);
    check((await tasks.getTask(taskId)).status === "working", "the task is working");
    const cancelled = await tasks.cancelTask(taskId);
    check(cancelled.status === "cancelled", "tasks/cancel answers cancelled", cancelled);
    const t0 = Date.now();
    const interrupted = await tasks.getTaskResult(taskId, CallToolResultSchema);  // waits for the call to end
    check(Date.now() - t0 < 15_000, "the cancelled cell ends within seconds, not its 60 s", Date.now() - t0);
    check(/interrupt|KeyboardInterrupt/i.test(textOf(interrupted)), "the cancelled task's result says it was interrupted",
      textOf(interrupted));
    const r = await conv.ok("execute", { code: "'free'" });
    check(r.text.includes("'free'"), "the kernel runs the next cell", r.text);
    check((await tasks.getTask(taskId)).status === "cancelled", "a cancelled task stays cancelled");
    try { await stream.return(); } catch { /* already over */ }
    return { seen };
  },

  /** A notebook opened with @jupyterlab/services on the agent's kernel: its cell is noted in the
   *  agent's next reply, a rename is kept, and closing the notebook leaves the agent's kernel. */
  async notebook_session(conv) {
    const { kernel } = await connectFresh(conv);
    await conv.ok("execute", { code: "x_agent = 1" });
    const lab = jupyterlabManagers();
    try {
      await lab.sessionManager.ready;
      const session = await lab.sessionManager.startNew({
        path: "work/nb.ipynb", name: "nb.ipynb", type: "notebook", kernel: { id: kernel },
      });
      check(session.kernel && session.kernel.id === kernel, "the session is on the agent's kernel", session.model);
      const run = await labRun(session, "x_nb = 40 + x_agent + 1\nprint('from the notebook')");
      check(run.status === "ok" && run.stdout === "from the notebook\n", "the notebook's cell ran", run);
      const found = await lab.sessionManager.findByPath("work/nb.ipynb");
      check(found && found.id === session.id, "findByPath finds the session", found);

      await sleep(300); // the gateway records the end from the kernel's iopub
      const r = await conv.ok("execute", { code: "x_nb" });
      check(/^42\s*$/m.test(r.text), "the agent sees the notebook's variable", r.text);
      check(jobsIn(r.text).length >= 1 && /user/i.test(r.text), "the agent's reply notes the notebook's cell", r.text);
      const cell = await conv.ok("poll_job", { job: jobsIn(r.text)[0] });
      check(cell.text.includes("x_nb = 40") && cell.text.includes("from the notebook"),
        "poll_job on the noted job shows the notebook's cell and its output", cell.text);

      await session.setPath("work/renamed.ipynb");
      const listed = await gatewayGet("/api/sessions");
      check(listed.length === 1 && listed[0].path === "work/renamed.ipynb", "the rename is kept", listed);
      check(listed[0].kernel.id === kernel && listed[0].type === "notebook", "same kernel, same type", listed);

      await session.shutdown(); // DELETE /api/sessions/{id}: "Shut Down Kernel" in JupyterLab
      check((await gatewayGet("/api/sessions")).length === 0, "the session is gone");
      const after = await conv.ok("execute", { code: "x_agent" });
      check(/^1\s*$/m.test(after.text), "the agent's kernel outlives the notebook's session", after.text);
      return { note: clip(r.text, 400) };
    } finally {
      lab.dispose();
    }
  },

  /** A notebook's whole life with @jupyterlab/services alone: start (a new kernel), run, change
   *  kernel, restart, shut down; nothing is left on the gateway. */
  async notebook_lifecycle() {
    const lab = jupyterlabManagers();
    try {
      await lab.sessionManager.ready;
      const session = await lab.sessionManager.startNew({
        path: "lab/life.ipynb", name: "life.ipynb", type: "notebook", kernel: { name: "python3" },
      });
      const first = session.kernel.id;
      check((await labRun(session, "y = 7")).status === "ok", "a cell runs on the session's new kernel");
      const again = await lab.sessionManager.startNew({ path: "lab/life.ipynb", type: "notebook", kernel: { name: "python3" } });
      check(again.id === session.id && again.kernel.id === first, "a second start on the same path gets the same session");
      again.dispose();

      await session.changeKernel({ name: "python3" });
      const second = session.kernel.id;
      check(second && second !== first, "changeKernel starts a new kernel", { first, second });
      const ids = (await gatewayGet("/api/kernels")).map((k) => k.id);
      check(!ids.includes(first), "the session's old kernel, which it started, is shut down", ids);
      const fresh = await labRun(session, "print('y' in globals())");
      check(fresh.stdout === "False\n", "the new kernel is fresh", fresh);

      await labRun(session, "z = 1");
      await session.kernel.restart();
      const restarted = await labRun(session, "print('z' in globals())");
      check(restarted.stdout === "False\n", "a restart gives a fresh interpreter", restarted);
      check(session.kernel.id === second, "a restart keeps the kernel's id");

      await session.shutdown();
      const left = (await gatewayGet("/api/kernels")).map((k) => k.id);
      check(!left.includes(second), "shutting the session down stops the kernel it started", left);
      await lab.sessionManager.refreshRunning();
      check([...lab.sessionManager.running()].length === 0, "no session is left");
      return { kernels: [first, second] };
    } finally {
      lab.dispose();
    }
  },

  /** inspectors.py through connect: a note, a block (the cell does not run), a crashing
   *  inspector (the cell runs anyway). Uses its own config dir. */
  async inspectors(conv) {
    await connectFresh(conv);
    const note = await conv.ok("execute", { code: "e2e_note_me = 1\nprint('ran')" });
    check(note.text.includes("e2e-note: e2e_note_me"), "the inspector's note is in the reply", note.text);
    check(note.text.indexOf("e2e-note") < note.text.indexOf("ran"), "the note comes before the output", note.text);
    const block = await conv.call("execute", { code: "e2e_blocked = 1\ne2e_forbidden()" });
    check(block.text.includes("RuleBlock") || /block/i.test(block.text), "the block is reported", block.text);
    check(block.text.includes("e2e_forbidden is not allowed"), "the block's message is in the reply", block.text);
    const probe = await conv.ok("execute", { code: "'e2e_blocked' in globals()" });
    check(probe.text.includes("False"), "the blocked cell did not run", probe.text);
    const crash = await conv.ok("execute", { code: "e2e_crash = 7\ne2e_crash" });
    check(crash.text.includes("inspector error (cell runs anyway)"), "the crash is noted", crash.text);
    check(crash.text.includes("7"), "the cell ran despite the crash", crash.text);
    return { block: clip(block.text, 300) };
  },

  /** A broken inspectors.py makes connect fail, and the kernel is stopped. */
  async inspectors_broken(conv) {
    const before = new Set((await gatewayGet("/api/kernels")).map((k) => k.id));
    const r = await conv.call("connect", {});
    check(r.text.includes("inspectors.py"), "connect says inspectors.py failed to load", r.text);
    check(!r.text.includes("created kernel") || /fail|error|stopped/i.test(r.text), "connect failed", r.text);
    let leaked = [];
    for (let i = 0; i < 50; i++) {
      leaked = (await gatewayGet("/api/kernels")).map((k) => k.id).filter((id) => !before.has(id));
      if (leaked.length === 0) break;
      await sleep(100);
    }
    check(leaked.length === 0, "the kernel was stopped", leaked);
    const exec = await conv.call("execute", { code: "1+1" });
    // With no current kernel, execute makes an auto kernel: that fails the same way.
    check(!/^2\s*$/m.test(exec.text.split("\n")[0]), "no kernel runs uninspected", exec.text);
    return { isError: !!r.result.isError, text: clip(r.text, 300) };
  },

  /** display() output reaches the agent: a displayed str, HTML as readable text (not its
   *  `<... object>` repr), Markdown as is, and stdout, stderr and display_data in the order the
   *  kernel sent them, stderr in its own block. */
  async display_outputs(conv) {
    await connectFresh(conv);
    const plain = await conv.ok("execute", { code: "display('hello display')" });
    noEmptyText(plain.result);
    check(plain.text.includes("hello display"), "display('hello display') shows its text", plain.text);
    check(!plain.text.includes("(no output)"), "display() is output", plain.text);

    const html = await conv.ok("execute", {
      code: "from IPython.display import HTML, Markdown\ndisplay(HTML('<b>x</b>'))",
    });
    noEmptyText(html.result);
    check(html.text.trim() === "x", "display(HTML('<b>x</b>')) reads 'x'", html.text);

    const md = await conv.ok("execute", { code: "display(Markdown('# Title\\n\\nsome *emphasis*'))" });
    noEmptyText(md.result);
    check(md.text.includes("# Title") && md.text.includes("some *emphasis*"), "Markdown comes as is", md.text);
    check(!/object>/.test(md.text), "not the default repr", md.text);

    const code = [
      "import sys",
      "print('one-out', flush=True)",
      "print('two-err', file=sys.stderr, flush=True)",
      "display('three-display')",
      "print('four-out', flush=True)",
      "print('five-err', file=sys.stderr, flush=True)",
    ].join("\n");
    const mixed = await conv.ok("execute", { code });
    noEmptyText(mixed.result);
    const t = mixed.text;
    const at = ["one-out", "two-err", "three-display", "four-out", "five-err"].map((s) => t.indexOf(s));
    check(at.every((i) => i >= 0), "every output is in the reply", t);
    check(at.every((i, k) => k === 0 || at[k - 1] < i), "outputs come in the order the kernel sent them", t);
    check(/<stderr>\s*two-err\s*<\/stderr>/.test(t) && /<stderr>\s*five-err\s*<\/stderr>/.test(t),
      "stderr is in its own <stderr> blocks", t);
    check(/<stdout>\s*one-out\s*<\/stdout>/.test(t), "stdout is in a <stdout> block of its own", t);
    return { html: html.text, mixed: clip(t, 400) };
  },

  /** Images in place among the text, no empty text block (after an image or anywhere), and a
   *  matplotlib figure as the cell's last expression (an execute_result and, from the inline
   *  backend, a display_data of the same PNG) sent once. */
  async inline_images(conv) {
    await connectFresh(conv);
    const setup = [
      "import matplotlib",
      "import matplotlib.pyplot as plt",
      "%matplotlib inline",
    ].join("\n");
    await conv.ok("execute", { code: setup, timeout: 110 });
    const between = [
      "print('before the plot', flush=True)",
      "f = plt.figure(figsize=(2, 2)); plt.plot([1, 2, 3]); display(f); plt.close(f)",
      "print('after the plot', flush=True)",
    ].join("\n");
    const r1 = await conv.ok("execute", { code: between });
    noEmptyText(r1.result);
    const b1 = r1.result.content;
    const img = b1.findIndex((b) => b.type === "image");
    check(img > 0 && b1.filter((b) => b.type === "image").length === 1, "one image block", b1.map((b) => b.type));
    const textBefore = b1.slice(0, img).filter((b) => b.type === "text").map((b) => b.text).join("\n");
    const textAfter = b1.slice(img + 1).filter((b) => b.type === "text").map((b) => b.text).join("\n");
    check(textBefore.includes("before the plot") && !textBefore.includes("after the plot"),
      "the text printed before the image comes before it", b1.map((b) => b.text || b.type));
    check(textAfter.includes("after the plot"), "the text printed after the image comes after it",
      b1.map((b) => b.text || b.type));

    const last = await conv.ok("execute", {
      code: "g = plt.figure(figsize=(2, 2)); plt.plot([3, 1]); display(g); plt.close(g)",
    });
    noEmptyText(last.result);
    const b2 = last.result.content;
    check(b2.filter((b) => b.type === "image").length === 1, "one image block", b2.map((b) => b.type));

    const fig = await conv.ok("execute", {
      code: "fig, ax = plt.subplots(figsize=(2, 2))\nax.plot([1, 2, 3])\nfig",
    });
    noEmptyText(fig.result);
    const b3 = fig.result.content;
    check(b3.filter((b) => b.type === "image").length === 1, "the figure as the last expression is sent once",
      b3.map((b) => b.type));
    return { between: b1.map((b) => b.type), last: b2.map((b) => b.type), fig: b3.map((b) => b.type) };
  },
};

/** No text block of a reply is empty or blank (a model's API rejects an empty text block). */
function noEmptyText(result) {
  const blocks = result.content || [];
  const empty = blocks.findIndex((b) => b.type === "text" && !(b.text || "").trim());
  check(empty < 0, `no empty text block (block ${empty} of ${blocks.length} is)`,
    blocks.map((b) => (b.type === "text" ? b.text : b.type)));
}

const INSPECTORS_SAMPLE = `
import ast

def note(tree):
    if any(isinstance(n, ast.Name) and n.id == "e2e_note_me" for n in ast.walk(tree)):
        return "e2e-note: e2e_note_me seen"

def block(tree, src):
    if "e2e_forbidden(" in src:
        raise RuleBlock("e2e_forbidden is not allowed")

def crash(tree):
    if any(isinstance(n, ast.Name) and n.id == "e2e_crash" for n in ast.walk(tree)):
        raise ValueError("e2e inspector bug")

inspectors = [note, block, crash]
`;

const OWN_CONFIG = {
  inspectors: { "inspectors.py": INSPECTORS_SAMPLE },
  inspectors_broken: { "inspectors.py": "import ast\n\ndef inspect(tree:\n    return None\n" },
};

async function pollUntilDone(conv, job) {
  let last = null;
  for (let i = 0; i < 6; i++) {
    last = await conv.ok("poll_job", { job, wait: 10 });
    if (!/\brunning\b/i.test(last.text.split("\n").slice(0, 3).join("\n"))) return last;
  }
  return last;
}

async function newestJob(kernel) {
  const { jobs } = await gatewayGet(`/api/kgate/jobs?kernel=${kernel}`);
  return jobs.length ? jobs.map((j) => j.job).sort((a, b) => jobNumber(a) - jobNumber(b)).pop() : null;
}

// ---------------------------------------------------------------------------------------------
// Driver
// ---------------------------------------------------------------------------------------------

async function runScenario(name) {
  const t0 = Date.now();
  let xdg = null;
  if (OWN_CONFIG[name]) {
    xdg = fs.mkdtempSync(path.join(os.tmpdir(), "kgate-e2e-xdg-"));
    fs.mkdirSync(path.join(xdg, "kgate"));
    for (const [file, text] of Object.entries(OWN_CONFIG[name])) {
      fs.writeFileSync(path.join(xdg, "kgate", file), text);
    }
  }
  const conv = new Conversation(name, { xdg, elicitation: name === "input" });
  const report = { scenario: name, ok: false };
  try {
    await conv.open();
    Object.assign(report, await scenarios[name](conv));
    report.ok = true;
  } catch (err) {
    report.error = err instanceof Failure ? err.message : String(err && err.stack || err);
  } finally {
    try {
      await conv.close();
    } catch (err) {
      report.ok = false;
      report.error = (report.error ? `${report.error}; ` : "") + String(err.message || err);
    }
    if (xdg) fs.rmSync(xdg, { recursive: true, force: true });
  }
  report.ms = Date.now() - t0;
  if (conv.closeMs !== undefined) report.close_ms = conv.closeMs;
  if (conv.protocolErrors.length) report.protocol_errors = conv.protocolErrors.slice(0, 5);
  if (!report.ok) {
    report.calls = conv.calls;
    report.stderr_tail = conv.stderr.slice(-3000);
  }
  return report;
}

async function main() {
  const args = process.argv.slice(2);
  if (args.includes("--list")) {
    console.log(Object.keys(scenarios).join("\n"));
    return 0;
  }
  const names = args.length ? args : Object.keys(scenarios);
  const unknown = names.filter((n) => !scenarios[n]);
  if (unknown.length) {
    console.error(`unknown scenario(s): ${unknown.join(", ")}; known: ${Object.keys(scenarios).join(", ")}`);
    return 2;
  }
  let failed = 0;
  for (const name of names) {
    const report = await runScenario(name);
    if (!report.ok) failed++;
    console.log(JSON.stringify(report));
  }
  return failed ? 1 : 0;
}

process.exitCode = await main();
