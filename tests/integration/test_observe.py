"""The observe page in headless Chromium: it lists a kernel's jobs, shows a job, stops one.

kgate (with a token) runs a kernel with a few agent-path cells; Chromium, driven over the
DevTools protocol (cdp.py), opens {url}/observe?token=T and must list the kernel's jobs, show a
job's output on click, and stop a running `time.sleep(60)` cell with its Stop button. A
screenshot goes to $KGATE_ARTIFACTS/observe.png (default <repo>/build/test-artifacts).
"""

import json
import os
import time
from pathlib import Path

import pytest

from cdp import CHROMIUM, Chromium

TOKEN = "observe-test-token-5f2c"
AGENT = "t"
REPO = Path(__file__).resolve().parents[2]


def artifacts_dir():
    d = Path(os.environ.get("KGATE_ARTIFACTS") or REPO / "build" / "test-artifacts")
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture
def browser(tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium "
                    "(apt-get install -y --no-install-recommends chromium) to test the observe page")
    b = Chromium.launch(tmp_path / "chromium-profile")
    try:
        yield b
    finally:
        b.close()  # SIGKILL to Chromium's process group, whatever the outcome


def execute(kg, kernel_id, code, wait=10):
    status, _, body = kg.rest("POST", f"/api/kgate/kernels/{kernel_id}/execute",
                              {"code": code, "agent": AGENT, "wait": wait})
    assert status == 200, f"execute {code!r} -> {status} {body!r}\n{kg.log_tail()}"
    assert isinstance(body, dict) and str(body.get("job", "")).startswith("job-"), body
    return body


def get_job(kg, job, wait=None):
    path = f"/api/kgate/jobs/{job}" + (f"?wait={wait}" if wait is not None else "")
    status, _, body = kg.rest("GET", path)
    assert status == 200, f"GET {path} -> {status} {body!r}"
    return body


def sel(job):
    return f'tr.job[data-job="{job}"]'


def test_observe_page(kgate_factory, browser):
    kg = kgate_factory(token=TOKEN)

    # The server side this page needs (clear failures rather than a blank page).
    status, _, api = kg.rest("GET", "/api")
    assert status == 200 and isinstance(api, dict) and "kgate" in (api.get("extensions") or {}), (
        f"GET /api does not advertise extensions.kgate: {status} {api!r}")
    status, hdrs, page_html = kg.http("GET", f"/observe?token={TOKEN}")
    assert status == 200 and b"kgate" in page_html, f"GET /observe -> {status} {page_html[:200]!r}"
    assert "text/html" in hdrs.get("Content-Type", ""), hdrs.get("Content-Type")

    kid = kg.start_kernel()["id"]
    printed = execute(kg, kid, "print('hello from the observe test')")
    assert printed["status"] == "ok", printed
    result = execute(kg, kid, "x = 6 * 7\nx")
    assert result["status"] == "ok", result
    failed = execute(kg, kid, "1 / 0")
    assert failed["status"] == "error", failed
    jobs = [printed["job"], result["job"], failed["job"]]

    page = browser.page()
    shot = artifacts_dir() / "observe.png"
    try:
        page.navigate(f"{kg.url}/observe?token={TOKEN}")

        # 1. It lists the kernel and its jobs, with their statuses.
        page.wait_for("document.body.dataset.ready === '1'", timeout=10,
                      message="the page never loaded the job list")
        page.wait_for(f"!!document.querySelector('[data-kernel=\"{kid}\"]')", timeout=10,
                      message=f"kernel {kid} is not listed")
        for job, st in zip(jobs, ("ok", "ok", "error")):
            got = page.wait_for(f"(document.querySelector('{sel(job)}') || {{dataset: {{}}}}).dataset.status",
                                timeout=10, message=f"{job} is not listed")
            assert got == st, f"{job} is listed as {got!r}, expected {st!r}"
        attach = page.text(f'[data-kernel="{kid}"] .attach-command')
        assert attach and kid in attach, f"attach command not shown for {kid}: {attach!r}"
        # The token came from the URL and is kept for reloads.
        assert page.evaluate("sessionStorage.getItem('kgate-observe-token')") == TOKEN

        # 2. Clicking a job shows its output (and the result of another).
        page.click(sel(printed["job"]))
        page.wait_for(f"document.getElementById('detail').dataset.job === '{printed['job']}' && "
                      "document.getElementById('detail-output').textContent"
                      ".includes('hello from the observe test')",
                      timeout=10, message="the job detail does not show the cell's output")
        page.click(sel(result["job"]))
        page.wait_for("document.getElementById('detail-result').textContent.trim() === '42'",
                      timeout=10, message="the job detail does not show the cell's result")
        page.click(sel(failed["job"]))
        page.wait_for("document.getElementById('detail-ename').textContent === 'ZeroDivisionError'",
                      timeout=10, message="the job detail does not show the cell's error")

        # 3. Stop on a running cell interrupts it.
        sleeper = execute(kg, kid, "import time; time.sleep(60)", wait=0)
        sj = sleeper["job"]
        assert sleeper["status"] == "running", sleeper
        deadline = time.monotonic() + 10
        while not get_job(kg, sj).get("began"):
            assert time.monotonic() < deadline, f"{sj} never began: {get_job(kg, sj)!r}"
            time.sleep(0.05)
        time.sleep(0.3)  # let the cell get into time.sleep
        page.wait_for(f"!!document.querySelector('{sel(sj)}[data-status=\"running\"] [data-action=\"stop\"]')",
                      timeout=10, message=f"running {sj} has no Stop button")
        page.click(sel(sj))  # its detail, with the duration ticking, goes in the screenshot
        page.wait_for(f"document.getElementById('detail').dataset.job === '{sj}'", timeout=10)
        page.click(f'{sel(sj)} [data-action="stop"]')
        rec = get_job(kg, sj, wait=15)
        assert rec["status"] == "interrupted", f"{sj} after Stop: {json.dumps(rec)[:800]}"
        page.wait_for(f"(document.querySelector('{sel(sj)}') || {{dataset: {{}}}}).dataset.status === 'interrupted'",
                      timeout=10, message=f"the page does not show {sj} as interrupted")
        page.wait_for("document.getElementById('detail').dataset.status === 'interrupted' && "
                      "document.getElementById('detail-ename').textContent === 'KeyboardInterrupt'",
                      timeout=10, message=f"the job detail does not show {sj} as interrupted")
        assert not page.evaluate(f"!!document.querySelector('{sel(sj)} [data-action=\"stop\"]')"), (
            "an interrupted job still has a Stop button")
        page.evaluate("document.getElementById('message').hidden = true")
        page.screenshot(shot)  # the kernel, its jobs, and the stopped cell's detail

        # 4. Stopping a job that no longer runs is refused, and the page says why.
        # (its Stop button is gone, so unhide the detail's one: a click that raced the end)
        page.evaluate("document.getElementById('detail-stop').hidden = false")
        page.click("#detail-stop")
        msg = page.wait_for("(() => { const m = document.getElementById('message-text');"
                            " return !m.parentNode.hidden && m.parentNode.dataset.kind === 'error'"
                            " ? m.textContent : ''; })()",
                            timeout=10, message="a refused Stop shows no message")
        assert "refused" in msg and sj in msg, f"the refusal is not shown as such: {msg!r}"

        # 5. A verification's cells (kgate-mcp's verify labels them "… · verify ID cell i/n") are
        # shown under one heading that says how the run went.
        for i, code in ((1, "v = 1"), (2, "1 / 0")):
            status, _, body = kg.rest("POST", f"/api/kgate/kernels/{kid}/execute",
                                      {"code": code, "agent": AGENT, "wait": 10,
                                       "label": f"e2e · verify abcd1234 cell {i}/3"})
            assert status == 200, body
        page.wait_for("(document.querySelector('tr.verify-mark[data-verify=\"abcd1234\"]') || {dataset: {}})"
                      ".dataset.verdict === 'failed'", timeout=10, message="no heading saying the verification failed")
        head = page.evaluate("document.querySelector('tr.verify-mark[data-verify=\"abcd1234\"]').textContent")
        assert "verification abcd1234" in head and "1 of 3 cells passed" in head and "1 not run" in head, head
        assert page.evaluate("document.querySelectorAll('tr.job.in-verify').length") == 2
        page.evaluate("document.getElementById('message').hidden = true")
        page.screenshot(artifacts_dir() / "observe-verify.png")

        # 6. A background task is marked as one, and the person stops it from its row.
        status, _, task = kg.rest("POST", f"/api/kgate/kernels/{kid}/execute",
                                  {"code": "import time\nwhile True:\n    time.sleep(0.05)", "agent": AGENT,
                                   "label": "e2e", "wait": 1, "background": True})
        assert status == 200 and task["status"] == "running" and task["task"] is True, task
        tj = task["job"]
        page.wait_for(f"(document.querySelector('{sel(tj)}') || {{dataset: {{}}}}).dataset.task === '1' && "
                      f"document.querySelector('{sel(tj)} .task-mark').textContent === 'background' && "
                      f"!!document.querySelector('{sel(tj)} [data-action=\"stop\"]')",
                      timeout=10, message=f"the task {tj} is not marked as a background task with a Stop")
        assert page.evaluate(f"document.querySelector('{sel(sj)}').dataset.task") == "0"
        page.click(f'{sel(tj)} [data-action="stop"]')
        assert get_job(kg, tj, wait=15)["status"] == "interrupted"
        page.wait_for(f"(document.querySelector('{sel(tj)}') || {{dataset: {{}}}}).dataset.status === 'interrupted'",
                      timeout=10, message=f"the page does not show the task {tj} as interrupted")

        # 7. A shutdown refused to a client attached by connection file shows on its kernel.
        assert not page.evaluate(f"!!document.querySelector('.kernel[data-kernel=\"{kid}\"] .side')")
        from records_util import attach_client
        kc = attach_client(kg, kid)
        try:
            kc.control_channel.send(kc.session.msg("shutdown_request", {"restart": False}))
            assert kc.get_control_msg(timeout=15)["content"]["status"] == "error"
        finally:
            kc.stop_channels()
        side = page.wait_for(f"(document.querySelector('.kernel[data-kernel=\"{kid}\"] .side') || "
                             "{textContent: ''}).textContent",
                             timeout=20, message="the refused shutdown is not shown on its kernel")
        assert "refused 1 shutdown request from other clients, the last from user" in side, side
        page.screenshot(artifacts_dir() / "observe-kernel-side.png")

        page.drain_events(0.2)
        assert not page.exceptions, f"JavaScript errors on the page: {page.exceptions}"
    except BaseException:
        try:  # a screenshot of the failure; it must not hide the real error
            page.screenshot(shot)
        except Exception as exc:
            print(f"screenshot failed: {exc}")
        raise
    assert shot.is_file() and shot.stat().st_size > 1000, f"no screenshot at {shot}"


def test_the_page_shows_every_output_an_agents_plot_and_a_persons_html(kgate_factory, browser):
    """Issue 61: an agent's matplotlib plot shows on the page as an image, and a person's
    display(HTML(...)) from a client attached by connection file shows in a frame where its
    <script> does not run."""
    from jupyter_client import BlockingKernelClient
    kg = kgate_factory(token=TOKEN)
    kid = kg.start_kernel()["id"]
    plot = execute(kg, kid, "%matplotlib inline\nimport matplotlib.pyplot as plt\n"
                            "plt.plot([1, 3, 2]); plt.title('from the agent'); plt.show()", wait=60)
    assert plot["status"] == "ok", plot
    client = BlockingKernelClient()
    client.load_connection_file(str(kg.connection_file(kid)))
    client.start_channels()
    try:
        client.wait_for_ready(timeout=30)
        reply = client.execute_interactive(
            "from IPython.display import HTML, display\n"
            "display(HTML('<b id=\"b\">from the person</b><script>parent.document.title = \"pwned\"</script>'))",
            timeout=30)
        assert reply["content"]["status"] == "ok", reply
    finally:
        client.stop_channels()
    status, _, listing = kg.rest("GET", f"/api/kgate/jobs?kernel={kid}")
    html_job = next(j["job"] for j in listing["jobs"] if "from the person" in j["code"])

    page = browser.page()
    page.navigate(f"{kg.url}/observe?token={TOKEN}")
    page.wait_for("document.body.dataset.ready === '1'", timeout=10)
    page.wait_for(f"!!document.querySelector('{sel(plot['job'])}')", timeout=10)
    page.click(sel(plot["job"]))
    page.wait_for("(function () { const i = document.querySelector('#detail-outputs img');"
                  " return !!i && i.complete && i.naturalWidth > 0; })()",
                  timeout=5, message="the agent's plot is not shown as an image")
    page.wait_for(f"!!document.querySelector('{sel(html_job)}')", timeout=10)
    page.click(sel(html_job))
    page.wait_for("(function () { const f = document.querySelector('#detail-outputs iframe.out-html');"
                  " return !!f && f.srcdoc.includes('from the person') && f.getAttribute('sandbox') === ''; })()",
                  timeout=5, message="the person's HTML is not shown in a sandboxed frame")
    time.sleep(1)
    assert page.evaluate("document.title") != "pwned", "a script in an HTML output ran"
    page.screenshot(artifacts_dir() / "observe-outputs.png")

    # /observe?kernel=ID: the kernel as a notebook, its cells in order with their outputs, and a
    # restart as a divider; a cell run after it shows up on its own.
    assert kg.rest("POST", f"/api/kernels/{kid}/restart")[0] == 200
    after = execute(kg, kid, "print('after the restart')")
    page.navigate(f"{kg.url}/observe?token={TOKEN}&kernel={kid}")
    page.wait_for("document.body.dataset.ready === '1'", timeout=10)
    page.wait_for(f"(function () {{ const i = document.querySelector('.nb-cell[data-job=\"{plot['job']}\"] img');"
                  " return !!i && i.complete && i.naturalWidth > 0; })()",
                  timeout=5, message="the notebook does not show the agent's plot")
    page.wait_for(f"!!document.querySelector('.nb-cell[data-job=\"{html_job}\"] iframe.out-html')", timeout=5,
                  message="the notebook does not show the person's HTML")
    order = page.evaluate("Array.from(document.querySelectorAll('#notebook > *')).map("
                          "function (e) { return e.classList.contains('nb-restart') ? 'restart' : e.dataset.job; })")
    assert order == [plot["job"], html_job, "restart", after["job"]], order
    later = execute(kg, kid, "print('a cell the page was not loaded with')")
    page.wait_for(f"(document.querySelector('.nb-cell[data-job=\"{later['job']}\"] pre.out-stream') || {{}})"
                  ".textContent === 'a cell the page was not loaded with\\n'",
                  timeout=5, message="a new cell does not appear in the open notebook")
    page.screenshot(artifacts_dir() / "observe-notebook.png")
