"""Clients across a kgate restart (issue 18, docs/dev/readoption.md): a stock `jupyter server --gateway-url`
and the observe page in headless Chromium, both left open while kgate is stopped (SIGTERM) and a
new kgate takes the kernels back on the same port and state directory."""

import time
import uuid

from conftest import wait_until
from records_util import agent_run
from test_interop import JupyterServer
from test_observe import TOKEN, browser, sel  # noqa: F401 (browser is a fixture)
from test_readopt import kernel_ids
from test_readopt_records import next_kgate


def test_jupyter_server_in_gateway_mode_carries_on_across_a_restart(kgate_factory, kgate_bin, tmp_path):
    kg = kgate_factory()
    js = JupyterServer(tmp_path / "jupyter_server", kg.url, gateway_token=kg.token)
    try:
        js.wait_ready()
        status, _, model = js.rest("POST", "/api/kernels", {"name": "python3"})
        assert status == 201, (status, model, js.log_tail())
        kid = model["id"]
        ws = js.ws(kid, uuid.uuid4().hex)
        try:
            assert ws.run("x = 41\nprint('set')") == "set\n"
            port = kg.port
            kg.stop(sweep=False)  # SIGTERM: the kernel stays
            with next_kgate(kgate_bin, kg.root, port=port):
                # jupyter_server lists the kernel again, from the new kgate.
                assert wait_until(lambda: kid in [k["id"] for k in js.rest("GET", "/api/kernels")[2] or []], 20), \
                    js.log_tail()
                # Its relay reconnects its websocket to kgate (gateway_retry_*); the browser-side
                # socket stays open and the next cell runs on the same kernel, with its state.
                out = None
                deadline = time.monotonic() + 40
                while out is None:
                    try:
                        out = ws.run("print(x + 1)", timeout=5)
                    except (AssertionError, TimeoutError):
                        assert time.monotonic() < deadline, "jupyter_server's websocket never came back\n" + \
                            js.log_tail()
                assert out == "42\n", out
                # A new websocket through it works too.
                ws2 = js.ws(kid, uuid.uuid4().hex)
                try:
                    assert ws2.run("print(x)") == "41\n"
                finally:
                    ws2.close()
        finally:
            ws.close()
    finally:
        js.stop()


def test_the_observe_page_shows_the_kernels_again(kgate_factory, kgate_bin, browser):  # noqa: F811
    kg = kgate_factory(token=TOKEN)
    kid = kg.start_kernel()["id"]
    before = agent_run(kg, kid, "print('before the restart')", "t")
    page = browser.page()
    page.navigate(f"{kg.url}/observe?token={TOKEN}")
    page.wait_for("document.body.dataset.ready === '1'", timeout=10, message="the page never loaded")
    page.wait_for(f"!!document.querySelector('{sel(before['job'])}')", timeout=10,
                  message=f"{before['job']} is not listed")
    port = kg.port
    kg.stop(sweep=False)  # SIGTERM
    page.wait_for("document.getElementById('conn').dataset.state === 'retry'", timeout=40,
                  message="the page did not notice that kgate went away")
    with next_kgate(kgate_bin, kg.root, token=TOKEN, port=port) as kg2:
        assert wait_until(lambda: kernel_ids(kg2).get(kid, {}).get("execution_state") == "idle", 30)
        after = agent_run(kg2, kid, "print('after the restart')", "t")
        # Without a reload: the page reconnects, lists the kernel, the old job and the new one.
        page.wait_for("document.getElementById('conn').dataset.state === 'live'", timeout=40,
                      message="the page did not reconnect")
        page.wait_for(f"!!document.querySelector('[data-kernel=\"{kid}\"]')", timeout=20,
                      message=f"kernel {kid} is not listed after the restart")
        for job in (before["job"], after["job"]):
            page.wait_for(f"!!document.querySelector('{sel(job)}')", timeout=20,
                          message=f"{job} is not listed after the restart")
