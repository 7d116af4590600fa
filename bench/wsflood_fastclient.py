#!/usr/bin/python3
"""The shared wsbench flood, with the client's pure-Python UTF-8 check of text frames off.

websocket-client validates every text message byte by byte in Python (~0.2 us/byte): for a
20 MB flood that is ~2-4 s of client CPU, the same for any gateway, which hides what the
gateway itself costs.  This runs wsbench's own gateway() flood with skip_utf8_validation=True.

usage: wsflood_fastclient.py WSBENCH_PATH URL TOKEN MEGABYTES
"""
import functools
import importlib.util
import sys

import websocket

path, url, token, mb = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
spec = importlib.util.spec_from_file_location("wsbench", path)
wsbench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wsbench)
websocket.create_connection = functools.partial(websocket.create_connection, skip_utf8_validation=True)
wsbench.websocket = websocket
lat = wsbench.gateway(url, token, mb, "python3", "flood")
