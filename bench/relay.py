#!/usr/bin/python3
"""A relay that does nothing: libzmq's own proxy (zmq_proxy) between a client and one kernel.

usage: relay.py KERNEL_CONNECTION_FILE OUT_CONNECTION_FILE

It binds a ROUTER for each of the kernel's shell, control and stdin channels, with a DEALER to
the kernel's socket behind it, and an XPUB for iopub with an XSUB behind it, each pair run by
zmq_proxy in a thread of its own (pyzmq lets go of the GIL there). It writes OUT, the kernel's
connection file with the relay's ports in it (the same key: the relay signs and checks nothing),
prints "ready", and runs until its standard input closes. The heartbeat is not relayed.

bench/wsclient.py's `relayed` mode puts it between a direct client and its kernel. It is the
cheapest thing a gateway process could be: one more process between client and kernel, with
libzmq's I/O thread and one thread of its own on each direction, and no decoding, signing,
JSON or records. So relay / direct is the floor for a gateway's round trip on this machine.
"""
import json
import os
import sys
import threading

import zmq


def main(src, out):
    with open(src) as f:
        cf = json.load(f)
    if cf.get("transport", "tcp") != "tcp":
        raise ValueError("relay.py relays tcp kernels only, not %r" % cf["transport"])
    ctx = zmq.Context()
    relayed = dict(cf)
    pairs = []
    for channel, front_type, back_type in (("shell", zmq.ROUTER, zmq.DEALER), ("control", zmq.ROUTER, zmq.DEALER),
                                           ("stdin", zmq.ROUTER, zmq.DEALER), ("iopub", zmq.XPUB, zmq.XSUB)):
        front, back = ctx.socket(front_type), ctx.socket(back_type)
        relayed[channel + "_port"] = front.bind_to_random_port("tcp://127.0.0.1")
        back.connect("tcp://%s:%d" % (cf["ip"], cf[channel + "_port"]))
        pairs.append((front, back))
    relayed["ip"] = "127.0.0.1"
    for front, back in pairs:
        threading.Thread(target=zmq.proxy, args=(front, back), daemon=True).start()
    fd = os.open(out + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(relayed, f)
    os.replace(out + ".tmp", out)
    print("ready", flush=True)
    sys.stdin.read()   # until the client closes it; the daemon threads end with the process


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    try:
        main(sys.argv[1], sys.argv[2])
    except Exception as e:
        print("relay: %s: %s" % (type(e).__name__, e), file=sys.stderr)
        sys.exit(1)
