"""Many cold starts at once on a loaded machine: every POST /api/kernels gets a ready kernel.

The readiness handshake (kernel_info_reply, a live iopub subscription, stdin's handshake) must
hold when kernels answer slowly: 40 kernels are started 4 at a time with no warm pool, every
one of them must answer 201 and then run a cell, and none may fail."""

import concurrent.futures
import time

TOTAL = 40
AT_ONCE = 4


def test_forty_cold_starts_four_at_a_time_all_become_ready(kgate_factory, tmp_path):
    config = tmp_path / "kgate.toml"
    # No warm pool: every start is cold, so every one runs the whole readiness handshake.
    config.write_text("[pool]\nsize = 0\n")
    kg = kgate_factory(config=config)
    failures, ids, took = [], [], []

    def start(n):
        began = time.monotonic()
        status, _, body = kg.rest("POST", "/api/kernels", {"name": "python3"}, timeout=120)
        return n, status, body, time.monotonic() - began

    try:
        with concurrent.futures.ThreadPoolExecutor(AT_ONCE) as pool:
            for first in range(0, TOTAL, AT_ONCE):
                for n, status, body, secs in pool.map(start, range(first, first + AT_ONCE)):
                    took.append(secs)
                    if status == 201:
                        ids.append(body["id"])
                        # Ready means idle: the busy/idle of kgate's own readiness requests that
                        # arrive after the reply must not make the model say busy.
                        if body["execution_state"] != "idle":
                            failures.append((n, status, body["execution_state"]))
                    else:
                        failures.append((n, status, body))
        assert not failures, (f"{len(failures)} of {TOTAL} starts failed: {failures[:3]}\n"
                              f"{kg.log_tail(40)}")
        assert len(ids) == TOTAL and len(set(ids)) == TOTAL
        # Every kernel is really usable: a cell on each (one websocket at a time).
        for kid in ids:
            with kg.connect(kid) as ws:
                r = ws.execute("print(6 * 7)")
                assert r.status == "ok", r
                assert "42" in r.stdout, r
    finally:
        for kid in ids:
            kg.delete_kernel(kid, check=False)
    took.sort()
    print(f"{TOTAL} cold starts, {AT_ONCE} at a time: median {took[len(took) // 2]:.2f} s, "
          f"max {took[-1]:.2f} s")
