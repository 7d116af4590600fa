"""A stock Jupyter web front end in gateway mode puts notebooks on kgate's kernels.

Debian's Notebook 6 (`/usr/bin/python3 -m notebook --gateway-url=...`, package python3-notebook)
runs against a real kgate (with a token, given to Notebook as --GatewayClient.auth_token):

- REST and websocket through Notebook: kgate's kernelspecs, a session's kernel is one kgate
  owns, a cell sent on Notebook's websocket runs on kgate and shows in kgate's job records,
  deleting the session deletes kgate's kernel;
- the limits README states: Notebook lists only its own kernels, and a session asked for one of
  kgate's other kernels gets a new kernel instead;
- headless Chromium (cdp.py) opens a notebook page: the kernel indicator shows kgate's
  kernelspec and logo, the cell runs and its output appears in the DOM and in kgate's records,
  Kernel > Interrupt / Restart / Shutdown from the page act on kgate's kernel;
- stopping Notebook deletes the kernels it started, only those (against a kgate without a
  token: Notebook then sends a bare "Authorization: token ");
- a stock jupyter_server 1.23 (test_interop.JupyterServer, given kgate's token): POST
  /api/sessions gives a kgate kernel of the asked kernelspec, in the notebook's directory, with
  the session's path as JPY_SESSION_NAME; kgate's other kernels are not listed nor attachable;
  stopping it deletes its kernels. test_interop covers its /api/kernels, websocket relay,
  interrupt and restart.

Assertions are on what the front end answers and on what kgate then reports.
"""

import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest

from cdp import CHROMIUM, Chromium
from conftest import DISPLAY_NAME, PYTHON, _module_daemon, free_port, wait_until
from frontends import FrontEnd, private_env

KGATE_TOKEN = "nb-attach-kgate-token-7d1e"
NB_TOKEN = "nb-attach-notebook-token-93ab"  # Notebook's own token (guards its pages), not kgate's
MARKER = "nbattach-" + uuid.uuid4().hex[:12]
REPO = Path(__file__).resolve().parents[2]


def artifacts_dir():
    d = Path(os.environ.get("KGATE_ARTIFACTS") or REPO / "build" / "test-artifacts")
    d.mkdir(parents=True, exist_ok=True)
    return d


def notebook_available():
    r = subprocess.run([PYTHON, "-c", "import notebook, nbformat; print(notebook.__version__)"],
                       capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


NOTEBOOK_VERSION = notebook_available()


# --------------------------------------------------------------------------
# Notebook 6 in gateway mode
# --------------------------------------------------------------------------

class NotebookServer(FrontEnd):
    """`python3 -m notebook --gateway-url=...` with private HOME and JUPYTER_* dirs."""

    name = "notebook"

    def __init__(self, root, gateway_url, gateway_token=None, token=NB_TOKEN):
        root = Path(root)
        self.port = free_port()
        self.notebook_dir = root / "notebooks"
        self.notebook_dir.mkdir(parents=True)
        home = root / "home"
        home.mkdir()
        # Notebook 6 passes KERNEL_* variables of its environment on to the gateway.
        env = private_env(root, HOME=str(home), IPYTHONDIR=str(home / ".ipython"),
                          KERNEL_NBATTACH_MARKER=MARKER)
        args = [PYTHON, "-m", "notebook", "--allow-root", "--no-browser",
                "--ip=127.0.0.1", f"--port={self.port}", "--NotebookApp.port_retries=0",
                f"--NotebookApp.token={token}", "--NotebookApp.password=",
                f"--notebook-dir={self.notebook_dir}", f"--gateway-url={gateway_url}"]
        if gateway_token is not None:
            args.append(f"--GatewayClient.auth_token={gateway_token}")
        super().__init__(root, args, env, self.notebook_dir, token=token)

    def new_session(self, path, kernel=None):
        status, _, model = self.rest("POST", "/api/sessions", {
            "path": path, "name": Path(path).name, "type": "notebook",
            "kernel": kernel or {"name": "python3"}})
        assert status == 201, f"POST /api/sessions on Notebook -> {status} {model!r}\n{self.log_tail()}"
        return model


def write_notebook(path, sources):
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": DISPLAY_NAME, "language": "python"}
    nbformat.write(nb, str(path))


def kgate_jobs(kg, kernel_id):
    status, _, body = kg.rest("GET", f"/api/kgate/jobs?kernel={kernel_id}")
    assert status == 200, f"GET /api/kgate/jobs?kernel={kernel_id} -> {status} {body!r}"
    return body["jobs"]


def kgate_job_with_code(kg, kernel_id, code, timeout=15):
    """kgate's finished record of the cell with exactly this code on that kernel."""
    def find():
        for summary in kgate_jobs(kg, kernel_id):
            if summary.get("code") == code and summary.get("status") != "running":
                status, _, rec = kg.rest("GET", f"/api/kgate/jobs/{summary['job']}")
                assert status == 200, (status, rec)
                return rec
        return None
    rec = wait_until(find, timeout, interval=0.2)
    assert rec, (f"kgate has no finished record of {code!r} on kernel {kernel_id}: "
                 f"{kgate_jobs(kg, kernel_id)!r}\n{kg.log_tail(30)}")
    return rec


def kgate_kernel_ids(kg):
    status, _, listing = kg.rest("GET", "/api/kernels")
    assert status == 200, (status, listing)
    return {k["id"] for k in listing}


# --------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------

def require_notebook():
    if not NOTEBOOK_VERSION:
        pytest.skip("Notebook 6 is not installed for /usr/bin/python3 "
                    "(apt-get install -y --no-install-recommends python3-notebook)")


@pytest.fixture(scope="module")
def kgate_tok(kgate_bin, tmp_path_factory):
    """A module daemon with a token: Notebook must pass it as --GatewayClient.auth_token."""
    yield from _module_daemon(kgate_bin, tmp_path_factory, token=KGATE_TOKEN)


@pytest.fixture(scope="module")
def nbserver(kgate_tok, tmp_path_factory):
    require_notebook()
    nb = NotebookServer(tmp_path_factory.mktemp("notebook"), kgate_tok.url, gateway_token=KGATE_TOKEN)
    try:
        nb.wait_ready()
        yield nb
    finally:
        nb.stop()


@pytest.fixture
def browser(tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium "
                    "(apt-get install -y --no-install-recommends chromium) to test a notebook page")
    b = Chromium.launch(tmp_path / "chromium-profile")
    try:
        yield b
    finally:
        b.close()


# --------------------------------------------------------------------------
# Notebook 6: REST and websocket
# --------------------------------------------------------------------------

def test_notebook_lists_kgate_kernelspecs(kgate_tok, nbserver):
    status, _, theirs = kgate_tok.rest("GET", "/api/kernelspecs")
    assert status == 200, (status, theirs)
    status, _, ours = nbserver.rest("GET", "/api/kernelspecs")
    assert status == 200, (status, ours, nbserver.log_tail())
    assert set(ours["kernelspecs"]) == set(theirs["kernelspecs"]), (ours, theirs)
    assert ours["default"] == theirs["default"] == "python3", (ours["default"], theirs["default"])
    assert ours["kernelspecs"]["python3"]["spec"]["display_name"] == DISPLAY_NAME, \
        f"Notebook did not take the kernelspec from kgate: {ours['kernelspecs']['python3']!r}"


def test_notebook_session_runs_on_kgate(kgate_tok, nbserver):
    (nbserver.notebook_dir / "sub").mkdir(exist_ok=True)
    write_notebook(nbserver.notebook_dir / "sub" / "rest.ipynb", [])
    before = kgate_kernel_ids(kgate_tok)
    session = nbserver.new_session("sub/rest.ipynb")
    kid = session["kernel"]["id"]
    kgate_tok._kernels.add(kid)
    assert kid not in before and kid in kgate_kernel_ids(kgate_tok), \
        f"the session's kernel {kid} is not a new kgate kernel\n{nbserver.log_tail()}"
    assert kgate_tok.kernel_model(kid)["name"] == "python3"

    code = f"import os\nprint(os.getcwd())\nprint(os.environ.get('KERNEL_NBATTACH_MARKER'))\nprint('{MARKER}-rest')"
    ws = nbserver.ws(kid, uuid.uuid4().hex)
    try:
        r = ws.execute(code, timeout=60)
    finally:
        ws.close()
    assert r.status == "ok", r
    cwd, env_marker, echo = r.stdout.splitlines()
    assert os.path.realpath(cwd) == os.path.realpath(nbserver.notebook_dir / "sub"), \
        f"kernel cwd {cwd!r} is not the notebook's directory (KERNEL_WORKING_DIR)"
    assert env_marker == MARKER, f"Notebook's KERNEL_* variable did not reach the kernel: {r.stdout!r}"
    assert echo == f"{MARKER}-rest"

    rec = kgate_job_with_code(kgate_tok, kid, code)
    assert rec["origin"] == "user" and rec["status"] == "ok", rec
    assert rec["kernel"] == kid and rec["request"] == r.msg_id, rec
    assert f"{MARKER}-rest\n" in rec["output"], rec

    # Notebook lists it; deleting the session deletes kgate's kernel.
    status, _, kernels = nbserver.rest("GET", "/api/kernels")
    assert status == 200 and kid in [k["id"] for k in kernels], (status, kernels)
    status, _, body = nbserver.rest("DELETE", f"/api/sessions/{session['id']}")
    assert status == 204, (status, body, nbserver.log_tail())
    assert wait_until(lambda: kgate_tok.rest("GET", f"/api/kernels/{kid}")[0] == 404, 10), \
        f"kernel {kid} still on kgate after the session was deleted on Notebook"
    kgate_tok._kernels.discard(kid)


def test_notebook_lists_only_its_own_kernels(kgate_tok, nbserver):
    """An agent's kernel on kgate is neither listed by Notebook nor attachable as a session."""
    agent_kid = kgate_tok.start_kernel()["id"]
    status, _, rec = kgate_tok.rest("POST", f"/api/kgate/kernels/{agent_kid}/execute",
                                    {"code": "agent_state = 1", "agent": "nbattach", "wait": 20})
    assert status == 200 and rec["status"] == "ok", (status, rec)
    try:
        status, _, kernels = nbserver.rest("GET", "/api/kernels")
        assert status == 200, (status, kernels)
        assert agent_kid not in [k["id"] for k in kernels], \
            f"Notebook listed a kernel it did not start: {kernels!r}"

        write_notebook(nbserver.notebook_dir / "attach.ipynb", [])
        session = nbserver.new_session("attach.ipynb", kernel={"id": agent_kid, "name": "python3"})
        got = session["kernel"]["id"]
        kgate_tok._kernels.add(got)
        assert got != agent_kid, \
            "Notebook attached a session to a kernel it did not start: update README's limits"
        assert got in kgate_kernel_ids(kgate_tok), (got, session)
        status, _, body = nbserver.rest("DELETE", f"/api/sessions/{session['id']}")
        assert status == 204, (status, body)
        assert wait_until(lambda: got not in kgate_kernel_ids(kgate_tok), 10)
        kgate_tok._kernels.discard(got)
        assert agent_kid in kgate_kernel_ids(kgate_tok), "the agent's kernel went away"
    finally:
        kgate_tok.delete_kernel(agent_kid, check=False)


# --------------------------------------------------------------------------
# Notebook 6: the page in headless Chromium
# --------------------------------------------------------------------------

KERNEL_READY_JS = ("!!(window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel"
                   " && Jupyter.notebook.kernel.is_connected()"
                   " && Jupyter.notebook.kernel.info_reply && Jupyter.notebook.kernel.info_reply.status === 'ok')")


def kgate_ext(kg, kernel_id):
    status, _, model = kg.rest("GET", f"/api/kgate/kernels/{kernel_id}")
    assert status == 200, f"GET /api/kgate/kernels/{kernel_id} -> {status} {model!r}"
    return model


def test_notebook_page_runs_cell_on_kgate(kgate_tok, nbserver, browser):
    code = f"print('{MARKER}-' + 'browser', 6 * 7)"
    expected = f"{MARKER}-browser 42"
    write_notebook(nbserver.notebook_dir / "browser.ipynb", [code])
    before = kgate_kernel_ids(kgate_tok)

    page = browser.page()
    try:
        page.navigate(f"{nbserver.url}/notebooks/browser.ipynb?token={quote(NB_TOKEN)}")
        page.wait_for(KERNEL_READY_JS, timeout=30, message="the notebook page's kernel is not ready")
        kid = page.evaluate("Jupyter.notebook.kernel.id")
        kgate_tok._kernels.add(kid)
        assert kid not in before and kid in kgate_kernel_ids(kgate_tok), \
            f"the page's kernel {kid} is not a new kgate kernel"
        assert page.evaluate("Jupyter.notebook.kernel.name") == "python3"
        # The kernel indicator shows kgate's kernelspec, with the logo kgate serves.
        assert page.text(".kernel_indicator_name") == DISPLAY_NAME
        page.wait_for("(() => { const i = document.querySelector('#kernel_logo_widget img');"
                      " return i && i.complete && i.naturalWidth === 64; })()", timeout=10,
                      message="kgate's kernelspec logo did not load on the page")

        # Run the notebook's cell: the output appears on the page, kgate recorded it.
        page.evaluate("Jupyter.notebook.execute_all_cells(); true")
        out = page.wait_for(
            "(() => { const o = document.querySelector('.cell .output_area .output_text');"
            f" return o && o.textContent.includes({json.dumps(expected)}) ? o.textContent : null; }})()",
            timeout=30, message="the cell's output did not appear on the page")
        assert expected in out
        page.screenshot(artifacts_dir() / "notebook_attach.png")
        rec = kgate_job_with_code(kgate_tok, kid, code)
        assert rec["origin"] == "user" and rec["status"] == "ok", rec
        assert rec["output"] == expected + "\n", rec
        assert page.evaluate("Jupyter.notebook.get_cell(0).input_prompt_number") == rec["execution_count"]

        # Interrupt from the page (Kernel > Interrupt): kgate's record says so.
        sleep_code = "import time\ntime.sleep(60)"
        page.evaluate("(() => { const c = Jupyter.notebook.insert_cell_below('code', 0);"
                      f" c.set_text({json.dumps(sleep_code)}); c.execute(); return true; }})()")

        def running_sleep():
            return [j for j in kgate_jobs(kgate_tok, kid)
                    if j["code"] == sleep_code and j["status"] == "running" and j.get("began")]
        assert wait_until(running_sleep, 15, interval=0.1), kgate_jobs(kgate_tok, kid)
        time.sleep(0.3)
        page.evaluate("Jupyter.notebook.kernel.interrupt(); true")
        rec = kgate_job_with_code(kgate_tok, kid, sleep_code)
        assert rec["status"] == "interrupted", rec
        page.wait_for("(() => { const c = Jupyter.notebook.get_cell(1).element[0];"
                      " return c.textContent.includes('KeyboardInterrupt'); })()", timeout=10,
                      message="the interrupted cell shows no KeyboardInterrupt")

        # Restart from the page (Kernel > Restart): the same kgate kernel restarts.
        restarts = kgate_ext(kgate_tok, kid)["restarts"]
        page.evaluate("Jupyter.notebook.restart_kernel({confirm: false}).then(() => true)", timeout=60)
        assert wait_until(lambda: kgate_ext(kgate_tok, kid)["restarts"] == restarts + 1, 15), \
            kgate_ext(kgate_tok, kid)
        page.wait_for(KERNEL_READY_JS, timeout=30, message="the kernel is not ready after the restart")
        assert page.evaluate("Jupyter.notebook.kernel.id") == kid
        assert not page.exceptions, f"uncaught JavaScript errors on the page: {page.exceptions}"
    except BaseException:
        try:
            page.screenshot(artifacts_dir() / "notebook_attach-failed.png")
        except Exception:
            pass
        raise

    # Shut the kernel down from the page (Kernel > Shutdown, without the dialog): Notebook
    # deletes the session and kgate's kernel goes.
    page.evaluate("Jupyter.notebook.shutdown_kernel({confirm: false}); true")
    assert wait_until(lambda: kgate_tok.rest("GET", f"/api/kernels/{kid}")[0] == 404, 10), \
        f"kernel {kid} still on kgate after the page shut it down\n{nbserver.log_tail()}"
    kgate_tok._kernels.discard(kid)
    status, _, sessions = nbserver.rest("GET", "/api/sessions")
    assert status == 200 and kid not in [s["kernel"]["id"] for s in sessions], sessions


# --------------------------------------------------------------------------
# Stopping Notebook (kgate --no-token: Notebook sends a bare "Authorization: token ")
# --------------------------------------------------------------------------

def test_notebook_shutdown_deletes_its_kernels(kgate_factory, tmp_path):
    require_notebook()
    kgate = kgate_factory(extra_args=["--no-token"])
    nb = NotebookServer(tmp_path / "nb", kgate.url)
    try:
        nb.wait_ready()
        write_notebook(nb.notebook_dir / "a.ipynb", [])
        kid = nb.new_session("a.ipynb")["kernel"]["id"]
        kgate._kernels.add(kid)
        assert kid in kgate_kernel_ids(kgate)
        other = kgate.start_kernel()["id"]  # not Notebook's: must survive
    finally:
        rc = nb.stop()
    log = nb.log_path.read_text(errors="replace")
    assert wait_until(lambda: kid not in kgate_kernel_ids(kgate), 10), \
        f"Notebook's kernel {kid} is still on kgate after Notebook stopped (exit {rc})\n{log[-3000:]}"
    kgate._kernels.discard(kid)
    assert other in kgate_kernel_ids(kgate), "stopping Notebook deleted a kernel it did not start"
    kgate.delete_kernel(other)


# --------------------------------------------------------------------------
# jupyter_server: sessions (test_interop covers its kernels API and websocket relay)
# --------------------------------------------------------------------------

def start_jupyter_server(root, gateway_url, gateway_token):
    """test_interop's JupyterServer, with kgate's token on its command line (it sets
    JUPYTER_NO_CONFIG and drops JUPYTER_* variables, so neither a config file nor
    JUPYTER_GATEWAY_AUTH_TOKEN would reach it)."""
    from test_interop import JupyterServer
    return JupyterServer(root, gateway_url, extra_args=(f"--GatewayClient.auth_token={gateway_token}",))


def test_jupyter_server_session_on_kgate(kgate_tok, tmp_path):
    """jupyter_server 1.23 started with kgate's token (--GatewayClient.auth_token)."""
    kg = kgate_tok
    agent_kid = kg.start_kernel()["id"]
    js = start_jupyter_server(tmp_path / "js", kg.url, KGATE_TOKEN)
    try:
        js.wait_ready()
        status, _, session = js.rest("POST", "/api/sessions", {
            "path": "nb/work.ipynb", "name": "work.ipynb", "type": "notebook",
            "kernel": {"name": "python3"}})
        assert status == 201, (status, session, js.log_tail())
        kid = session["kernel"]["id"]
        kg._kernels.add(kid)
        assert session["kernel"]["name"] == "python3", session
        assert kg.kernel_model(kid)["name"] == "python3"
        assert kgate_ext(kg, kid)["kernelspec"], kgate_ext(kg, kid)

        # jupyter_server passes the session's path as JPY_SESSION_NAME; kgate lets it through.
        with kg.connect(kid) as ws:
            out = ws.run("import os\nprint(os.environ.get('JPY_SESSION_NAME'))\nprint(os.getcwd())")
        name, cwd = out.splitlines()
        assert name.endswith("nb/work.ipynb"), f"JPY_SESSION_NAME in the kernel: {name!r}"
        assert os.path.realpath(cwd) == os.path.realpath(js.notebook_dir / "nb"), cwd

        status, _, sessions = js.rest("GET", "/api/sessions")
        assert status == 200 and [s["kernel"]["id"] for s in sessions] == [kid], (status, sessions)

        # Like Notebook: kgate's other kernels are not listed, and a session asked for one
        # gets a new kernel.
        status, _, kernels = js.rest("GET", "/api/kernels")
        assert status == 200 and [k["id"] for k in kernels] == [kid], (status, kernels)
        status, _, other = js.rest("POST", "/api/sessions", {
            "path": "nb/other.ipynb", "name": "other.ipynb", "type": "notebook",
            "kernel": {"id": agent_kid, "name": "python3"}})
        assert status == 201, (status, other, js.log_tail())
        other_kid = other["kernel"]["id"]
        kg._kernels.add(other_kid)
        assert other_kid not in (agent_kid, kid), \
            "jupyter_server attached a session to a kernel it did not start: update README's limits"

        status, _, body = js.rest("DELETE", f"/api/sessions/{session['id']}")
        assert status == 204, (status, body, js.log_tail())
        assert wait_until(lambda: kg.rest("GET", f"/api/kernels/{kid}")[0] == 404, 10), \
            f"kernel {kid} still on kgate after the session was deleted on jupyter_server"
        kg._kernels.discard(kid)
    finally:
        js.stop()
    # Stopping jupyter_server deletes the kernel it still had, and only that one.
    assert wait_until(lambda: other_kid not in kgate_kernel_ids(kg), 10), \
        f"jupyter_server's kernel {other_kid} is still on kgate after it stopped"
    kg._kernels.discard(other_kid)
    assert agent_kid in kgate_kernel_ids(kg), "stopping jupyter_server deleted a kernel it did not start"
    kg.delete_kernel(agent_kid)
