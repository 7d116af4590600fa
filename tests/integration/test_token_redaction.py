"""A token given in the URL (`?token=`) never reaches kgate's log, on any path that logs a
request: refusals (wrong token, Host, Origin), unknown endpoints and websockets, a bad target,
and the internal-error path, at the most verbose log level."""

import socket
import uuid

from conftest import wait_until


def raw_request(port, text):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(text.encode("latin-1"))
        s.settimeout(10)
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            pass
    return data


def test_a_url_token_is_never_logged(kgate_factory, tmp_path):
    token = "tok-" + uuid.uuid4().hex
    kg = kgate_factory(token=token, extra_args=["--log-level", "trace"])
    wrong = "wrong-" + uuid.uuid4().hex
    secrets = [token, wrong]
    paths = [
        f"/api/kernels?token={token}",
        f"/api/kernels?token={wrong}",                        # 403/401: wrong token
        f"/api/no-such-thing?token={token}",                  # 404
        f"/api/kernels/{uuid.uuid4()}?token={token}",         # unknown kernel
        f"/api/kgate/jobs/job-999999?token={token}&wait=1",   # unknown job
        f"/api/kernels/%zz?token={token}",                    # a bad %-escape
        f"/api/kernelspecs?token={token}",
    ]
    for p in paths:
        kg.http("GET", p, auth=False)
    kg.http("GET", f"/api/kernels?token={token}", headers={"Host": "evil.example"}, auth=False)
    kg.http("GET", f"/api/kernels?token={token}", headers={"Origin": "http://evil.example"}, auth=False)
    kg.http("POST", f"/api/kernels?token={token}", body="{not json", auth=False)
    # Websocket upgrades: an unknown endpoint and an unknown kernel, token in the URL.
    for target in (f"/api/nowhere?token={token}", f"/api/kernels/{uuid.uuid4()}/channels?token={token}",
                   f"/api/kgate/agent?token={token}"):
        raw_request(kg.port, f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                             "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
    # A request line past the header limit: the error path of the parser.
    raw_request(kg.port, f"GET /api?token={token}&pad={'x' * 70000} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert kg.stop() == 0
    wait_until(lambda: any("shutting down" in line for line in kg.log_lines), 5)
    log = "\n".join(kg.log_lines)
    for s in secrets:
        assert s not in log, f"a token reached the log:\n{[l for l in kg.log_lines if s in l][:5]}"
    files = "".join(p.read_text(errors="replace") for p in kg.root.glob("kgate-*.log"))
    for s in secrets:
        assert s not in files
