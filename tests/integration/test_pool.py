"""The warm pool and max_kernels (docs/kernels.md "Warm pool", docs/dev/kernel-lifecycle.md "Warm pool"): POST /api/kernels is
answered with a kernel started ahead of time, which takes the request's cwd and env at hand-out;
the pool refills in the background and hides its kernels; a request the pool cannot serve starts
cold; max_kernels counts starts still pending and answers 503 with Retry-After; SIGHUP reloads
the pool size, max_kernels and the token."""

import os
import signal
import threading
import time

from conftest import Kgate, cmdline_of, wait_until

READY_WAIT = 30  # a pooled kernel's start on a loaded 2-core machine


def write_config(path, text):
    path.write_text(text)
    return path


def pool_status(kg):
    status, _, body = kg.rest("GET", "/api/kgate/pool")
    assert status == 200, body
    return body


def python3_pool(kg):
    return pool_status(kg)["kernels"].get("python3", {})


def wait_ready(kg, n=1, timeout=READY_WAIT):
    got = wait_until(lambda: python3_pool(kg).get("ready", 0) >= n, timeout, interval=0.1)
    assert got, f"pool never had {n} ready kernel(s): {pool_status(kg)}\n{kg.log_tail()}"


def listed_ids(kg):
    status, _, body = kg.rest("GET", "/api/kernels")
    assert status == 200, body
    return {m["id"] for m in body}


def pooled_pids(kg):
    """Kernels still in the pool: their argv names a pool-<id>.json that still exists (a
    handed-out kernel's file was renamed kernel-<id>.json; its argv keeps the old name)."""
    return {pid for pid in kg.children()
            if any(os.path.basename(a).startswith("pool-") and os.path.exists(a) for a in cmdline_of(pid))}


def test_post_answers_with_a_pooled_kernel_that_takes_cwd_and_env(kgate_factory, tmp_path):
    kg = kgate_factory()
    wait_ready(kg)
    assert listed_ids(kg) == set(), "a pooled kernel is listed before it is handed out"
    assert list(kg.runtime_dir.glob("kernel-*.json")) == [], "a pooled kernel has a kernel-*.json file"
    assert len(list(kg.runtime_dir.glob("pool-*.json"))) == 1
    before = python3_pool(kg)
    workdir = tmp_path / "work dir é"
    workdir.mkdir()
    (workdir / "pool_mod_x.py").write_text("VALUE = 7\n")
    model = kg.start_kernel({"name": "python3", "cwd": str(workdir),
                             "env": {"KGATE_POOL_TEST": "a \"quoted\" value\nwith a newline ✓"}})
    assert model["execution_state"] == "idle", model
    after = python3_pool(kg)
    assert after["handed_out"] == before["handed_out"] + 1, (before, after)
    assert kg.connection_file(model["id"]).is_file(), "the handed-out kernel has no kernel-<id>.json"
    with kg.connect(model["id"]) as ws:
        r = ws.execute("import os, subprocess\n"
                       "print(os.getcwd())\n"
                       "print(repr(os.environ['KGATE_POOL_TEST']))\n"
                       "print(subprocess.run(['sh', '-c', 'pwd; echo \"$KGATE_POOL_TEST\"'], capture_output=True, text=True).stdout)\n"
                       "import sys, pool_mod_x\n"
                       f"print(pool_mod_x.VALUE, {str(kg.root)!r} in sys.path, {str(workdir)!r} in sys.path)")
        assert r.status == "ok", r
        # The hand-out is silent: the user's first cell is In[1].
        assert r.reply["content"]["execution_count"] == 1, r.reply
    lines = r.stdout.splitlines()
    assert lines[0] == str(workdir), lines
    assert lines[1] == repr("a \"quoted\" value\nwith a newline ✓"), lines
    assert lines[2] == str(workdir), lines  # a child process starts in it...
    assert lines[3:5] == ["a \"quoted\" value", "with a newline ✓"], lines  # ...and inherits the env
    # sys.path: the directory kgate started the kernel in is replaced by the requested one.
    assert lines[-1] == "7 False True", lines
    kg.delete_kernel(model["id"])


def test_pool_refills_and_hides_its_kernels(kgate_factory):
    kg = kgate_factory()
    wait_ready(kg)
    first = pooled_pids(kg)
    assert len(first) == 1, first
    model = kg.start_kernel()
    # The handed-out kernel is the process that was pooled.
    assert kg.kernel_pid(model["id"]) in first
    wait_ready(kg)
    again = pooled_pids(kg)
    assert len(again) == 1 and again != first, (first, again)
    assert listed_ids(kg) == {model["id"]}
    # A pooled kernel that dies is replaced, and is never listed.
    os.kill(next(iter(again)), signal.SIGKILL)
    assert wait_until(lambda: (lambda p: len(p) == 1 and p != again)(pooled_pids(kg)), READY_WAIT), \
        kg.log_tail()
    wait_ready(kg)
    assert listed_ids(kg) == {model["id"]}
    kg.delete_kernel(model["id"])


def test_refill_waits_until_the_kernels_are_quiet(kgate_factory):
    """A kernel start takes a core for about a second: after a hand-out the refill waits until
    no visible kernel is busy (or has had activity for 1 s), so the user's first cells do not
    share the machine with it."""
    kg = kgate_factory()
    wait_ready(kg)
    model = kg.start_kernel()
    with kg.connect(model["id"]) as ws:
        pending = ws.execute_async("import time\nfor i in range(8):\n    print(i, flush=True)\n    time.sleep(0.5)")
        time.sleep(2.5)
        during = python3_pool(kg)
        assert during["ready"] == 0 and during["starting"] == 0 and during["refill_waits"], during
        assert pooled_pids(kg) == set(), "the refill started while the handed-out kernel was busy"
        r = ws.collect(pending, timeout=30)
        assert r.status == "ok", r
    wait_ready(kg)
    assert python3_pool(kg)["refill_waits"] is False
    kg.delete_kernel(model["id"])


def test_startup_only_env_starts_cold(kgate_factory, tmp_path):
    kg = kgate_factory()
    wait_ready(kg)
    before = python3_pool(kg)
    model = kg.start_kernel({"name": "python3", "env": {"PYTHONPATH": str(tmp_path)}})
    after = python3_pool(kg)
    assert after["cold_starts"] == before["cold_starts"] + 1, (before, after)
    assert after["handed_out"] == before["handed_out"], (before, after)
    with kg.connect(model["id"]) as ws:
        r = ws.execute(f"import sys; assert {str(tmp_path)!r} in sys.path, sys.path")
        assert r.status == "ok", r
    assert any("cold, not from the pool (env PYTHONPATH" in line for line in kg.log_lines), kg.log_tail()
    kg.delete_kernel(model["id"])


def test_pool_size_zero_and_per_spec(kgate_factory, tmp_path):
    cfg = write_config(tmp_path / "k.toml", "[pool]\nsize = 0\n")
    kg = kgate_factory(config=cfg)
    time.sleep(1.5)
    assert python3_pool(kg) == {} and pooled_pids(kg) == set(), pool_status(kg)
    cfg2 = write_config(tmp_path / "k2.toml", "[pool]\nsize = 0\n[pool.kernels]\npython3 = 2\n")
    kg2 = kgate_factory(config=cfg2)
    wait_ready(kg2, 2)
    assert len(pooled_pids(kg2)) == 2


def test_bad_pool_config_is_refused(kgate_factory, tmp_path, kgate_bin):
    import subprocess
    for text, needle in (("[pool]\nsize = 99\n", "pool.size: must be between 0 and 16"),
                         ("[pool]\nsize = -1\n", "pool.size: must be between 0 and 16"),
                         ("[pool]\nwarm = 1\n", "pool.warm: unknown key"),
                         ("[pool.kernels]\npython3 = \"two\"\n", "pool.kernels.python3: must be an integer"),
                         ("[limits]\nmax_kernels = -3\n", "limits.max_kernels: must be between")):
        cfg = write_config(tmp_path / "bad.toml", text)
        p = subprocess.run([kgate_bin, "serve", "--port", "0", "--config", str(cfg)],
                           capture_output=True, text=True, timeout=20)
        assert p.returncode == 2, (text, p.returncode, p.stderr)
        assert needle in p.stderr, (text, p.stderr)


def concurrent_posts(kg, n):
    results = [None] * n

    def one(i):
        results[i] = kg.rest("POST", "/api/kernels", {"name": "python3"}, timeout=90)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_max_kernels_plus_one_concurrent_creates_give_one_503(kgate_factory, tmp_path):
    cfg = write_config(tmp_path / "k.toml", "[limits]\nmax_kernels = 3\n")
    kg = kgate_factory(config=cfg)
    wait_ready(kg)
    results = concurrent_posts(kg, 4)
    codes = sorted(r[0] for r in results)
    assert codes == [201, 201, 201, 503], [(r[0], r[2]) for r in results]
    refused = next(r for r in results if r[0] == 503)
    assert refused[1].get("Retry-After") == "5", dict(refused[1])
    assert "max_kernels" in refused[2]["message"] and "3" in refused[2]["message"], refused[2]
    ids = [r[2]["id"] for r in results if r[0] == 201]
    for kid in ids:
        kg._kernels.add(kid)
    assert listed_ids(kg) == set(ids)
    # A slot frees when a kernel goes.
    status, _, body = kg.rest("POST", "/api/kernels", {"name": "python3"})
    assert status == 503, body
    kg.delete_kernel(ids[0])
    model = kg.start_kernel()
    kg.delete_kernel(model["id"])
    # A start that fails gives its slot back: an unknown kernelspec is a 404, not a leak.
    for _ in range(3):
        status, _, body = kg.rest("POST", "/api/kernels", {"name": "no-such-spec"})
        assert status == 404, body
    model = kg.start_kernel()
    kg.delete_kernel(model["id"])


def test_sighup_reloads_pool_max_kernels_and_token(kgate_factory, tmp_path):
    cfg = write_config(tmp_path / "k.toml", "[pool]\nsize = 0\n")
    kg = kgate_factory(config=cfg)
    assert python3_pool(kg).get("ready", 0) == 0
    write_config(cfg, "[pool]\nsize = 2\n[limits]\nmax_kernels = 1\n[kernel]\nheartbeat_misses = 7\n")
    kg.proc.send_signal(signal.SIGHUP)
    wait_ready(kg, 2)
    assert pool_status(kg)["max_kernels"] == 1
    assert wait_until(lambda: any("SIGHUP: [kernel] and the kernel limits changed; it takes a restart" in l for l in kg.log_lines), 5), \
        kg.log_tail()
    model = kg.start_kernel()
    status, hdrs, body = kg.rest("POST", "/api/kernels", {"name": "python3"})
    assert status == 503 and hdrs.get("Retry-After"), body
    kg.delete_kernel(model["id"])
    # A broken file changes nothing.
    write_config(cfg, "[pool]\nsize = 'x'\n")
    kg.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: any("keeping the running settings" in l for l in kg.log_lines), 5), kg.log_tail()
    assert pool_status(kg)["max_kernels"] == 1
    # The token, from the file.
    write_config(cfg, "[server]\ntoken = \"sekrit-reloaded\"\n[pool]\nsize = 0\n")
    kg.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: kg.rest("GET", "/api/kernels")[0] in (401, 403), 5), kg.log_tail()
    status, _, _ = kg.rest("GET", "/api/kernels", headers={"Authorization": "token sekrit-reloaded"})
    assert status == 200
    assert not any("sekrit-reloaded" in line for line in kg.log_lines), "the token was logged"
    assert wait_until(lambda: pooled_pids(kg) == set(), 15), pooled_pids(kg)


def test_culling_leaves_pooled_kernels_alone(kgate_factory, tmp_path):
    cfg = write_config(tmp_path / "k.toml", "[culling]\ncull_idle_timeout = 1\ncull_interval = 1\n")
    kg = kgate_factory(config=cfg)
    wait_ready(kg)
    pids = pooled_pids(kg)
    time.sleep(3.5)
    assert pooled_pids(kg) == pids, kg.log_tail()
    assert python3_pool(kg)["ready"] == 1
    # ...and the handed-out kernel's idle time starts at hand-out, not at its start.
    model = kg.start_kernel()
    status, _, ext = kg.rest("GET", f"/api/kgate/kernels/{model['id']}")
    assert status == 200 and ext["age_seconds"] < 1.5, ext


def test_stop_removes_pooled_kernels(kgate_factory):
    from conftest import pid_alive
    kg = kgate_factory()
    wait_ready(kg)
    pids = pooled_pids(kg)
    assert pids
    assert kg.stop() == 0
    assert list(kg.runtime_dir.glob("pool-*.json")) == []
    assert wait_until(lambda: not any(pid_alive(p) for p in pids), 10), pids


def test_startup_only_env_with_the_pools_own_value_is_served_warm(kgate_bin, tmp_path_factory):
    """A PYTHON* variable is no obstacle when the request asks for the value the warm kernels
    started with (kgate-mcp sends its whole environment, which shares such variables with kgate's)."""
    kg = Kgate(kgate_bin, tmp_path_factory.mktemp("kgate"))
    kg.env["PYTHONKGATEPOOLTEST"] = "same"
    kg.start()
    try:
        wait_ready(kg)
        before = python3_pool(kg)
        model = kg.start_kernel({"name": "python3", "env": {"PYTHONKGATEPOOLTEST": "same"}})
        after = python3_pool(kg)
        assert after["handed_out"] == before["handed_out"] + 1, (before, after)
        assert after["cold_starts"] == before["cold_starts"], (before, after)
        kg.delete_kernel(model["id"])
        wait_ready(kg)
        before = python3_pool(kg)
        model = kg.start_kernel({"name": "python3", "env": {"PYTHONKGATEPOOLTEST": "other"}})
        after = python3_pool(kg)
        assert after["cold_starts"] == before["cold_starts"] + 1, (before, after)
        assert any("not from the pool (env PYTHONKGATEPOOLTEST is read only when a Python process starts, "
                   "and the warm kernels have another value)" in line for line in kg.log_lines), kg.log_tail()
        with kg.connect(model["id"]) as ws:
            r = ws.execute("import os; assert os.environ['PYTHONKGATEPOOLTEST'] == 'other'")
            assert r.status == "ok", r
        kg.delete_kernel(model["id"])
        # PYTHONDONTWRITEBYTECODE and PYTHONUNBUFFERED are taken on at hand-out, whatever kgate has.
        wait_ready(kg)
        before = python3_pool(kg)
        model = kg.start_kernel({"name": "python3", "env": {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}})
        after = python3_pool(kg)
        assert after["handed_out"] == before["handed_out"] + 1, (before, after)
        with kg.connect(model["id"]) as ws:
            r = ws.execute("import os, sys; assert sys.dont_write_bytecode and os.environ['PYTHONUNBUFFERED'] == '1'")
            assert r.status == "ok", r
        kg.delete_kernel(model["id"])
    finally:
        kg.cleanup_kernels()
        kg.stop()
