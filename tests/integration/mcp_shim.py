"""Runs an MCP stdio server and logs the JSON-RPC between it and its client, one line per
message: '> ' to the server, '< ' from it, '! ' for a signal passed on.  Usage:
mcp_shim.py LOG SERVER [ARGS...].  Signals to the shim go to the server; the shim exits with it."""

import os
import signal
import subprocess
import sys
import threading


def main():
    log_path, argv = sys.argv[1], sys.argv[2:]
    log = open(log_path, "a", buffering=1)
    lock = threading.Lock()

    def note(prefix, data):
        with lock:
            log.write(prefix + " " + data.decode("utf-8", "replace").rstrip("\n") + "\n")

    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def forward(sig, _frame):
        note("!", signal.Signals(sig).name.encode())
        try:
            child.send_signal(sig)
        except OSError:
            pass

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)

    def to_child():
        for line in sys.stdin.buffer:
            note(">", line)
            try:
                child.stdin.write(line)
                child.stdin.flush()
            except OSError:
                break
        note("!", b"EOF")
        try:
            child.stdin.close()
        except OSError:
            pass

    threading.Thread(target=to_child, daemon=True).start()
    out = sys.stdout.buffer
    for line in child.stdout:
        note("<", line)
        out.write(line)
        out.flush()
    code = child.wait()
    note("!", f"exit {code}".encode())
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
