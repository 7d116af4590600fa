"""The heartbeat: a stopped kernel (SIGSTOP) shows as unresponsive in its model within a few
missed pings, and responsive again after SIGCONT; the work it was doing is not lost.  (A dead
kernel's verdict, and the heartbeat's alone, are unit tests: tests/unit/kernel/test_kernel.cpp.)"""
import os
import signal
import time

from conftest import wait_until

INTERVAL_MS = 200
MISSES = 3


def daemon(kgate_factory, tmp_path):
    cfg = tmp_path / "kgate.toml"
    cfg.write_text(f"[kernel]\nheartbeat_interval_ms = {INTERVAL_MS}\nheartbeat_misses = {MISSES}\n")
    return kgate_factory(config=cfg)


def test_sigstop_makes_the_kernel_unresponsive_and_sigcont_brings_it_back(kgate_factory, tmp_path):
    kg = daemon(kgate_factory, tmp_path)
    kid = kg.start_kernel()["id"]
    model = kg.kernel_model(kid)
    assert model["responsive"] is True and "silent_seconds" not in model, model
    pid = kg.kernel_pid(kid)
    with kg.connect(kid) as ws:
        assert ws.run("print('before')") == "before\n"
        r = ws.execute_async("import time\nfor i in range(6):\n    print(i, flush=True)\n    time.sleep(0.5)\n")
        r.add(ws.wait_for(lambda m: m.get("msg_type") == "stream" and
                          m.get("parent_header", {}).get("msg_id") == r.msg_id, 20, what="the cell's first output"))
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            assert wait_until(lambda: kg.kernel_model(kid)["responsive"] is False, 15), kg.kernel_model(kid)
            took = time.monotonic() - stopped_at
            # MISSES pings unanswered, one interval apart; generous for a loaded machine
            assert took >= (MISSES - 1) * INTERVAL_MS / 1000, f"unresponsive after only {took:.2f}s"
            model = kg.kernel_model(kid)
            assert model["execution_state"] == "busy", model  # the state is the kernel's last word
            assert model["silent_seconds"] >= (MISSES - 1) * INTERVAL_MS / 1000, model
            ext = kg.rest("GET", f"/api/kgate/kernels/{kid}")[2]
            assert ext["responsive"] is False, ext
            assert any("unresponsive" in line and kid in line for line in kg.log_lines), kg.log_tail()
            time.sleep(0.5)
            assert kg.kernel_model(kid)["silent_seconds"] > model["silent_seconds"], "silent_seconds must grow"
        finally:
            os.kill(pid, signal.SIGCONT)
        assert wait_until(lambda: kg.kernel_model(kid)["responsive"] is True, 15), kg.kernel_model(kid)
        assert "silent_seconds" not in kg.kernel_model(kid)
        assert any("heartbeat is back" in line for line in kg.log_lines), kg.log_tail()
        # nothing the stopped cell was doing is lost: it finishes with all its output
        ws.collect(r, timeout=30)
        assert r.status == "ok" and r.stdout == "".join(f"{i}\n" for i in range(6)), r
        assert ws.run("print('after')") == "after\n"
    kg.delete_kernel(kid)

