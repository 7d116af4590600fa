"""The kernel side of startup.py and inspectors.py (translator/mcp/py/*.py).

kgate-mcp sends translator/mcp/py/startup_wrapper.py and install_inspectors.py to a new kernel
as execute requests, with two placeholders replaced by JSON string literals.  These tests
do the same substitution and send the cells to a real ipykernel started with
jupyter_client's KernelManager, so they need neither kgate nor kgate-mcp.
"""

import json
import queue
import re
from pathlib import Path

import pytest
from jupyter_client.manager import KernelManager

REPO = Path(__file__).resolve().parents[2]
PY_DIR = REPO / "translator" / "mcp" / "py"
WRAPPER = PY_DIR / "startup_wrapper.py"
INSTALLER = PY_DIR / "install_inspectors.py"
PLACEHOLDER_RE = re.compile(r"__KGATE_(SOURCE|PATH)__")
ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[@-~]")


def substitute(template, source, path, ensure_ascii=True):
    """One pass over the template, as the C++ side does: a placeholder inside the
    substituted text is never replaced again."""
    values = {"SOURCE": source, "PATH": path}
    return PLACEHOLDER_RE.sub(
        lambda m: json.dumps(values[m.group(1)], ensure_ascii=ensure_ascii), template)


class Run:
    def __init__(self, reply, msgs):
        self.reply = reply["content"]
        self.msgs = msgs  # iopub messages of this request, in order

    @property
    def status(self):
        return self.reply["status"]

    def stream(self, name):
        return "".join(m["content"]["text"] for m in self.msgs
                       if m["msg_type"] == "stream" and m["content"]["name"] == name)

    @property
    def stdout(self):
        return self.stream("stdout")

    @property
    def stderr(self):
        return self.stream("stderr")

    @property
    def error(self):
        for m in self.msgs:
            if m["msg_type"] == "error":
                return m["content"]
        return None

    @property
    def error_text(self):
        err = self.error
        return ANSI_RE.sub("", "\n".join(err["traceback"])) if err else ""

    def result(self):
        for m in self.msgs:
            if m["msg_type"] == "execute_result":
                return m["content"]["data"]["text/plain"]
        return None

    def kinds(self):
        """(msg_type, stream name or '') of the output messages, in order."""
        return [(m["msg_type"], m["content"].get("name", "")) for m in self.msgs
                if m["msg_type"] in ("stream", "execute_result", "display_data", "error")]

    def __repr__(self):
        return (f"Run(status={self.status!r}, stdout={self.stdout!r}, stderr={self.stderr!r}, "
                f"error={self.error_text[-2000:]!r})")


class Kernel:
    def __init__(self):
        # jupyter_client picks the ports and the kernel binds them later: with kgate's tests
        # starting kernels in the other worker, one can be taken in between, and ipykernel
        # exits ("Kernel died before replying to kernel_info").  jupyter_client does not
        # relaunch (kgate does), so the fixture does, on fresh ports.
        for attempt in range(3):
            self.km = KernelManager(kernel_name="python3")
            self.km.start_kernel()
            self.kc = self.km.client()
            self.kc.start_channels()
            try:
                self.kc.wait_for_ready(timeout=60)
                return
            except RuntimeError:
                self.kc.stop_channels()
                self.km.shutdown_kernel(now=True)
                if attempt == 2:
                    raise

    def run(self, code, timeout=60, silent=False):
        msgs = []
        reply = self.kc.execute_interactive(code, timeout=timeout, silent=silent,
                                            store_history=not silent,
                                            output_hook=msgs.append, allow_stdin=False,
                                            # as kgate's agent path sends cells: an error
                                            # must not abort the next request
                                            stop_on_error=False)
        return Run(reply, msgs)

    def value(self, expr):
        run = self.run(expr)
        assert run.status == "ok", run
        return run.result()

    def install(self, source, path="/home/someone/.config/kgate/inspectors.py"):
        return self.run(substitute(INSTALLER.read_text(), source, path))

    def startup(self, source, path="/home/someone/.config/kgate/startup.py", **kw):
        return self.run(substitute(WRAPPER.read_text(), source, path, **kw))

    def close(self):
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=True)


@pytest.fixture
def kern():
    k = Kernel()
    yield k
    k.close()


def installed(kern, source):
    run = kern.install(source)
    assert run.status == "ok", run
    assert run.stdout == "" and run.stderr == "", run
    return run


# --------------------------------------------------------------------------
# The files themselves
# --------------------------------------------------------------------------

@pytest.mark.parametrize("path", [WRAPPER, INSTALLER], ids=lambda p: p.name)
def test_templates_embed_cleanly(path):
    text = path.read_text()
    assert ')kgate_embed"' not in text
    found = PLACEHOLDER_RE.findall(text)
    assert sorted(found) == ["PATH", "SOURCE"], f"each placeholder exactly once: {found}"
    # with the placeholders substituted the cell is valid Python
    compile(substitute(text, "pass\n", "/x/y.py"), path.name, "exec")


# --------------------------------------------------------------------------
# Inspectors
# --------------------------------------------------------------------------

NOTE_SRC = '''
import ast

def inspect(tree):
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    if "pandas_thing" in names:
        return "note: pandas_thing is slow"
'''


def test_note_is_printed_before_the_output(kern):
    installed(kern, NOTE_SRC)
    run = kern.run("pandas_thing = 3\nprint('the output')\npandas_thing * 2")
    assert run.status == "ok", run
    assert run.stdout == "note: pandas_thing is slow\nthe output\n", run
    assert run.result() == "6"
    assert run.kinds()[-1] == ("execute_result", ""), run.kinds()
    # a cell the inspector has nothing to say about gets no note
    quiet = kern.run("print('plain')")
    assert quiet.stdout == "plain\n", quiet


BLOCK_SRC = '''
import ast

def inspect(tree):
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "system"):
            raise RuleBlock("os.system is not allowed here; use subprocess.run")
'''


def test_block_stops_the_cell(kern):
    installed(kern, BLOCK_SRC)
    run = kern.run("import os\nx_blocked = 1\nos.system('true')")
    assert run.status == "error", run
    assert run.reply["ename"] == "RuleBlock", run.reply
    assert "os.system is not allowed here" in run.reply["evalue"], run.reply
    # a short report (no traceback through IPython), the exception line last
    assert run.error["traceback"] == [
        "The cell was blocked by an inspector (inspect, /home/someone/.config/kgate/"
        "inspectors.py, line 8); none of it ran.",
        "RuleBlock: os.system is not allowed here; use subprocess.run"], run.error
    # nothing of the cell ran
    assert kern.value("'x_blocked' in globals(), 'os' in globals()") == "(False, False)"
    # RuleBlock is an InputRejected, and the kernel goes on serving
    assert kern.value("1+1") == "2"


def test_block_applies_to_silent_cells(kern):
    installed(kern, BLOCK_SRC)
    run = kern.run("import os\nx_silent = 1\nos.system('true')", silent=True)
    assert run.status == "error", run
    assert kern.value("'x_silent' in globals()") == "False"


def test_crashing_inspector_notes_and_the_cell_runs(kern):
    installed(kern, '''
def inspect(tree):
    raise ValueError("bug in my inspector")
''')
    run = kern.run("x_ran = 41\nprint('ran')")
    assert run.status == "ok", run
    assert run.stdout.startswith(
        "inspector error (cell runs anyway): ValueError('bug in my inspector')"), run
    assert run.stdout.endswith("ran\n"), run
    assert kern.value("x_ran") == "41"


def test_two_arg_inspector_gets_the_raw_source(kern):
    installed(kern, '''
import ast
seen = []

def lexical(tree, src):
    seen.append(src)
    return "src=" + repr(src)

def structural(tree):
    seen.append(type(tree).__name__)

inspectors = [lexical, structural]
''')
    cell = "%time x_timed = 1\nx_timed"
    run = kern.run(cell)
    assert run.status == "ok", run
    assert run.stdout.startswith("src=" + repr(cell) + "\n"), run
    assert run.result() == "1"
    probe = "import kgate_inspectors as k\nprint(k.seen)"
    run = kern.run(probe)
    # once per cell each, in list order; the 1-arg one got IPython's transformed AST,
    # and %time's own transform of its statement was not inspected again
    assert run.stdout.endswith(repr([cell, "Module", probe, "Module"]) + "\n"), run


def test_inspect_and_inspectors_both_run_in_order(kern):
    installed(kern, '''
def inspect(tree):
    return "first"

def second(tree, src):
    return "second"

inspectors = [second]
''')
    run = kern.run("print('out')")
    assert run.stdout == "first\nsecond\nout\n", run


def test_nested_run_cell_is_not_inspected_again(kern):
    installed(kern, '''
def inspect(tree, src):
    return "inspected: " + src.splitlines()[0]
''')
    run = kern.run("get_ipython().run_cell('y_nested = 2')\nprint('outer done')")
    assert run.status == "ok", run
    assert run.stdout.count("inspected: ") == 1, run
    assert "inspected: get_ipython().run_cell" in run.stdout, run
    assert kern.value("y_nested") == "2"


def test_installing_twice_does_not_double_register(kern):
    installed(kern, NOTE_SRC)
    installed(kern, NOTE_SRC)
    run = kern.run("pandas_thing = 1")
    assert run.stdout == "note: pandas_thing is slow\n", run
    counts = kern.value(
        "(sum(getattr(t, 'kgate_inspectors', False) for t in get_ipython().ast_transformers),"
        " sum(getattr(c, 'kgate_inspectors', False)"
        " for c in get_ipython().events.callbacks['pre_run_cell']))")
    assert counts == "(1, 1)", counts
    # a second install with other inspectors replaces the first
    installed(kern, BLOCK_SRC)
    run = kern.run("pandas_thing = 2")
    assert run.status == "ok" and run.stdout == "", run


def test_installer_leaves_the_user_namespace_alone(kern):
    before = kern.value("sorted(k for k in globals() if not k.startswith('_'))")
    installed(kern, NOTE_SRC)
    after = kern.value("sorted(k for k in globals() if not k.startswith('_'))")
    assert before == after
    assert kern.value("[k for k in globals() if 'kgate' in k]") == "[]"


@pytest.mark.parametrize("source,expect", [
    ("def inspect(tree:\n    pass\n", "SyntaxError"),
    ("import no_such_module_kgate\n", "ModuleNotFoundError"),
    ("raise RuntimeError('config is broken')\n", "RuntimeError: config is broken"),
    ("inspectors = [42]\n", "not callable"),
    ("inspectors = 'oops'\n", "must be a list"),
    ("def inspect():\n    pass\n", "no positional argument"),
], ids=["syntax", "import", "raise", "not-callable", "not-a-list", "no-args"])
def test_load_failure_is_an_error_reply(kern, source, expect):
    run = kern.install(source, path="/cfg/kgate/inspectors.py")
    assert run.status == "error", run
    assert run.stderr.startswith("inspectors.py failed to load: /cfg/kgate/inspectors.py: "), run
    assert expect in run.stderr, run
    # the error itself is one line (the details are on stderr), no installer traceback
    assert run.reply["ename"] == "InspectorsLoadError", run.reply
    assert run.error["traceback"] == [
        f"InspectorsLoadError: {run.reply['evalue']}"], run.error
    assert run.reply["evalue"].startswith("/cfg/kgate/inspectors.py failed to load: "), run.reply
    # nothing was installed
    assert kern.value("[t for t in get_ipython().ast_transformers"
                      " if getattr(t, 'kgate_inspectors', False)]") == "[]"


def test_load_failure_names_the_line(kern):
    run = kern.install("x = 1\n\ndef helper():\n    return 1 / 0\n\nhelper()\n",
                       path="/cfg/kgate/inspectors.py")
    assert run.status == "error", run
    assert 'File "/cfg/kgate/inspectors.py", line 6' in run.stderr, run
    assert "return 1 / 0" in run.stderr, run  # the source came along via linecache
    assert "ZeroDivisionError" in run.stderr, run


def test_no_inspectors_defined_is_not_an_error(kern):
    run = kern.install("# nothing here yet\n")
    assert run.status == "ok", run
    assert "defines neither" in run.stderr, run
    assert kern.run("1").stdout == ""


# --------------------------------------------------------------------------
# startup.py
# --------------------------------------------------------------------------

STARTUP_PATH = "/home/someone/.config/kgate/startup.py"


def test_startup_binds_file_during_and_removes_it_after(kern):
    run = kern.startup('''
import json as startup_json
seen_file = __file__
def helper():
    return "helper from startup"
print("startup ran from", __file__)
''', path=STARTUP_PATH)
    assert run.status == "ok", run
    assert run.stdout == f"startup ran from {STARTUP_PATH}\n", run
    assert kern.value("seen_file") == repr(STARTUP_PATH)
    assert kern.value("'__file__' in globals()") == "False"
    # its imports and definitions are the user's
    assert kern.value("startup_json.dumps([1])") == "'[1]'"
    assert kern.value("helper()") == "'helper from startup'"
    assert kern.value("[k for k in globals() if 'kgate' in k]") == "[]"


def test_startup_error_is_an_error_reply_and_file_is_still_removed(kern):
    run = kern.startup("a = 1\nb = undefined_name\n", path=STARTUP_PATH)
    assert run.status == "error", run
    assert run.reply["ename"] == "NameError", run.reply
    assert STARTUP_PATH in run.error_text and "b = undefined_name" in run.error_text, run
    assert kern.value("a, '__file__' in globals()") == "(1, False)"


def test_startup_that_deletes_file_itself(kern):
    run = kern.startup("x = __file__\ndel __file__\n")
    assert run.status == "ok", run
    assert kern.value("'__file__' in globals()") == "False"


@pytest.mark.parametrize("ensure_ascii", [True, False], ids=["escaped", "utf8"])
def test_startup_non_ascii_source(kern, ensure_ascii):
    # json.dumps escapes U+1F600 as a surrogate pair when ensure_ascii is on
    run = kern.startup('smile = "\U0001F600 caf\u00e9"\nprint(smile)\n',
                       path="/home/s\u00f8ren/startup.py", ensure_ascii=ensure_ascii)
    assert run.status == "ok", run
    assert run.stdout == "\U0001F600 caf\u00e9\n", run
    assert kern.value("len(smile)") == "6"


def test_startup_then_inspectors_order(kern):
    """The order kgate-mcp uses: startup.py, then inspectors.py; startup is not inspected."""
    assert kern.startup("import os\nos_ok = True\n").status == "ok"
    installed(kern, BLOCK_SRC)
    assert kern.run("os.system('true')").status == "error"
    assert kern.value("os_ok") == "True"


# --------------------------------------------------------------------------
# The samples in config/
# --------------------------------------------------------------------------

CONFIG_DIR = REPO / "config"


def test_sample_inspectors(kern):
    installed(kern, (CONFIG_DIR / "inspectors.py").read_text())
    run = kern.run("from os.path import *\nprint('ok')")
    assert run.status == "ok", run
    assert run.stdout.startswith("note: `from os.path import *`"), run
    for cell in ['import os\nos.system("rm -rf /")',
                 'import subprocess\nsubprocess.run(["rm", "-rf", "~"])',
                 '!rm -rf $HOME/',
                 '%%bash\nrm -rf /\n']:
        run = kern.run("x_sample_blocked = 1\n" + cell if not cell.startswith("%%") else cell)
        assert run.status == "error" and run.reply["ename"] == "RuleBlock", (cell, run)
    assert kern.value("'x_sample_blocked' in globals()") == "False"
    run = kern.run('import os\nos.system("true")\n!true')
    assert run.status == "ok" and run.stdout == "", run


def test_sample_startup(kern):
    path = str(CONFIG_DIR / "startup.py")
    run = kern.startup((CONFIG_DIR / "startup.py").read_text(), path=path)
    assert run.status == "ok", run
    assert run.stdout.startswith("python 3."), run
    assert "(startup: startup.py)" in run.stdout, run
    assert kern.value("'__file__' in globals()") == "False"
