"""Kernel discovery: kernelspec precedence and loading from fixture trees, Python
environments made in the test (a venv with ipykernel and one without), `kgate kernelspecs`,
and a stock jupyter_server in --gateway-url mode taking every kgate kernelspec."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PYTHON, Kgate, wait_until
from test_interop import JupyterServer

LAUNCH_PY = '''\
# A kernel launcher in the spec's resource dir: argv[1] is "{resource_dir}/launch.py".
# It records interrupt_request messages (interrupt_mode "message") in $KGATE_TEST_MARKS.
import os, sys
from ipykernel import kernelbase
_orig = kernelbase.Kernel.interrupt_request
async def interrupt_request(self, *a, **kw):
    with open(os.environ["KGATE_TEST_MARKS"], "a") as f:
        f.write("interrupt_request\\n")
    return await _orig(self, *a, **kw)
kernelbase.Kernel.interrupt_request = interrupt_request
from ipykernel import kernelapp
kernelapp.launch_new_instance()
'''


def write_spec(root, name, **fields):
    d = Path(root) / "kernels" / name
    d.mkdir(parents=True, exist_ok=True)
    spec = {"argv": [PYTHON, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": name, "language": "python"}
    spec.update(fields)
    (d / "kernel.json").write_text(json.dumps(spec))
    return d


def make_venv(path, system_site):
    args = [PYTHON, "-m", "venv", "--without-pip"]
    if system_site:
        args.append("--system-site-packages")
    subprocess.run(args + [str(path)], check=True, capture_output=True, timeout=120)
    return path


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("discovery")
    first, second, data = root / "first", root / "second", root / "data"
    # precedence: "echo" in both JUPYTER_PATH entries, the first wins
    write_spec(first, "echo", display_name="Echo (first)")
    write_spec(second, "echo", display_name="Echo (second)")
    # case-insensitive names
    write_spec(data, "MixedCase", display_name="Mixed case")
    # a broken kernel.json is skipped with a warning, and hides nothing
    broken = data / "kernels" / "broken"
    broken.mkdir(parents=True)
    (broken / "kernel.json").write_text("{not json")
    # {resource_dir}, env and interrupt_mode
    res = write_spec(second, "resdir", display_name="Resource dir",
                     argv=[PYTHON, "{resource_dir}/launch.py", "-f", "{connection_file}"],
                     env={"KGATE_SPEC_VAR": "from-spec ${KGATE_BASE_VAR}",
                          "KGATE_TEST_MARKS": str(root / "marks-message.txt")},
                     interrupt_mode="message")
    (res / "launch.py").write_text(LAUNCH_PY)
    sig = write_spec(second, "signalmode", display_name="Signal mode",
                     argv=[PYTHON, "{resource_dir}/launch.py", "-f", "{connection_file}"],
                     env={"KGATE_TEST_MARKS": str(root / "marks-signal.txt")})
    (sig / "launch.py").write_text(LAUNCH_PY)
    # a spec whose interpreter does not exist
    write_spec(data, "gone", argv=["/nonexistent/bin/python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"])
    # environments: one with ipykernel (system site packages), one without
    workon = root / "workon"
    workon.mkdir()
    with_ipk = make_venv(workon / "withipk", True)
    without = make_venv(workon / "noipk", False)
    return {"root": root, "first": first, "second": second, "data": data, "workon": workon,
            "with_ipk": with_ipk, "without": without}


def discovery_env(base_env, tree):
    env = dict(base_env)
    env.update({
        "JUPYTER_PATH": f"{tree['first']}:{tree['second']}",
        "JUPYTER_DATA_DIR": str(tree["data"]),
        "WORKON_HOME": str(tree["workon"]),
        "KGATE_BASE_VAR": "base-value",
    })
    return env


@pytest.fixture(scope="module")
def kg(kgate_bin, tree, tmp_path_factory):
    k = Kgate(kgate_bin, tmp_path_factory.mktemp("kgate"))
    k.env = discovery_env(k.env, tree)
    k.start()
    try:
        yield k
    finally:
        k.cleanup_kernels()
        k.stop()


def catalog(kg, refresh=False):
    status, _, body = kg.rest("GET", "/api/kgate/kernelspecs" + ("?refresh=1" if refresh else ""), timeout=90)
    assert status == 200, (status, body)
    return body


def entry(cat, name=None, source=None):
    for e in cat["entries"]:
        if (name is None or e["name"] == name) and (source is None or e["source"] == source):
            return e
    return None


def interpreter_entry(cat, venv):
    return entry(cat, source=str(Path(venv) / "bin" / "python3"))


def specs(kg):
    status, _, body = kg.rest("GET", "/api/kernelspecs")
    assert status == 200, (status, body)
    return body


def run_in(kg, name, code):
    model = kg.start_kernel({"name": name})
    try:
        with kg.connect(model["id"]) as ws:
            return ws.run(code), model
    finally:
        kg.delete_kernel(model["id"], check=False)


# ---- fixture trees -----------------------------------------------------------------------

def test_first_directory_wins(kg):
    body = specs(kg)
    assert body["kernelspecs"]["echo"]["spec"]["display_name"] == "Echo (first)"


def test_names_are_case_insensitive(kg):
    body = specs(kg)
    assert "mixedcase" in body["kernelspecs"] and "MixedCase" not in body["kernelspecs"]
    status, _, one = kg.rest("GET", "/api/kernelspecs/MIXEDCASE")
    assert status == 200 and one["name"] == "mixedcase", (status, one)
    # "python" means "python3"
    status, _, py = kg.rest("GET", "/api/kernelspecs/python")
    assert status == 200 and py["name"] == "python3", (status, py)


def test_broken_spec_is_skipped_with_a_warning(kg):
    body = specs(kg)
    assert "broken" not in body["kernelspecs"]
    assert {"echo", "mixedcase", "resdir", "python3"} <= set(body["kernelspecs"])
    cat = catalog(kg)
    broken = str(Path(kg.env["JUPYTER_DATA_DIR"]) / "kernels" / "broken" / "kernel.json")
    assert any(broken in w and "invalid JSON" in w for w in cat["warnings"]), cat["warnings"]
    assert wait_until(lambda: broken in kg.log_tail(400), 5), kg.log_tail()


def test_missing_interpreter_is_not_offered(kg):
    cat = catalog(kg)
    gone = entry(cat, "gone")
    assert gone and not gone["launchable"] and "does not exist" in gone["reason"], gone
    assert "gone" not in specs(kg)["kernelspecs"]
    status, _, body = kg.rest("POST", "/api/kernels", {"name": "gone"})
    assert status == 400 and "does not exist" in body["message"], (status, body)


def test_resource_dir_and_env_at_launch(kg, tree):
    out, _ = run_in(kg, "resdir", "import os, sys; print(sys.argv[0]); print(os.environ['KGATE_SPEC_VAR'])")
    argv0, var = out.strip().splitlines()
    assert argv0 == str(tree["second"] / "kernels" / "resdir" / "launch.py")
    assert var == "from-spec base-value"


@pytest.mark.parametrize("name,marks,expect_message", [("resdir", "marks-message.txt", True),
                                                       ("signalmode", "marks-signal.txt", False)])
def test_interrupt_mode_is_honoured(kg, tree, name, marks, expect_message):
    marks = tree["root"] / marks
    if marks.exists():
        marks.unlink()
    model = kg.start_kernel({"name": name})
    try:
        with kg.connect(model["id"]) as ws:
            result = ws.execute_async("import time; time.sleep(30)", stop_on_error=False)
            ws.wait_for(lambda m: m.get("msg_type") == "execute_input"
                        and m.get("parent_header", {}).get("msg_id") == result.msg_id, 20)
            time.sleep(0.3)
            status, _, _ = kg.rest("POST", f"/api/kernels/{model['id']}/interrupt")
            assert status == 204
            ws.collect(result, 20)
            assert result.status == "error", result
    finally:
        kg.delete_kernel(model["id"], check=False)
    got = marks.read_text().splitlines() if marks.exists() else []
    assert (got == ["interrupt_request"]) == expect_message, got


# ---- environments made in the test --------------------------------------------------------

def test_venv_with_ipykernel_is_offered_and_runs_in_the_venv(kg, tree):
    cat = catalog(kg)
    e = interpreter_entry(cat, tree["with_ipk"])
    assert e, json.dumps(cat["entries"], indent=1)
    assert e["launchable"], e
    assert e["kind"] == "interpreter" and e["name"].startswith("py-withipk-"), e
    assert "withipk" in e["display_name"], e
    model_spec = specs(kg)["kernelspecs"][e["name"]]
    assert model_spec["spec"]["argv"][0] == str(tree["with_ipk"] / "bin" / "python3"), model_spec
    # its logos are ipykernel's, served like any kernelspec's resources
    logo = model_spec["resources"].get("logo-64x64")
    assert logo, model_spec
    status, _, png = kg.http("GET", logo)
    assert status == 200 and png.startswith(b"\x89PNG"), (status, png[:40])
    out, model = run_in(kg, e["name"], "import sys; print(sys.prefix)")
    assert out.strip() == str(tree["with_ipk"])
    assert model["name"] == e["name"]


def test_venv_without_ipykernel_is_not_launchable(kg, tree):
    cat = catalog(kg)
    e = interpreter_entry(cat, tree["without"])
    assert e, json.dumps(cat["entries"], indent=1)
    assert not e["launchable"] and e["reason"] == "ipykernel not installed", e
    assert e["name"] not in specs(kg)["kernelspecs"]
    status, _, body = kg.rest("POST", "/api/kernels", {"name": e["name"]})
    assert status == 400 and "ipykernel not installed" in body["message"], (status, body)


def test_names_are_stable(kg, tree):
    before = {e["source"]: e["name"] for e in catalog(kg)["entries"] if e["kind"] == "interpreter"}
    after = {e["source"]: e["name"] for e in catalog(kg, refresh=True)["entries"] if e["kind"] == "interpreter"}
    assert before == after


def test_new_spec_is_noticed(kg, tree):
    write_spec(tree["data"], "late", display_name="Late arrival")
    try:
        assert wait_until(lambda: "late" in specs(kg)["kernelspecs"], 15), specs(kg)
    finally:
        import shutil
        shutil.rmtree(tree["data"] / "kernels" / "late")
    assert wait_until(lambda: "late" not in specs(kg)["kernelspecs"], 15)


def test_pyenv_python_without_ipykernel_is_reported(kg):
    """This machine's case: pyenv's python3 (no ipykernel) is first on PATH, Debian's has it."""
    cat = catalog(kg)
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    versions = sorted(pyenv.glob("3.*/bin/python3")) if pyenv.is_dir() else []
    for exe in versions:
        e = entry(cat, source=str(exe))
        assert e and not e["launchable"], (exe, e)
    py3 = entry(cat, "python3")
    assert py3 and py3["launchable"], py3
    assert cat["default"] == "python3"
    # no pyenv shim is ever probed
    assert not any("/shims/" in i["path"] for i in cat["interpreters"]), cat["interpreters"]


# ---- `kgate kernelspecs` ----------------------------------------------------------------------

def test_kernelspecs_command(kgate_bin, kg, tree):
    env = discovery_env(kg.env, tree)
    r = subprocess.run([kgate_bin, "kernelspecs"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    assert lines[0].split() [:2] == ["NAME", "DISPLAY"], lines[0]
    noipk = next(l for l in lines if str(tree["without"]) in l)
    assert "no: ipykernel not installed" in noipk, noipk
    withipk = next(l for l in lines if str(tree["with_ipk"]) in l)
    assert "yes" in withipk, withipk
    assert "broken" in r.stderr and "kernelspec skipped" in r.stderr, r.stderr
    j = subprocess.run([kgate_bin, "kernelspecs", "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert j.returncode == 0, j.stderr
    cat = json.loads(j.stdout)
    assert {e["name"] for e in cat["entries"]} == {e["name"] for e in catalog(kg)["entries"]}


# ---- a stock jupyter_server in --gateway-url mode ------------------------------------------

def test_stock_jupyter_server_lists_every_kgate_kernelspec(kg, tmp_path):
    js = JupyterServer(tmp_path / "js", kg.url, gateway_token=kg.token)
    try:
        js.wait_ready()
        status, _, body = js.rest("GET", "/api/kernelspecs")
        assert status == 200, (status, body, js.log_tail())
        ours = specs(kg)
        assert set(body["kernelspecs"]) == set(ours["kernelspecs"]), (sorted(body["kernelspecs"]), sorted(ours["kernelspecs"]))
        assert body["default"] == ours["default"]
        for name, model in body["kernelspecs"].items():
            assert model["spec"]["display_name"] == ours["kernelspecs"][name]["spec"]["display_name"]
    finally:
        js.stop()
