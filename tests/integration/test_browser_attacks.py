"""A malicious local web page in headless Chromium (cdp.py) attacks kgate.

- Cross-origin (CSRF): a page served from another port on 127.0.0.1 posts to
  /api/kernels (a preflighted JSON POST, and a "simple" no-cors text/plain POST that the
  browser sends without asking) and opens the channels websocket of an existing kernel.
- DNS rebinding: Chromium resolves rebind.test to 127.0.0.1 (--host-resolver-rules), as a
  rebinding attacker's name would after its TTL ran out. First the page at
  rebind.test:<page port> calls rebind.test:<kgate port>; then the real attack: the page is
  served at rebind.test:P, its server goes away and kgate takes port P, so the page's own
  origin now is kgate, its requests are same-origin (Origin equals Host), and only kgate's
  Host check stands between it and the kernels.

Each test checks that the browser's request did reach kgate (its refusal is in kgate's log),
so a browser that blocked the request itself cannot make it pass."""

import http.server
import json
import os
import socket
import threading
import time

import pytest

from cdp import CHROMIUM, Chromium
from conftest import Kgate, runtime_files, wait_until

REBIND = "rebind.test"

ATTACK_PAGE = r"""<!doctype html>
<html><head><meta charset="utf-8"><title>totally harmless</title></head>
<body><p>Nothing to see here.</p>
<script>
async function tryFetch(url, opts) {
  try {
    const r = await fetch(url, opts);
    let body = null;
    try { body = await r.text(); } catch (e) { body = "unreadable: " + e; }
    return {fetched: true, type: r.type, status: r.status, body: body};
  } catch (e) {
    return {fetched: false, error: String(e)};
  }
}
function tryWs(url, ms) {
  return new Promise(resolve => {
    const events = [];
    let ws;
    try { ws = new WebSocket(url); } catch (e) { resolve({events: ["throw: " + e]}); return; }
    const timer = setTimeout(() => { events.push("timeout"); try { ws.close(); } catch (e) {} resolve({events}); }, ms);
    ws.onopen = () => { events.push("open"); try { ws.send("{}"); } catch (e) {} };
    ws.onmessage = () => events.push("message");
    ws.onerror = () => events.push("error");
    ws.onclose = e => { events.push("close:" + e.code); clearTimeout(timer); resolve({events}); };
  });
}
const BODY = JSON.stringify({name: "python3"});
// Everything a page can throw at a kernel gateway at `base` (no trailing slash).
async function attack(base, wsBase, kernelId) {
  return {
    read_list: await tryFetch(base + "/api/kernels", {}),
    json_post: await tryFetch(base + "/api/kernels",
        {method: "POST", headers: {"Content-Type": "application/json"}, body: BODY}),
    simple_post: await tryFetch(base + "/api/kernels",
        {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body: BODY}),
    ws: await tryWs(wsBase + "/api/kernels/" + kernelId + "/channels", 10000),
  };
}
</script></body></html>
"""


class PageServer:
    """The attacker's web server: a ThreadingHTTPServer on 127.0.0.1 serving the page.
    stop() also closes the connections it accepted: Chromium preconnects spare sockets to an
    origin and would send a later request on one of those, to this server, not to whoever
    listens on the port by then."""

    def __init__(self, port=0):
        page = ATTACK_PAGE.encode()
        accepted = self.accepted = []

        class Server(http.server.ThreadingHTTPServer):
            def get_request(self):
                conn, addr = super().get_request()
                accepted.append(conn)
                return conn, addr

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"   # one request per connection: nothing kept alive
            timeout = 5                     # an idle preconnected socket is not held for ever

            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(page)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args):
                pass

        self.httpd = Server(("127.0.0.1", port), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.thread.join(5)
            self.httpd = None
            for conn in self.accepted:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                try:
                    conn.close()
                except OSError:
                    pass


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium "
                    "(apt-get install -y --no-install-recommends chromium) for the browser attack tests")
    b = Chromium.launch(tmp_path_factory.mktemp("chromium-attacks") / "profile", timeout=60,
                        extra_args=[f"--host-resolver-rules=MAP {REBIND} 127.0.0.1"])
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def page_server():
    srv = PageServer()
    try:
        yield srv
    finally:
        srv.stop()


def kernel_ids(kg):
    status, _, body = kg.rest("GET", "/api/kernels")
    assert status == 200, (status, body)
    return sorted(k["id"] for k in body)


def log_since(kg, mark):
    with kg._log_lock:
        return kg.log_lines[mark:]


def run_attack(page, base, ws_base, kernel_id):
    expr = f"attack({json.dumps(base)}, {json.dumps(ws_base)}, {json.dumps(kernel_id)})"
    return page.evaluate(expr, timeout=60)


def assert_ws_never_opened(result, what):
    events = result["events"]
    assert "open" not in events and "message" not in events, (
        f"{what}: the page's websocket opened: events {events}")
    assert any(e.startswith("close:") for e in events) or "error" in events, (
        f"{what}: the websocket neither failed nor closed: {events}")


def assert_nothing_started(kg, ids_before, files_before, what):
    # a kernel start takes about a second: give an accepted POST time to show
    time.sleep(2.0)
    after = kernel_ids(kg)
    started = sorted(set(after) - set(ids_before))
    for kid in started:
        kg._kernels.add(kid)   # cleaned up at teardown
    assert not started, f"{what}: the page started kernel(s) {started}"
    assert runtime_files(kg) == files_before, (
        f"{what}: new files in the runtime dir: {sorted(runtime_files(kg) - files_before)}")


# ------------------------------------------------------------------------ cross-origin page

def test_cross_origin_page_cannot_start_kernels_or_open_channels(kgate, shared_kernel, browser, page_server):
    ids_before, files_before = kernel_ids(kgate), runtime_files(kgate)
    mark = len(kgate.log_lines)
    page = browser.page()
    page_origin = f"http://127.0.0.1:{page_server.port}"
    page.navigate(f"{page_origin}/attack.html")
    res = run_attack(page, f"http://127.0.0.1:{kgate.port}", f"ws://127.0.0.1:{kgate.port}", shared_kernel)

    # nothing readable: a preflighted or a CORS request fails in the browser
    assert not res["read_list"]["fetched"], f"the page read the kernel list: {res['read_list']}"
    assert not res["json_post"]["fetched"], f"the preflighted JSON POST went through: {res['json_post']}"
    # the simple request is sent without asking; its answer is opaque to the page
    sp = res["simple_post"]
    assert not sp["fetched"] or sp["type"] == "opaque", f"no-cors POST answer readable: {sp}"
    assert_ws_never_opened(res["ws"], "cross-origin page")
    assert_nothing_started(kgate, ids_before, files_before, "cross-origin page")

    # the requests did reach kgate, and were refused for their Origin
    def refused(method, path):
        return [ln for ln in log_since(kgate, mark)
                if f"refused {method} {path}: Origin {page_origin} is not allowed" in ln]

    assert wait_until(lambda: refused("POST", "/api/kernels"), 5), (
        "kgate's log shows no Origin refusal of the page's POST /api/kernels (did the browser send "
        "it?)\n" + "\n".join(log_since(kgate, mark)))
    assert refused("GET", f"/api/kernels/{shared_kernel}/channels"), (
        "kgate's log shows no Origin refusal of the page's websocket\n" + "\n".join(log_since(kgate, mark)))
    assert refused("GET", "/api/kernels"), (
        "no Origin refusal of the page's GET /api/kernels\n" + "\n".join(log_since(kgate, mark)))
    # the JSON POST needed a preflight: refused, so the POST itself was never sent
    assert refused("OPTIONS", "/api/kernels"), (
        "no Origin refusal of the JSON POST's preflight\n" + "\n".join(log_since(kgate, mark)))
    # and the kernel the page aimed at is untouched
    with kgate.connect(shared_kernel) as ws:
        assert ws.run("print('unharmed')") == "unharmed\n"


# ------------------------------------------------------------------------ DNS rebinding

def test_rebound_name_on_another_port_is_refused(kgate, shared_kernel, browser, page_server):
    """The page at rebind.test:<page port> calls rebind.test:<kgate port>."""
    ids_before, files_before = kernel_ids(kgate), runtime_files(kgate)
    mark = len(kgate.log_lines)
    page = browser.page()
    page.navigate(f"http://{REBIND}:{page_server.port}/attack.html")
    assert page.evaluate("location.hostname") == REBIND
    res = run_attack(page, f"http://{REBIND}:{kgate.port}", f"ws://{REBIND}:{kgate.port}", shared_kernel)

    assert not res["read_list"]["fetched"], f"the page read the kernel list: {res['read_list']}"
    assert not res["json_post"]["fetched"], f"the JSON POST went through: {res['json_post']}"
    sp = res["simple_post"]
    assert not sp["fetched"] or sp["type"] == "opaque", f"no-cors POST answer readable: {sp}"
    assert_ws_never_opened(res["ws"], "rebound name")
    assert_nothing_started(kgate, ids_before, files_before, "rebound name")

    def refused(method, path):
        return [ln for ln in log_since(kgate, mark)
                if f"refused {method} {path}: Host {REBIND} is not a loopback name" in ln]

    assert wait_until(lambda: refused("POST", "/api/kernels"), 5), (
        "kgate's log shows no Host refusal of the page's POST\n" + "\n".join(log_since(kgate, mark)))
    assert refused("GET", f"/api/kernels/{shared_kernel}/channels"), (
        "kgate's log shows no Host refusal of the page's websocket\n" + "\n".join(log_since(kgate, mark)))


def test_dns_rebinding_same_origin_is_refused(kgate_bin, browser, tmp_path_factory):
    """The real attack: the page's own origin (rebind.test:P) becomes kgate. Its requests are
    same-origin, so the browser lets the page read the answers, and Origin equals Host:
    only the Host check refuses them, and the page reads the 403."""
    srv = PageServer()
    port = srv.port
    page = browser.page()
    try:
        page.navigate(f"http://{REBIND}:{port}/attack.html")
        assert page.evaluate("location.origin") == f"http://{REBIND}:{port}"
    finally:
        srv.stop()   # the attacker's server goes away...

    kg = Kgate(kgate_bin, tmp_path_factory.mktemp("kgate-rebind"))
    kg.args[kg.args.index("--port") + 1] = str(port)   # ...and kgate listens on its port
    kg.start()
    try:
        assert kg.port == port, (kg.port, port)
        kid = kg.start_kernel()["id"]
        ids_before, files_before = kernel_ids(kg), runtime_files(kg)
        mark = len(kg.log_lines)
        # relative URLs: same origin as the page
        res = run_attack(page, "", f"ws://{REBIND}:{port}", kid)

        for key in ("read_list", "json_post", "simple_post"):
            r = res[key]
            assert r["fetched"] and r["type"] == "basic", (
                f"{key}: a same-origin request should come back readable: {r}")
            assert r["status"] == 403, f"{key}: kgate answered the rebound page with {r['status']}: {r}"
            body = json.loads(r["body"])
            assert f"Host {REBIND} is not allowed" in body["message"], (key, body)
        assert_ws_never_opened(res["ws"], "rebound same-origin page")
        assert_nothing_started(kg, ids_before, files_before, "rebound same-origin page")

        lines = log_since(kg, mark)
        for method, path in (("GET", "/api/kernels"), ("POST", "/api/kernels"),
                             ("GET", f"/api/kernels/{kid}/channels")):
            assert any(f"refused {method} {path}: Host {REBIND} is not a loopback name" in ln
                       for ln in lines), f"no Host refusal of {method} {path} in kgate's log\n" + "\n".join(lines)
        # the browser sent an Origin equal to the Host on the POST: no Origin refusal was needed
        assert not any("Origin" in ln and "refused" in ln for ln in lines), "\n".join(lines)
        with kg.connect(kid) as ws:
            assert ws.run("print('unharmed')") == "unharmed\n"
    finally:
        kg.cleanup_kernels()
        kg.stop()
