"""What kgate's log says when it stops: the kernels and the warm-pool kernels it shuts down,
counted apart, and no pooled kernel reported lost or replaced by kgate's own shutdown."""

import signal

from conftest import wait_until


def test_sigint_log_counts_pooled_kernels_and_reports_none_lost(kgate_factory, tmp_path):
    config = tmp_path / "kgate.toml"
    config.write_text("[pool]\nsize = 1\n")
    kg = kgate_factory(config=config)

    def pool_ready():
        status, _, body = kg.rest("GET", "/api/kgate/pool")
        return status == 200 and body["kernels"].get("python3", {}).get("ready", 0) >= 1

    assert wait_until(pool_ready, 60, interval=0.1), kg.log_tail()
    kg.start_kernel({"name": "python3"})  # takes the pooled one; the pool refills
    assert wait_until(pool_ready, 60, interval=0.1), kg.log_tail()
    assert kg.stop(sig=signal.SIGINT, sweep=False) == 0
    wait_until(lambda: any("stopped 2 kernel(s)" in line for line in kg.log_lines), 5)  # the reader's last lines
    log = "\n".join(kg.log_lines)
    assert "shutting down 1 kernel(s) and 1 warm-pool kernel(s)" in log, kg.log_tail()
    assert "stopped 2 kernel(s) in" in log, kg.log_tail()
    tail = log[log.index("shutting down"):]
    assert "lost" not in tail and "starting another" not in tail, kg.log_tail()
