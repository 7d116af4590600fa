# inspectors.py: checks that run in the kernel before every cell.
# Put it at $XDG_CONFIG_HOME/kgate/inspectors.py (normally ~/.config/kgate/).
# kgate-mcp sends it as source right after startup.py to every kernel that
# `connect` creates (and again after a restart), so it governs remote kernels
# too.  Attaching to an existing kernel installs nothing.
#
# The contract
# - Define a function `inspect` and/or a list `inspectors` of functions.
# - Each is called once per cell, before the cell runs:
#     def check(tree): ...        gets the cell's AST (an ast.Module, after
#                                 IPython turned magics and !shell lines into
#                                 get_ipython() calls);
#     def check(tree, src): ...   gets the AST and the raw cell text, for
#                                 lexical checks (magics, comments, spacing).
# - Return a string: it is printed before the cell's output, so the agent
#   reads it with the result.  Return None to say nothing.
# - Raise RuleBlock("why"): the cell does not run at all, and the reply is an
#   error that shows the message.  RuleBlock is already defined in this file's
#   namespace (it is a subclass of IPython's InputRejected); do not import it.
# - Any other exception is a bug in the inspector, not a verdict: it is
#   printed as "inspector error (cell runs anyway): ..." and the cell runs.
#   A crashed inspector never blocks a cell.
# - If this file fails to load (a syntax error, an import that fails, an
#   `inspectors` that is not a list of functions), creating the kernel fails
#   and the kernel is stopped: better no kernel than an uninspected one.
#
# Inspectors are a guard rail against mistakes, not a sandbox: code can always
# reach the same calls by paths no AST check foresees (getattr, exec, eval).
# Cells run by a tool inside a cell (a nested run_cell) are not inspected
# again.  The module's globals live in `kgate_inspectors` in the kernel.

import ast
import re

# --- a note ----------------------------------------------------------------


def note_wildcard_imports(tree):
    """Point out `from x import *`: it hides where names come from."""
    mods = [node.module or "." for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names)]
    if mods:
        return (f"note: `from {mods[0]} import *` makes it hard to tell where names come "
                "from; prefer importing the names you use")
    return None


# --- a block ---------------------------------------------------------------

# Shell-running calls, as the AST shows them: os.system(...), subprocess.run(...), ...
SHELL_CALLS = {("os", "system"), ("os", "popen"), ("subprocess", "run"), ("subprocess", "call"),
               ("subprocess", "check_call"), ("subprocess", "check_output"),
               ("subprocess", "Popen")}
# rm -r (with any other flags) of /, /*, ~, ~/, $HOME or *; mkfs; dd onto a device.
DANGEROUS = re.compile(
    r"\brm\s+(?:-\S*\s+)*-\S*[rR]\S*\s+(?:-\S*\s+)*(?:/|/\*|~/?|~/\*|\$HOME/?|\*)(?=[\s;&|]|$)"
    r"|\bmkfs(?:\.\w+)?\s|\bdd\s.*\bof=/dev/")


def _call_name(node):
    """('os', 'system') for os.system(...); None for anything else."""
    f = node.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        return (f.value.id, f.attr)
    return None


def _literal_text(node):
    """The text of a string (or list of strings) argument, when it is a literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return " ".join(_literal_text(e) or "" for e in node.elts)
    if isinstance(node, ast.JoinedStr):  # an f-string: its constant parts
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant))
    return None


def block_destructive_shell(tree, src):
    """Refuse os.system("rm -rf /...")-like calls, and the same through `!` lines
    (IPython turns `!rm -rf /` into get_ipython().system('rm -rf /'))."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        name = _call_name(node)
        shell_line = (isinstance(node.func, ast.Attribute) and node.func.attr == "system"
                      and isinstance(node.func.value, ast.Call))  # get_ipython().system
        if name in SHELL_CALLS or shell_line:
            text = " ".join((_literal_text(node.args[0]) or "").split())
            if DANGEROUS.search(text):
                raise RuleBlock(f"blocked: this cell runs `{text[:80]}` in a shell. "
                                "Remove files by name (pathlib, shutil.rmtree on a checked "
                                "path), never a whole home or root directory.")
    # A lexical check on the raw text: %%bash / %%sh cell magics.
    first = src.lstrip().splitlines()[0] if src.strip() else ""
    if first.startswith(("%%bash", "%%sh", "%%script")) and DANGEROUS.search(src):
        raise RuleBlock("blocked: a destructive command in a shell cell magic")
    return None


inspectors = [note_wildcard_imports, block_destructive_shell]
