# kgate-mcp sends this cell to a new kernel, right after startup.py, to install
# the user's inspectors.py.  The translator replaces the two upper-case
# placeholders in the last lines with Python string literals (JSON-escaped):
# the file's text and its local path.  Each occurs once; keep it so.
#
# The contract (see config/inspectors.py):
# - the file may define `inspect` and/or a list `inspectors`; it runs in a
#   namespace of its own that already holds `RuleBlock`;
# - each inspector is called once per cell, before the cell runs: a 1-argument
#   one gets the cell's (IPython-transformed) AST, a 2-argument one gets
#   (tree, src) with the raw cell text;
# - a returned string is printed before the cell's output; raising RuleBlock
#   blocks the cell (IPython reports the InputRejected and runs nothing); any
#   other exception is printed as an inspector error and the cell runs anyway
#   (fail-open: a crashed inspector never passes for a policy block);
# - a file that fails to load raises here, so this cell's reply is an error and
#   the translator stops the kernel instead of running it uninspected.
#
# Cells run by a tool inside a cell (a nested run_cell) are not inspected
# again, nor are the ASTs that magics such as %time transform for themselves.
# Installing twice replaces the earlier installation.  A JSON string literal
# writes a character outside the BMP as a surrogate pair, which Python keeps
# as two lone surrogates: the pairs are joined back before compiling.


def __kgate_install_inspectors(source, path):
    import ast
    import inspect as inspect_mod
    import linecache
    import sys
    import traceback
    import types

    from IPython import get_ipython
    from IPython.core.error import InputRejected

    source, path = (s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
                    for s in (source, path))

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("inspectors.py needs an IPython kernel")

    class RuleBlock(InputRejected):
        """Raise this from an inspector to stop the cell from running."""

        def _render_traceback_(self):
            # IPython shows this instead of a traceback through its internals.
            where, tb = "", self.__traceback__
            while tb is not None:
                if tb.tb_frame.f_code.co_filename == path:
                    code = tb.tb_frame.f_code
                    where = f" ({code.co_name}, {path}, line {tb.tb_lineno})"
                tb = tb.tb_next
            return [f"The cell was blocked by an inspector{where}; none of it ran.",
                    f"{type(self).__name__}: {self}"]

    RuleBlock.__module__ = "kgate_inspectors"

    class InspectorsLoadError(Exception):
        def _render_traceback_(self):
            # The details went to stderr; no traceback through this installer.
            return [f"InspectorsLoadError: {self}"]

    def fail(summary, detail=""):
        sys.stderr.write(f"inspectors.py failed to load: {path}: {summary}\n{detail}")
        sys.stderr.flush()
        return InspectorsLoadError(f"{path} failed to load: {summary}")

    def describe(exc):
        return "".join(traceback.format_exception_only(type(exc), exc)).strip()

    def user_frames(exc):
        # The traceback without this installer's own frames.
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        return "".join(traceback.format_exception(type(exc), exc, tb)) if tb else ""

    # Load the file as a module of its own (dataclasses, pickling and
    # tracebacks want one in sys.modules).
    linecache.cache[path] = (len(source), None, source.splitlines(True), path)
    module = types.ModuleType("kgate_inspectors")
    module.__file__ = path
    module.RuleBlock = RuleBlock
    try:
        code = compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise fail(f"{type(exc).__name__}: {exc.msg} (line {exc.lineno})",
                   describe(exc) + "\n") from None
    saved = sys.modules.get("kgate_inspectors")
    sys.modules["kgate_inspectors"] = module
    try:
        exec(code, module.__dict__)
    except BaseException as exc:
        if saved is None:
            sys.modules.pop("kgate_inspectors", None)
        else:
            sys.modules["kgate_inspectors"] = saved
        raise fail(describe(exc).splitlines()[-1], user_frames(exc)) from None

    # Collect the inspectors and how many arguments each takes.
    found = []
    single = module.__dict__.get("inspect")
    if single is not None and not isinstance(single, types.ModuleType):
        found.append(("inspect", single))
    listed = module.__dict__.get("inspectors", ())
    if not isinstance(listed, (list, tuple)):
        raise fail(f"`inspectors` must be a list, not {type(listed).__name__}")
    for i, fn in enumerate(listed):
        found.append((getattr(fn, "__name__", f"inspectors[{i}]"), fn))

    def arity(name, fn):
        if not callable(fn):
            raise fail(f"{name} is not callable ({type(fn).__name__})")
        try:
            params = inspect_mod.signature(fn).parameters.values()
        except (TypeError, ValueError):
            return 1
        kinds = [p.kind for p in params]
        if inspect_mod.Parameter.VAR_POSITIONAL in kinds:
            return 2
        positional = sum(k in (inspect_mod.Parameter.POSITIONAL_ONLY,
                               inspect_mod.Parameter.POSITIONAL_OR_KEYWORD) for k in kinds)
        if positional == 0:
            raise fail(f"{name} takes no positional argument (it needs tree, or tree and src)")
        return 2 if positional >= 2 else 1

    checks = [(name, fn, arity(name, fn)) for name, fn in found]

    state = {"src": None}

    def stash_source(info):
        state["src"] = info.raw_cell

    def cell_source(frame):
        # The raw text of the cell being transformed: the pre_run_cell stash,
        # or for a silent cell (which fires no pre_run_cell) the argument of
        # run_cell_async itself.
        src, state["src"] = state["src"], None
        if src is None and frame is not None:
            src = frame.f_locals.get("raw_cell")
        return src if isinstance(src, str) else ""

    def own_cell():
        # -> (inspect?, the run_cell_async frame).  Only IPython's transform of
        # a top-level cell counts: a magic's own transform (its caller is not
        # run_cell_async) and a nested cell (two run_cell_async frames) do not.
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_name != "transform_ast":
            frame = frame.f_back
        if frame is None:
            return True, None  # an unknown driver: inspect rather than skip
        driver = frame.f_back
        cells = 0
        while frame is not None:
            if frame.f_code.co_name == "run_cell_async":
                cells += 1
            frame = frame.f_back
        if cells == 0:
            return True, None  # not IPython's usual path: inspect rather than skip
        if cells > 1:
            state["src"] = None  # the nested cell's own stash, unused
            return False, None
        if driver is None or driver.f_code.co_name != "run_cell_async":
            return False, None
        return True, driver

    class KgateInspectors(ast.NodeTransformer):
        kgate_inspectors = True

        def visit(self, tree):
            run, frame = own_cell()
            if not run:
                return tree
            src = cell_source(frame)
            for name, fn, nargs in checks:
                try:
                    note = fn(tree, src) if nargs == 2 else fn(tree)
                except InputRejected:
                    raise
                except Exception as exc:
                    print(f"inspector error (cell runs anyway): {exc!r} [in {name}]", flush=True)
                    continue
                if note is not None and note != "":
                    print(note if isinstance(note, str) else str(note), flush=True)
            return tree

        def __repr__(self):
            return f"<kgate inspectors from {path}>"

    stash_source.kgate_inspectors = True

    # Idempotent: drop an earlier installation (found by its marker, since the
    # classes of a previous run of this cell are different objects).
    shell.ast_transformers[:] = [t for t in shell.ast_transformers
                                 if not getattr(t, "kgate_inspectors", False)]
    for cb in list(shell.events.callbacks.get("pre_run_cell", [])):
        if getattr(cb, "kgate_inspectors", False):
            shell.events.unregister("pre_run_cell", cb)

    if not checks:
        sys.stderr.write(f"note: {path} defines neither `inspect` nor `inspectors`; "
                         "no cell is inspected\n")
        return
    shell.events.register("pre_run_cell", stash_source)
    shell.ast_transformers.append(KgateInspectors())


try:
    __kgate_install_inspectors(__KGATE_SOURCE__, __KGATE_PATH__)
finally:
    globals().pop("__kgate_install_inspectors", None)
