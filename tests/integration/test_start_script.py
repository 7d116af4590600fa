"""scripts/start.sh, the README's first command: it runs `kgate serve` with the extra
arguments given, and once kgate listens prints the address kgate really bound (not the default
when --port 0 chose another) and the `claude mcp add` line for kgate-mcp with that address."""

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import die_with_parent, make_jupyter_env, wait_until

REPO = Path(__file__).resolve().parents[2]


def test_start_script_prints_the_address_kgate_bound(tmp_path):
    if not (REPO / "build" / "gateway" / "kgate").is_file():
        pytest.skip("start.sh runs ./build's kgate, and ./build is not built here")
    env = make_jupyter_env(tmp_path)
    env["KGATE_NO_BUILD"] = "1"  # the build step is build.sh's, which every other test relies on
    proc = subprocess.Popen([str(REPO / "scripts" / "start.sh"), "--port", "0"], env=env, cwd=str(tmp_path),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=die_with_parent)
    lines = []

    def read():
        for raw in iter(proc.stdout.readline, b""):
            lines.append(raw.decode("utf-8", "replace").rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert wait_until(lambda: any("claude mcp add" in l for l in lines), 60), "\n".join(lines[-40:])
        text = "\n".join(lines)
        listen = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", text)
        assert listen, text
        port = int(listen.group(1))
        assert port != 8787
        url = f"http://127.0.0.1:{port}"
        assert f"kgate is serving on {url} " in text, text
        assert "127.0.0.1:8787" not in text, "the default address is printed though kgate bound another"
        mcp = str(REPO / "build" / "translator" / "kgate-mcp")
        assert f"claude mcp add kernel -e KGATE_URL={url} -- {mcp}" in text, text
        assert not re.search(r"\bissue \d", text, re.I), "start.sh speaks of planning issues"
        # The observe page's link carries kgate's own token, which opens the API too; the
        # gateway line names the token's file, not the token.
        observe = re.search(rf"^    ({re.escape(url)}/observe\?token=([0-9a-f]{{64}}))$", text, re.M)
        assert observe, text
        token = observe.group(2)
        state_token = Path(env["XDG_STATE_HOME"]) / "kgate" / "token"
        assert state_token.read_text().strip() == token
        assert f"jupyter server --gateway-url={url} --GatewayClient.auth_token=$(cat {state_token})" in text, text
        import urllib.error
        import urllib.request
        with urllib.request.urlopen(observe.group(1), timeout=10) as r:
            assert r.status == 200
        with urllib.request.urlopen(f"{url}/api?token={token}", timeout=10) as r:
            assert r.status == 200
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url + "/api", timeout=10)
        assert refused.value.code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(5)
