"""REST API shapes (jupyter_server compatible): /api, /api/status, kernelspecs, kernels."""

import http.client
import json
import os
import re
import socket
import stat
import uuid

import pytest

from conftest import (DISPLAY_NAME, KERNEL_ARGV, NotJSON, assert_kernel_model,
                      parse_model_time, runtime_files, wait_until)

ISO_Z_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z$")


def assert_json_error(body, context):
    assert isinstance(body, dict), f"{context}: error body is not a JSON object: {body!r}"
    assert "message" in body and "reason" in body, f"{context}: error body lacks message/reason: {body!r}"
    assert isinstance(body["message"], str), f"{context}: {body!r}"


# ---------------------------------------------------------------- /api, /api/status

def test_api_version(kgate):
    status, hdrs, body = kgate.rest("GET", "/api")
    assert status == 200, (status, body)
    assert "json" in (hdrs.get("Content-Type") or ""), hdrs.get("Content-Type")
    assert isinstance(body, dict) and isinstance(body.get("version"), str) and body["version"], body


def test_api_status_shape(kgate):
    status, _, body = kgate.rest("GET", "/api/status")
    assert status == 200, (status, body)
    assert isinstance(body, dict), body
    for key in ("started", "last_activity", "kernels", "connections"):
        assert key in body, f"/api/status lacks {key!r}: {body!r}"
    for key in ("started", "last_activity"):
        assert isinstance(body[key], str) and ISO_Z_RE.match(body[key]), f"{key}: {body[key]!r}"
    for key in ("kernels", "connections"):
        assert isinstance(body[key], int) and not isinstance(body[key], bool), f"{key}: {body[key]!r}"


def test_api_status_counts_kernels(kgate):
    def counts():
        _, _, st = kgate.rest("GET", "/api/status")
        _, _, lst = kgate.rest("GET", "/api/kernels")
        return st["kernels"], len(lst)

    before_status, before_list = counts()
    assert before_status == before_list
    model = kgate.start_kernel()
    try:
        after_status, after_list = counts()
        assert after_list == before_list + 1
        assert after_status == after_list, f"/api/status kernels={after_status}, list has {after_list}"
    finally:
        kgate.delete_kernel(model["id"])
    assert counts() == (before_status, before_list)


def test_unknown_api_path_is_404(kgate):
    status, _, body = kgate.rest("GET", "/api/no-such-endpoint")
    assert status == 404, (status, body)


@pytest.mark.parametrize("target", [
    "/api/kerne%FFlspecs/python3",            # found by fuzz_http: it used to stop the daemon
    "/api/kernels/%C0%AF",                    # an overlong '/'
    "/api/kgate/jobs?kernel=%FF%FE&wait=0",   # a query value
    "/api/kgate/jobs?%ED%A0%80=1",            # a query key: a UTF-16 surrogate
    "/api/kernels/%",                         # a bad escape
])
def test_target_that_is_not_utf8_is_400_and_kgate_goes_on(kgate, target):
    status, _, body = kgate.rest("GET", target)
    assert status == 400, (target, status, body)
    assert "UTF-8" in body["message"], body
    status, _, body = kgate.rest("GET", "/api")
    assert status == 200, "kgate stopped serving after a bad target"


def test_websocket_upgrade_with_a_target_that_is_not_utf8_is_400(kgate, shared_kernel):
    status, _, body = kgate.rest("GET", f"/api/kernels/{shared_kernel}/channels?session_id=%C0%80",
                                 headers={"Upgrade": "websocket", "Connection": "Upgrade",
                                          "Sec-WebSocket-Version": "13",
                                          "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
    assert status == 400 and "UTF-8" in body["message"], (status, body)
    assert kgate.rest("GET", "/api")[0] == 200


def test_empty_authorization_token_is_ignored_without_auth(kgate_factory):
    """jupyter_server's GatewayClient always sends `Authorization: token <tok>`, even with an
    empty token. With --no-token that must not be rejected."""
    kg = kgate_factory(extra_args=["--no-token"])
    for value in ("token", "token "):
        status, _, body = kg.rest("GET", "/api/kernelspecs", headers={"Authorization": value})
        assert status == 200, f"Authorization: {value!r} -> {status} {body!r}"


# ---------------------------------------------------------------- kernelspecs

def check_python3_spec(model):
    assert isinstance(model, dict), model
    assert set(("name", "spec", "resources")) <= set(model), model
    assert model["name"] == "python3", model
    spec = model["spec"]
    for key in ("argv", "env", "display_name", "language", "interrupt_mode", "metadata"):
        assert key in spec, f"kernelspec spec lacks {key!r}: {spec!r}"
    assert spec["argv"] == KERNEL_ARGV, spec["argv"]
    assert spec["env"] == {}, spec["env"]
    assert spec["display_name"] == DISPLAY_NAME, spec["display_name"]
    assert spec["language"] == "python", spec["language"]
    assert spec["interrupt_mode"] == "signal", spec["interrupt_mode"]
    assert spec["metadata"] == {}, spec["metadata"]
    assert isinstance(model["resources"], dict), model["resources"]
    assert model["resources"].get("logo-64x64") == "/kernelspecs/python3/logo-64x64.png", model["resources"]


def test_kernelspecs_list(kgate):
    status, hdrs, body = kgate.rest("GET", "/api/kernelspecs")
    assert status == 200, (status, body)
    assert "json" in (hdrs.get("Content-Type") or "")
    assert isinstance(body, dict) and set(body) >= {"default", "kernelspecs"}, body
    assert body["default"] == "python3", body["default"]
    assert "python3" in body["kernelspecs"], list(body["kernelspecs"])
    check_python3_spec(body["kernelspecs"]["python3"])
    for name, model in body["kernelspecs"].items():
        assert isinstance(model, dict) and model.get("name") == name and "spec" in model \
            and "resources" in model, f"kernelspec {name!r} is not a full model: {model!r}"


def test_kernelspec_single(kgate):
    status, _, body = kgate.rest("GET", "/api/kernelspecs/python3")
    assert status == 200, (status, body)
    check_python3_spec(body)
    _, _, listing = kgate.rest("GET", "/api/kernelspecs")
    assert body == listing["kernelspecs"]["python3"]


def test_kernelspec_unknown_is_404(kgate):
    status, _, body = kgate.rest("GET", "/api/kernelspecs/no-such-spec")
    assert status == 404, (status, body)


def test_kernelspec_resource_get_and_head(kgate, logo_png):
    status, hdrs, data = kgate.http("GET", "/kernelspecs/python3/logo-64x64.png")
    assert status == 200, (status, data[:200])
    assert data == logo_png, f"served {len(data)} bytes, expected the {len(logo_png)}-byte logo"
    status, hdrs, data = kgate.http("HEAD", "/kernelspecs/python3/logo-64x64.png")
    assert status == 200, status
    assert data == b""
    if hdrs.get("Content-Length") is not None:
        assert int(hdrs["Content-Length"]) == len(logo_png), hdrs.get("Content-Length")


def test_kernelspec_resource_missing_is_404(kgate):
    status, _, data = kgate.http("GET", "/kernelspecs/python3/no-such-file.png")
    assert status == 404, (status, data[:200])
    status, _, data = kgate.http("GET", "/kernelspecs/no-such-spec/logo-64x64.png")
    assert status == 404, (status, data[:200])


TRAVERSALS = [
    "/kernelspecs/python3/..%2f..%2fetc%2fpasswd",
    "/kernelspecs/python3/..%2f..%2f..%2f..%2f..%2f..%2f..%2f..%2fetc%2fpasswd",
    "/kernelspecs/python3/../../x",
    "/kernelspecs/python3/../../../../../../../../etc/passwd",
    "/kernelspecs/python3/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "/kernelspecs/python3/%2fetc%2fpasswd",
    "/kernelspecs/python3//etc/passwd",
    "/kernelspecs/python3/..%5c..%5csecret.txt",
    "/kernelspecs/python3/..%2fsecret.txt",
    "/kernelspecs/python3/../secret.txt",
    "/kernelspecs/python3/..%2f..%2fsecret.txt",
    "/kernelspecs/python3/..%2f..%2f..%2fsecret.txt",
    "/kernelspecs/python3/%252e%252e%252fsecret.txt",
    "/kernelspecs/..%2fsecret.txt",
    "/kernelspecs/..%2f..%2fsecret.txt/x",
    "/kernelspecs/../secret.txt",
    "/kernelspecs/python3/..%00/secret.txt",
]


@pytest.mark.parametrize("path", TRAVERSALS)
def test_kernelspec_resource_path_traversal(kgate, path):
    status, _, data = kgate.http("GET", path)
    assert status in (400, 404), f"GET {path} -> {status} {data[:200]!r}"
    assert b"KGATE-TRAVERSAL-SECRET" not in data and b"root:" not in data, (path, data[:200])


# ---------------------------------------------------------------- kernels

def test_kernel_create_list_get_delete(kgate):
    status, hdrs, model = kgate.rest("POST", "/api/kernels", {"name": "python3"})
    assert status == 201, (status, model)
    assert_kernel_model(model)
    kid = model["id"]
    kgate._kernels.add(kid)
    assert hdrs.get("Location") == f"/api/kernels/{kid}", hdrs.get("Location")
    assert model["execution_state"] == "idle", f"POST must return once the kernel is ready: {model!r}"
    assert model["connections"] == 0, model

    cf = kgate.connection_file(kid)
    assert cf.is_file(), f"missing connection file {cf}; runtime dir has {os.listdir(kgate.runtime_dir)}"
    mode = stat.S_IMODE(cf.stat().st_mode)
    assert mode == 0o600, f"connection file mode is {oct(mode)}"
    info = json.loads(cf.read_text())
    for key in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port", "ip", "key",
                "transport", "signature_scheme"):
        assert key in info, f"connection file lacks {key}: {info}"

    status, _, listing = kgate.rest("GET", "/api/kernels")
    assert status == 200, (status, listing)
    assert isinstance(listing, list), listing
    for m in listing:
        assert_kernel_model(m, name=None)
    mine = [m for m in listing if m["id"] == kid]
    assert len(mine) == 1, listing
    assert mine[0]["name"] == "python3"

    status, _, got = kgate.rest("GET", f"/api/kernels/{kid}")
    assert status == 200, (status, got)
    assert_kernel_model(got, kid)
    assert got["execution_state"] == "idle", got
    assert parse_model_time(got["last_activity"]) >= parse_model_time(model["last_activity"])

    status, _, body = kgate.rest("DELETE", f"/api/kernels/{kid}")
    assert status == 204, (status, body)
    assert body is None, f"204 must have no body: {body!r}"
    kgate._kernels.discard(kid)
    status, _, body = kgate.rest("GET", f"/api/kernels/{kid}")
    assert status == 404, (status, body)
    assert wait_until(lambda: not cf.exists(), 5), f"{cf} still exists after DELETE"
    _, _, listing = kgate.rest("GET", "/api/kernels")
    assert kid not in [m["id"] for m in listing]


@pytest.mark.parametrize("body", [None, {}, ""], ids=["no-body", "empty-object", "empty-string"])
def test_kernel_create_default_spec(kgate, body):
    status, hdrs, model = kgate.rest("POST", "/api/kernels", body)
    assert status == 201, f"POST /api/kernels with body {body!r} -> {status} {model!r}"
    kgate._kernels.add(model["id"])
    assert_kernel_model(model, name="python3")
    assert hdrs.get("Location") == f"/api/kernels/{model['id']}"
    kgate.delete_kernel(model["id"])


def test_kernel_create_unknown_spec(kgate):
    before = runtime_files(kgate)
    status, _, body = kgate.rest("POST", "/api/kernels", {"name": "no-such-kernel"})
    if status == 201 and isinstance(body, dict) and "id" in body:
        kgate._kernels.add(body["id"])
    assert status in (400, 404), (status, body)
    assert_json_error(body, "POST unknown kernelspec")
    assert runtime_files(kgate) == before


def test_kernel_create_invalid_json(kgate):
    status, _, body = kgate.rest("POST", "/api/kernels", b"{not json",
                                 headers={"Content-Type": "application/json"})
    if status == 201 and isinstance(body, dict) and "id" in body:
        kgate._kernels.add(body["id"])
    assert status == 400, (status, body)
    assert_json_error(body, "POST invalid JSON")


@pytest.mark.parametrize("method,suffix", [
    ("GET", ""), ("DELETE", ""), ("POST", "/interrupt"), ("POST", "/restart")])
def test_unknown_kernel_is_404(kgate, method, suffix):
    kid = str(uuid.uuid4())
    status, _, body = kgate.rest(method, f"/api/kernels/{kid}{suffix}")
    assert status == 404, f"{method} /api/kernels/{kid}{suffix} -> {status} {body!r}"
    assert_json_error(body, f"{method} unknown kernel")
    if method == "GET":
        assert body["message"] == f"Kernel does not exist: {kid}", body


def test_kernel_env_and_working_dir(kgate, ws_clients):
    wd = kgate.root / "work dir"
    wd.mkdir(exist_ok=True)
    marker = "marker-" + uuid.uuid4().hex
    model = kgate.start_kernel({"name": "python3",
                                "env": {"KERNEL_KGATE_MARKER": marker,
                                        "KERNEL_WORKING_DIR": str(wd)}})
    try:
        ws = kgate.connect(model["id"])
        ws_clients.append(ws)
        out = ws.run("import os\nprint(os.environ.get('KERNEL_KGATE_MARKER'))\nprint(os.getcwd())")
        lines = out.splitlines()
        assert lines[0] == marker, f"env var not passed to the kernel: {out!r}"
        assert os.path.realpath(lines[1]) == os.path.realpath(str(wd)), f"kernel cwd: {out!r}"
    finally:
        kgate.delete_kernel(model["id"])


def test_kernel_path_sets_working_dir(kgate, ws_clients):
    """"path" is an API path relative to the server's root dir (kgate's cwd here)."""
    (kgate.root / "sub" / "dir").mkdir(parents=True, exist_ok=True)
    model = kgate.start_kernel({"name": "python3", "path": "sub/dir"})
    try:
        ws = kgate.connect(model["id"])
        ws_clients.append(ws)
        out = ws.run("import os\nprint(os.getcwd())")
        assert os.path.realpath(out.strip()) == os.path.realpath(str(kgate.root / "sub" / "dir")), out
    finally:
        kgate.delete_kernel(model["id"])


def _read_http_response(sock):
    resp = http.client.HTTPResponse(sock)
    resp.begin()
    return resp.status, resp.headers, resp.read()


def test_body_too_large_is_413(kgate):
    before = runtime_files(kgate)
    size = 16 * 1024 * 1024 + 64 * 1024
    prefix = b'{"name": "python3", "pad": "'
    suffix = b'"}'
    body = prefix + b"x" * (size - len(prefix) - len(suffix)) + suffix
    head = (f"POST /api/kernels HTTP/1.1\r\nHost: 127.0.0.1:{kgate.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode()
    sock = socket.create_connection(("127.0.0.1", kgate.port), timeout=30)
    try:
        sock.sendall(head)
        view = memoryview(body)
        sent = 0
        try:
            while sent < len(body):
                sent += sock.send(view[sent:sent + 262144])
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and stop reading early
        try:
            status, hdrs, data = _read_http_response(sock)
        except (ConnectionResetError, http.client.RemoteDisconnected) as exc:
            pytest.fail(f"no HTTP response to an oversized body (sent {sent} of {len(body)} bytes): {exc!r}")
    finally:
        sock.close()
    assert status == 413, (status, data[:300])
    try:
        err = json.loads(data)
    except ValueError:
        err = NotJSON(data)
    assert_json_error(err, "413")
    assert runtime_files(kgate) == before, "an oversized POST started a kernel"
    # the daemon is still fine afterwards
    status, _, _ = kgate.rest("GET", "/api")
    assert status == 200
