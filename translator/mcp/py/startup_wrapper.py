# kgate-mcp sends this cell to a new kernel to run the user's startup.py.
#
# The translator replaces the two upper-case placeholders in the last lines
# with Python string literals (JSON-escaped): the file's text and its local
# path.  Each occurs once; keep it so.  The code runs in the user's namespace,
# so what startup.py imports or defines is the user's.  __file__ names the
# local file while it runs and is removed afterwards, as `%run -i` would do.
# The source also goes into linecache, so a traceback shows its lines even
# when the kernel runs on another host.  A JSON string literal writes a
# character outside the BMP as a surrogate pair, which Python keeps as two
# lone surrogates: the pairs are joined back before compiling.


def __kgate_run_startup(source, path):
    source, path = (s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
                    for s in (source, path))
    user_ns = globals()
    user_ns["__file__"] = path
    try:
        __import__("linecache").cache[path] = (
            len(source), None, source.splitlines(True), path)
        exec(compile(source, path, "exec"), user_ns)
    finally:
        user_ns.pop("__file__", None)


try:
    __kgate_run_startup(__KGATE_SOURCE__, __KGATE_PATH__)
finally:
    globals().pop("__kgate_run_startup", None)
