"""CORS for the browser origins listed in allow_origins, against a real kgate with a token.

- A preflight (OPTIONS with Origin and Access-Control-Request-Method) from a listed origin is
  answered 204 without the token, with Access-Control-Allow-Origin (the origin itself, with
  credentials), the allowed methods and headers, Max-Age and Vary: Origin.
- Actual responses to a listed origin (successes and errors alike) carry
  Access-Control-Allow-Origin and Vary: Origin; Location is exposed.
- An unlisted origin never gets a CORS header: its preflight is 403, its requests 403.
- "*" in allow_origins answers Access-Control-Allow-Origin: * and never allows credentials.
- Headless Chromium on a listed origin really fetches the kernel list and starts a kernel
  cross-origin (a preflighted request with an Authorization header); a page on an unlisted
  origin cannot read anything."""

import json
import os

import pytest

from cdp import CHROMIUM, Chromium
from conftest import Kgate
from test_browser_attacks import PageServer

TOKEN = "cors-test-token"
APP = "http://app.example:3000"


def write_config(path, origins):
    path.write_text("[server]\nallow_origins = %s\n" % json.dumps(origins))
    return path


@pytest.fixture(scope="module")
def kg(kgate_bin, tmp_path_factory):
    root = tmp_path_factory.mktemp("kgate-cors")
    cfg = write_config(root / "kgate.toml", [APP])
    daemon = Kgate(kgate_bin, root, token=TOKEN, config=cfg).start()
    try:
        yield daemon
    finally:
        daemon.cleanup_kernels()
        daemon.stop()


def preflight(kg, origin, method="POST", headers="authorization, content-type", path="/api/kernels"):
    hdrs = {"Origin": origin, "Access-Control-Request-Method": method}
    if headers:
        hdrs["Access-Control-Request-Headers"] = headers
    return kg.http("OPTIONS", path, headers=hdrs, auth=False)


def test_preflight_from_a_listed_origin_is_answered_without_the_token(kg):
    status, hdrs, body = preflight(kg, APP)
    assert status == 204, (status, body[:300])
    assert hdrs.get("Access-Control-Allow-Origin") == APP, dict(hdrs)
    assert hdrs.get("Access-Control-Allow-Credentials") == "true", dict(hdrs)
    methods = {m.strip() for m in hdrs.get("Access-Control-Allow-Methods", "").split(",")}
    assert {"GET", "POST", "PATCH", "DELETE"} <= methods, dict(hdrs)
    allowed = hdrs.get("Access-Control-Allow-Headers", "").lower()
    assert "authorization" in allowed and "content-type" in allowed, dict(hdrs)
    assert int(hdrs.get("Access-Control-Max-Age", "0")) > 0, dict(hdrs)
    assert "origin" in hdrs.get("Vary", "").lower(), dict(hdrs)
    assert body == b""
    # on every path, kgate's own API included
    for path in ("/api/kernelspecs", "/api/kgate/kernels", "/api/kernels/x/interrupt"):
        status, hdrs, body = preflight(kg, APP, path=path)
        assert status == 204 and hdrs.get("Access-Control-Allow-Origin") == APP, (path, status, body[:200])


def test_preflight_without_requested_headers_allows_the_jupyter_ones(kg):
    status, hdrs, _ = preflight(kg, APP, method="DELETE", headers=None)
    assert status == 204, status
    allowed = hdrs.get("Access-Control-Allow-Headers", "").lower()
    for h in ("authorization", "content-type", "x-xsrftoken"):
        assert h in allowed, dict(hdrs)


def test_actual_responses_to_a_listed_origin_carry_cors_headers(kg):
    auth = {"Origin": APP, "Authorization": f"token {TOKEN}"}
    status, hdrs, body = kg.rest("GET", "/api/kernels", headers=auth)
    assert status == 200, (status, body)
    assert hdrs.get("Access-Control-Allow-Origin") == APP, dict(hdrs)
    assert hdrs.get("Access-Control-Allow-Credentials") == "true", dict(hdrs)
    assert "origin" in hdrs.get("Vary", "").lower(), dict(hdrs)

    # a start: 201 with Location, which the page may read
    status, hdrs, model = kg.rest("POST", "/api/kernels", {"name": "python3"}, headers=auth)
    assert status == 201, (status, model)
    kg._kernels.add(model["id"])
    assert hdrs.get("Access-Control-Allow-Origin") == APP, dict(hdrs)
    assert "location" in hdrs.get("Access-Control-Expose-Headers", "").lower(), dict(hdrs)
    kg.delete_kernel(model["id"])

    # errors too, so that the page can tell what went wrong
    status, hdrs, body = kg.rest("GET", "/api/kernels", headers={"Origin": APP}, auth=False)
    assert status == 401, (status, body)
    assert hdrs.get("Access-Control-Allow-Origin") == APP, dict(hdrs)
    status, hdrs, body = kg.rest("GET", "/api/kernels/no-such-kernel", headers=auth)
    assert status == 404, (status, body)
    assert hdrs.get("Access-Control-Allow-Origin") == APP, dict(hdrs)


def test_an_unlisted_origin_gets_no_cors_headers(kg):
    for origin in ("http://evil.example", "http://app.example:3001", "https://app.example:3000", "null",
                   f"http://127.0.0.1:{kg.port}"):
        status, hdrs, body = preflight(kg, origin)
        assert status == 403, (origin, status, body[:200])
        assert "Access-Control-Allow-Origin" not in hdrs, (origin, dict(hdrs))
        assert "Access-Control-Allow-Credentials" not in hdrs, (origin, dict(hdrs))
    status, hdrs, body = kg.http("GET", "/api/kernels", headers={"Origin": "http://evil.example"})
    assert status == 403, (status, body[:200])
    assert "Access-Control-Allow-Origin" not in hdrs, dict(hdrs)
    # a same-origin request (Origin equals Host) is served, and needs no CORS header
    status, hdrs, body = kg.http("GET", "/api/kernels", headers={"Origin": f"http://127.0.0.1:{kg.port}"})
    assert status == 200, (status, body[:200])
    assert "Access-Control-Allow-Origin" not in hdrs, dict(hdrs)
    # a plain OPTIONS (no Access-Control-Request-Method) is no preflight: it needs the token
    status, _, _ = kg.http("OPTIONS", "/api/kernels", headers={"Origin": APP}, auth=False)
    assert status == 401, status


def test_star_allows_any_origin_without_credentials(kgate_factory, tmp_path):
    kg = kgate_factory(token=TOKEN, config=write_config(tmp_path / "kgate.toml", ["*"]))
    status, hdrs, _ = preflight(kg, "http://anything.example")
    assert status == 204, status
    assert hdrs.get("Access-Control-Allow-Origin") == "*", dict(hdrs)
    assert "Access-Control-Allow-Credentials" not in hdrs, dict(hdrs)
    status, hdrs, _ = kg.http("GET", "/api", headers={"Origin": "http://anything.example"})
    assert status == 200 and hdrs.get("Access-Control-Allow-Origin") == "*", (status, dict(hdrs))
    assert "Access-Control-Allow-Credentials" not in hdrs, dict(hdrs)


# ------------------------------------------------------------------------ a real browser

FETCHES = """(async () => {
  const auth = {"Authorization": "token %(token)s"};
  const list = await tryFetch("%(base)s/api/kernels", {headers: auth});
  const start = await tryFetch("%(base)s/api/kernels", {method: "POST",
      headers: Object.assign({"Content-Type": "application/json"}, auth), body: JSON.stringify({name: "python3"})});
  return {list, start};
})()"""


def test_chromium_on_a_listed_origin_uses_the_api(kgate_bin, tmp_path_factory):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium for the browser CORS test")
    listed, unlisted = PageServer(), PageServer()
    root = tmp_path_factory.mktemp("kgate-cors-browser")
    cfg = write_config(root / "kgate.toml", [f"http://127.0.0.1:{listed.port}"])
    kg = Kgate(kgate_bin, root, token=TOKEN, config=cfg).start()
    browser = Chromium.launch(tmp_path_factory.mktemp("chromium-cors") / "profile", timeout=60)
    try:
        base = f"http://127.0.0.1:{kg.port}"
        page = browser.page()
        page.navigate(f"http://127.0.0.1:{listed.port}/app.html")
        res = page.evaluate(FETCHES % {"token": TOKEN, "base": base}, timeout=90)
        assert res["list"]["fetched"] and res["list"]["type"] == "cors", res["list"]
        assert res["list"]["status"] == 200 and json.loads(res["list"]["body"]) == [], res["list"]
        start = res["start"]
        assert start["fetched"] and start["status"] == 201, start
        model = json.loads(start["body"])
        kg._kernels.add(model["id"])
        assert model["name"] == "python3", model

        page = browser.page()
        page.navigate(f"http://127.0.0.1:{unlisted.port}/app.html")
        res = page.evaluate(FETCHES % {"token": TOKEN, "base": base}, timeout=90)
        assert not res["list"]["fetched"], f"an unlisted origin read the kernel list: {res['list']}"
        assert not res["start"]["fetched"], f"an unlisted origin started a kernel: {res['start']}"
        status, _, kernels = kg.rest("GET", "/api/kernels")
        assert [k["id"] for k in kernels] == [model["id"]], kernels
    finally:
        browser.close()
        listed.stop()
        unlisted.stop()
        kg.cleanup_kernels()
        kg.stop()
