"""A client that stops reading keeps its connection: past its queue limit its output is held
(bounded) and comes through in order, exactly once, when it reads again; past the hold limit
the oldest is dropped and the client is told how much.  A request still pending when its
kernel dies gets exactly one (error) reply."""
import os
import signal
import time
import uuid

import pytest

CHUNKS = 300
CHUNK = 50_000
# Each chunk starts with its number, so order and duplicates are checked, not just size.
FLOOD = (f"import sys, time\nfor i in range({CHUNKS}):\n"
         f"    sys.stdout.write('%06d' % i + 'x' * {CHUNK - 7} + '\\n'); sys.stdout.flush(); time.sleep(0.002)\n")


def parent_id(m):
    return (m.get("parent_header") or {}).get("msg_id")


def daemon_with(kgate_factory, tmp_path, limits):
    cfg = tmp_path / "kgate.toml"
    cfg.write_text("[limits]\n" + "".join(f"{k} = {v}\n" for k, v in limits.items()))
    return kgate_factory(config=cfg)


def stall_then_read(kg, kid, stall):
    ws = kg.connect(kid, session_id="slow-" + uuid.uuid4().hex)
    try:
        ws.wait_reply(ws.request("kernel_info_request"))
        r = ws.execute_async(FLOOD)
        time.sleep(stall)  # not reading
        got = []
        ws.wait_for(lambda m: (got.append(m) or True) and parent_id(m) == r.msg_id
                    and m.get("msg_type") == "status"
                    and m["content"].get("execution_state") == "idle", 120,
                    what="the flood's idle status")
    finally:
        ws.close()
    return got, r


def stdout_of(msgs, r):
    return "".join(m["content"]["text"] for m in msgs
                   if m.get("msg_type") == "stream" and parent_id(m) == r.msg_id
                   and m["content"].get("name") == "stdout")


def test_slow_reader_gets_everything_in_order_exactly_once(kgate_factory, tmp_path):
    kg = daemon_with(kgate_factory, tmp_path, {"client_queue_bytes": 1 << 20})
    kid = kg.start_kernel()["id"]
    got, r = stall_then_read(kg, kid, 4)
    assert any("reads slowly" in line for line in kg.log_lines), kg.log_tail()
    text = stdout_of(got, r)
    assert len(text) == CHUNKS * CHUNK, (len(text), CHUNKS * CHUNK)
    assert [int(line[:6]) for line in text.splitlines()] == list(range(CHUNKS)), "out of order or doubled"
    assert not [m for m in got if m.get("msg_type") == "stream" and "[kgate]" in m["content"]["text"]]
    kg.delete_kernel(kid)


def test_slow_reader_past_the_hold_limit_is_told_what_was_dropped(kgate_factory, tmp_path):
    kg = daemon_with(kgate_factory, tmp_path, {"client_queue_bytes": 1 << 20, "replay_bytes": 2 << 20})
    kid = kg.start_kernel()["id"]
    got, r = stall_then_read(kg, kid, 5)
    notes = [m["content"]["text"] for m in got
             if m.get("msg_type") == "stream" and m["content"].get("name") == "stderr"
             and "[kgate]" in m["content"]["text"]]
    assert notes and all("dropped" in n for n in notes), notes
    # One note per gap: a client that catches up and falls behind again (a loaded machine) gets
    # two, each counting its own.
    dropped = sum(int(n.split("[kgate] ")[1].split(" ")[0]) for n in notes)
    lines = stdout_of(got, r).splitlines()
    numbers = [int(line[:6]) for line in lines]
    assert numbers == sorted(set(numbers)), "out of order or doubled"
    assert len(numbers) + dropped == CHUNKS, (len(numbers), dropped, notes)
    kg.delete_kernel(kid)


def test_pending_request_fails_when_the_kernel_dies(kgate, kernel):
    ws = kgate.connect(kernel)
    try:
        pid = kgate.kernel_pid(kernel)
        r = ws.execute_async("import time; time.sleep(60)")
        ws.wait_for(lambda m: m.get("msg_type") == "execute_input" and parent_id(m) == r.msg_id, 10,
                    what="execute_input")
        os.kill(pid, signal.SIGKILL)
        reply = ws.wait_reply(r.msg_id, "execute_reply", timeout=5)
        assert reply["content"]["status"] == "error", reply
        assert reply["content"]["ename"] == "KernelDied", reply
        # exactly one reply: nothing else parented to the request arrives afterwards
        more = [m for m in ws.drain(1.0) if m.get("msg_type") == "execute_reply" and parent_id(m) == r.msg_id]
        assert not more, more
        # and a new request to the dead kernel is answered at once, with the reason
        reply2 = ws.wait_reply(ws.request("kernel_info_request"), "kernel_info_reply", timeout=5)
        assert reply2["content"]["status"] == "error" and "dead" in reply2["content"]["evalue"], reply2
    finally:
        ws.close()
