"""Kernelspecs whose argv is a shell wrapper around ipykernel, for the tests of a kernel that
misbehaves at start (test_port_collision.py, test_ssh.py).  Each wrapper counts its launches in
$STATE/count, so a test can tell which launch did what."""

import json
import os
import signal

# Every wrapper starts with this: n is this launch's number, from 1.
COUNT = 'n=$(cat "$STATE/count" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$STATE/count"\n'

# Launch 1: another process, in a session of its own, takes the kernel's heartbeat port before
# ipykernel binds it. ipykernel's heartbeat thread dies on EADDRINUSE and the kernel runs on,
# answering on its other four ports, with no heartbeat (seen under load, locally and on a node).
HB_TAKEN = COUNT + r'''
if [ "$n" = 1 ]; then
  cp "$1" "$STATE/taken-1.json"
  setsid /usr/bin/python3 -c '
import json, socket, sys, time
info = json.load(open(sys.argv[1]))
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((info["ip"], info["hb_port"])); s.listen(1)
open(sys.argv[2], "w").write("bound")
time.sleep(60)' "$1" "$STATE/bound" &
  echo $! > "$STATE/blocker.pid"
  while [ ! -e "$STATE/bound" ]; do sleep 0.05; done
fi
exec /usr/bin/python3 -m ipykernel_launcher -f "$1"
'''


def add_wrapped_spec(kg, name, script, state, env=None):
    """Kernelspec `name` in kg's Jupyter path: `/bin/sh wrapper.sh {connection_file}`, with
    STATE (created) and `env` in its environment."""
    state.mkdir(parents=True, exist_ok=True)
    spec = kg.root / "share" / "kernels" / name
    spec.mkdir(parents=True)
    (spec / "wrapper.sh").write_text(script)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": ["/bin/sh", "{resource_dir}/wrapper.sh", "{connection_file}"],
        "display_name": name, "language": "python", "env": {"STATE": str(state), **(env or {})},
    }))
    return state


def launches(state):
    return int((state / "count").read_text())


def taken_hb_port(state):
    return json.loads((state / "taken-1.json").read_text())["hb_port"]


def stop_blocker(state):
    """Ends HB_TAKEN's port holder, if it was started."""
    pid = state / "blocker.pid"
    if pid.exists():
        try:
            os.kill(int(pid.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass
