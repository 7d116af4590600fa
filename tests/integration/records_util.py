"""Helpers for test_records.py: the kgate session-records extension (docs/records.md, "Session records:
the kgate extensions"), driven through real sockets only."""

import json
import queue
import socket
import time
from urllib.parse import quote, urlencode

import websocket
from jupyter_client import BlockingKernelClient


def job_num(job_id):
    assert isinstance(job_id, str) and job_id.startswith("job-"), f"not a job id: {job_id!r}"
    return int(job_id[4:])


def records_config(tmp_path, **records):
    """A kgate.toml with a [records] section."""
    cfg = tmp_path / "kgate.toml"
    cfg.write_text("[records]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in records.items()))
    return cfg


# --------------------------------------------------------------------------
# REST calls
# --------------------------------------------------------------------------

def agent_execute(kg, kid, code, agent, label=None, wait=None, origin=None, timeout=60, background=None):
    """POST /api/kgate/kernels/{id}/execute; returns (status, body)."""
    body = {"code": code, "agent": agent}
    if background is not None:
        body["background"] = background
    if label is not None:
        body["label"] = label
    if wait is not None:
        body["wait"] = wait
    if origin is not None:
        body["origin"] = origin
    status, _, reply = kg.rest("POST", f"/api/kgate/kernels/{kid}/execute", body, timeout=timeout)
    return status, reply


def agent_run(kg, kid, code, agent, label=None, wait=20, **kw):
    """An agent cell that must be accepted; returns the record (waited for up to `wait` s)."""
    status, rec = agent_execute(kg, kid, code, agent, label=label, wait=wait, **kw)
    assert status == 200, f"agent execute {code!r} as {agent!r} -> {status} {rec!r}\n{kg.log_tail(30)}"
    assert isinstance(rec, dict) and "job" in rec, rec
    return rec


def get_job(kg, job, wait=None, timeout=None):
    path = f"/api/kgate/jobs/{job}" + (f"?wait={wait}" if wait is not None else "")
    status, _, rec = kg.rest("GET", path, timeout=timeout or (60 + (wait or 0)))
    assert status == 200, f"GET {path} -> {status} {rec!r}"
    return rec


def wait_job_end(kg, job, timeout=30):
    """The record once it is no longer running (long polls with ?wait=)."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        rec = get_job(kg, job, wait=max(1, min(10, int(remaining + 0.999))))
        if rec["status"] != "running":
            return rec
        if time.monotonic() >= deadline:
            raise AssertionError(f"{job} still running after {timeout}s: {rec!r}")


def list_jobs(kg, kid, **params):
    q = {"kernel": kid, **params}
    path = "/api/kgate/jobs?" + urlencode(q)
    status, _, body = kg.rest("GET", path, timeout=60 + float(params.get("wait", 0)))
    assert status == 200, f"GET {path} -> {status} {body!r}"
    for key in ("version", "jobs", "restarts"):
        assert key in body, f"GET {path}: no {key!r} in {body!r}"
    return body


def wait_for_job(kg, kid, pred, timeout=15, what="a job"):
    """Poll the kernel's job list until a summary matches pred; returns it."""
    deadline = time.monotonic() + timeout
    while True:
        jobs = list_jobs(kg, kid)["jobs"]
        for j in jobs:
            if pred(j):
                return j
        if time.monotonic() >= deadline:
            raise AssertionError(f"no {what} in the records of {kid} within {timeout}s: {jobs!r}")
        time.sleep(0.05)


def kgate_kernel(kg, kid):
    status, _, model = kg.rest("GET", f"/api/kgate/kernels/{kid}")
    assert status == 200, f"GET /api/kgate/kernels/{kid} -> {status} {model!r}"
    return model


def interrupt_job(kg, job, agent=None):
    body = {} if agent is None else {"agent": agent}
    status, _, reply = kg.rest("POST", f"/api/kgate/jobs/{job}/interrupt", body)
    return status, reply


def digest(kg, kid, agent):
    status, _, body = kg.rest("GET", f"/api/kgate/kernels/{kid}/digest?agent={quote(agent)}")
    assert status == 200, f"digest for {agent} -> {status} {body!r}"
    assert body.get("kernel") == kid, body
    assert isinstance(body.get("jobs"), list) and "evicted_unseen" in body, body
    return body


def digest_ack(kg, kid, agent, jobs):
    status, _, body = kg.rest("POST", f"/api/kgate/kernels/{kid}/digest/ack",
                              {"agent": agent, "jobs": list(jobs)})
    return status, body


def assert_refusal(status, body, code, refusal):
    assert status == code, f"expected {code} {refusal!r}, got {status} {body!r}"
    assert isinstance(body, dict), body
    assert body.get("refusal") == refusal, f"expected refusal {refusal!r}: {body!r}"
    assert isinstance(body.get("message"), str) and body["message"], f"refusal without a message: {body!r}"


# --------------------------------------------------------------------------
# The agent's liveness websocket
# --------------------------------------------------------------------------

class AgentLink:
    """GET /api/kgate/agent?agent=A&label=L held open: the agent is alive while it is."""

    def __init__(self, kg, agent, label):
        q = {"agent": agent, "label": label}
        if kg.token:
            q["token"] = kg.token
        self.url = f"{kg.ws_base}/api/kgate/agent?{urlencode(q)}"
        self.ws = websocket.create_connection(self.url, timeout=10)
        self.hello = json.loads(self.ws.recv())
        assert isinstance(self.hello, dict) and self.hello.get("type") == "hello", self.hello
        self.open = True

    def close_normally(self):
        """A close handshake with code 1000 (the agent exited)."""
        if self.open:
            self.open = False
            self.ws.close(status=websocket.STATUS_NORMAL, timeout=3)

    def drop(self):
        """The TCP connection goes away without a close frame."""
        if self.open:
            self.open = False
            try:
                self.ws.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.ws.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.close_normally()
        except Exception:
            pass


# --------------------------------------------------------------------------
# A client attached straight to the kernel by its connection file
# --------------------------------------------------------------------------

def attach_client(kg, kid):
    """A BlockingKernelClient on the connection file named by GET /api/kgate/kernels/{id}."""
    model = kgate_kernel(kg, kid)
    cf = model.get("connection_file")
    assert cf, f"GET /api/kgate/kernels/{kid} has no connection_file: {model!r}"
    kc = BlockingKernelClient()
    kc.load_connection_file(cf)
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=30)
        resync(kc)
    except Exception:
        kc.stop_channels()
        raise
    return kc


def resync(kc, timeout=15):
    """Wait until kc's iopub SUB receives (the ZMQ slow joiner), so what the kernel publishes
    for kc's next request reaches it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg_id = kc.kernel_info()
        try:
            while True:
                reply = kc.get_shell_msg(timeout=2)
                if reply["parent_header"].get("msg_id") == msg_id:
                    break
            end = time.monotonic() + 1
            while time.monotonic() < end:
                msg = kc.get_iopub_msg(timeout=max(0.01, end - time.monotonic()))
                if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status":
                    return
        except queue.Empty:
            continue
    raise AssertionError(f"attached client's iopub got nothing within {timeout}s")


def kc_run(kc, code, timeout=30):
    """Run code through the attached client; returns (reply content, stdout)."""
    out = []

    def hook(msg):
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            out.append(msg["content"]["text"])

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook, stop_on_error=False)
    return reply["content"], "".join(out)


def kc_finish(kc, msg_id, timeout=30):
    """Wait for the shell reply to msg_id (sent with kc.execute)."""
    deadline = time.monotonic() + timeout
    while True:
        reply = kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"]
