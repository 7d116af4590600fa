"""GET /metrics (docs/metrics.md "Metrics"): Prometheus's text format, parsed with Debian's
prometheus_client parser, and each figure moved by the real thing it counts."""

import time

from prometheus_client.parser import text_string_to_metric_families

import uuid

from records_util import AgentLink, agent_run, attach_client, kc_run, wait_for_job, wait_job_end

TOKEN = "kgate-metrics-token-51c2"


def scrape(kg):
    status, headers, body = kg.http("GET", "/metrics")
    assert status == 200, body
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8", headers
    families = {f.name: f for f in text_string_to_metric_families(body.decode("utf-8"))}
    return families


def value(families, family, sample=None, **labels):
    """The value of one sample (by default the family's own name, or name + _total for a counter)."""
    f = families[family]
    want = sample or (family + "_total" if f.type == "counter" else family)
    found = [s.value for s in f.samples if s.name == want and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (family, want, labels, f.samples)
    return found[0]


def test_metrics_count_what_happens(kgate_factory):
    kg = kgate_factory(token=TOKEN)
    # Behind the token, like every route.
    status, _, _ = kg.http("GET", "/metrics", auth=False)
    assert status == 401

    m0 = scrape(kg)
    (info,) = m0["kgate_build_info"].samples
    assert info.value == 1 and info.labels["version"], info
    assert 0 < time.time() - value(m0, "kgate_start_time_seconds") < 600
    started0 = value(m0, "kgate_kernel_starts")
    for family in ("kgate_kernels", "kgate_kernel_starts", "kgate_kernel_start_failures", "kgate_kernel_restarts",
                   "kgate_executions", "kgate_execution_duration_seconds", "kgate_websocket_connections",
                   "kgate_websocket_sent_bytes", "kgate_websocket_dropped_messages",
                   "kgate_websocket_replayed_messages", "kgate_records_bytes", "kgate_records_evicted",
                   "kgate_pool_hits", "kgate_pool_misses", "kgate_sessions", "kgate_kernel_refused_shutdowns",
                   "kgate_background_tasks", "kgate_kernel_closes"):
        assert family in m0, f"{family} missing from /metrics: {sorted(m0)}"

    kid = kg.start_kernel()["id"]
    a = "metrics-agent-" + uuid.uuid4().hex[:8]
    with AgentLink(kg, a, "metrics"):
        rec = agent_run(kg, kid, "import time\ntime.sleep(0.3)\nprint('x' * 1000)", a)
        assert rec["status"] == "ok", rec
        rec = agent_run(kg, kid, "1/0", a)
        assert rec["status"] == "error", rec
    kc = attach_client(kg, kid)
    try:
        content, _ = kc_run(kc, "print('from the user')")
        assert content["status"] == "ok"
        kc.control_channel.send(kc.session.msg("shutdown_request", {"restart": False}))
        assert kc.get_control_msg(timeout=15)["content"]["status"] == "error"  # refused: counted
        content, _ = kc_run(kc, "%%run_async\nx_task = 1")  # a task: counted
        assert content["status"] == "ok"
        wait_job_end(kg, wait_for_job(kg, kid, lambda j: "from the user" in j["code"], what="the user's cell")["job"])
    finally:
        kc.stop_channels()
    with kg.connect(kid) as ws:
        assert ws.run("print('over the websocket')") == "over the websocket\n"
        m1 = scrape(kg)
        assert value(m1, "kgate_websocket_connections") >= 1
    status, _, _ = kg.rest("POST", f"/api/kernels/{kid}/restart")
    assert status == 200
    status, _, body = kg.rest("POST", "/api/sessions", {"path": "m.ipynb", "type": "notebook", "kernel": {"id": kid}})
    assert status == 201, body

    m = scrape(kg)
    assert value(m, "kgate_kernels", state="idle") >= 1
    assert value(m, "kgate_kernel_starts") >= started0 + 1
    assert value(m, "kgate_kernel_restarts") == 1
    assert value(m, "kgate_kernel_refused_shutdowns") == 1
    assert value(m, "kgate_background_tasks") == 1
    assert value(m, "kgate_kernel_closes", answered="true") == 1  # the restart's
    assert value(m, "kgate_kernel_closes", answered="false") == 0
    assert value(m, "kgate_executions", origin="mcp", status="ok") >= 1
    assert value(m, "kgate_executions", origin="mcp", status="error") == 1
    assert value(m, "kgate_executions", origin="user", status="ok") >= 2  # the attached client's and the websocket's
    # The histogram: cumulative buckets, +Inf equal to the count, the 0.3 s cell past the 0.25 s bucket.
    buckets = [(float(s.labels["le"]), s.value) for s in m["kgate_execution_duration_seconds"].samples
               if s.name.endswith("_bucket") and s.labels["origin"] == "mcp"]
    assert buckets == sorted(buckets) and [v for _, v in buckets] == sorted(v for _, v in buckets), buckets
    count = value(m, "kgate_execution_duration_seconds", "kgate_execution_duration_seconds_count", origin="mcp")
    assert buckets[-1] == (float("inf"), count) and count >= 2, buckets
    assert dict(buckets)[0.25] < count, buckets
    assert value(m, "kgate_execution_duration_seconds", "kgate_execution_duration_seconds_sum", origin="mcp") >= 0.3
    assert value(m, "kgate_websocket_sent_bytes") > value(m0, "kgate_websocket_sent_bytes")
    assert value(m, "kgate_websocket_connections_opened") >= 1
    assert value(m, "kgate_records_bytes") > 1000
    assert value(m, "kgate_records_jobs") >= 4
    assert value(m, "kgate_sessions") == 1
    # The first start was the warm pool's (a hit); its refill is a start of its own.
    assert value(m, "kgate_pool_hits", kernelspec="python3") + value(m, "kgate_pool_misses", kernelspec="python3") >= 1


def test_a_failed_start_and_evictions_are_counted(kgate_factory, tmp_path):
    cfg = tmp_path / "kgate.toml"
    cfg.write_text("[records]\nmax_jobs = 2\n")
    kg = kgate_factory(config=cfg)
    kid = kg.start_kernel()["id"]
    a = "metrics-agent-" + uuid.uuid4().hex[:8]
    with AgentLink(kg, a, "metrics"):  # an agent's cells may be evicted (a user's wait to be seen)
        for i in range(4):
            assert agent_run(kg, kid, f"print({i})", a)["status"] == "ok"
    m = scrape(kg)
    assert value(m, "kgate_records_evicted") >= 2, m["kgate_records_evicted"].samples
    assert value(m, "kgate_records_jobs") <= 3
    # A kernelspec whose process exits at once: its launch fails (500), and is counted.
    spec = kg.spec_dir.parent / "exits"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text('{"argv": ["/bin/sh", "-c", "exit 3", "{connection_file}"], '
                                      '"display_name": "Exits", "language": "sh"}')
    status, _, body = kg.rest("POST", "/api/kernels", {"name": "exits"})
    assert status == 500, body
    assert value(scrape(kg), "kgate_kernel_start_failures") == 1
