"""Token auth, non-loopback refusal, Origin and Host (DNS rebinding) checks."""

import json
import os
import subprocess
import time
import uuid

import pytest
import websocket

from conftest import LISTEN_RE, KernelWS, _module_daemon, make_jupyter_env, runtime_files

TOKEN = "tok-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def kgate_tok(kgate_bin, tmp_path_factory):
    yield from _module_daemon(kgate_bin, tmp_path_factory, token=TOKEN)


@pytest.fixture(scope="module")
def tok_kernel(kgate_tok):
    model = kgate_tok.start_kernel()
    yield model["id"]
    kgate_tok.delete_kernel(model["id"], check=False)


# ---------------------------------------------------------------- token

@pytest.mark.parametrize("path", ["/api/kernels", "/api/kernelspecs", "/api/kernelspecs/python3",
                                  "/api/status", "/kernelspecs/python3/logo-64x64.png"])
def test_no_token_is_401(kgate_tok, path):
    status, _, data = kgate_tok.http("GET", path, auth=False)
    assert status == 401, f"GET {path} without token -> {status} {data[:200]!r}"


def test_post_kernel_without_token_is_401_and_starts_nothing(kgate_tok):
    before = runtime_files(kgate_tok)
    status, _, body = kgate_tok.rest("POST", "/api/kernels", {"name": "python3"}, auth=False)
    if status == 201 and isinstance(body, dict) and "id" in body:
        kgate_tok._kernels.add(body["id"])
    assert status == 401, (status, body)
    time.sleep(0.3)
    assert runtime_files(kgate_tok) == before


def test_wrong_token_is_401(kgate_tok):
    status, _, body = kgate_tok.rest("GET", "/api/kernels", headers={"Authorization": "token wrong"})
    assert status == 401, (status, body)
    status, _, body = kgate_tok.rest("GET", "/api/kernels?token=wrong", auth=False)
    assert status == 401, (status, body)
    status, _, body = kgate_tok.rest("GET", "/api/kernels", headers={"Authorization": "token"})
    assert status == 401, f"empty token accepted by a token-protected daemon: {status} {body!r}"


def test_token_header_ok(kgate_tok):
    status, _, body = kgate_tok.rest("GET", "/api/kernels",
                                     headers={"Authorization": f"token {TOKEN}"})
    assert status == 200, (status, body)
    assert isinstance(body, list)


def test_token_query_ok(kgate_tok):
    status, _, body = kgate_tok.rest("GET", f"/api/kernels?token={TOKEN}", auth=False)
    assert status == 200, (status, body)
    status, _, data = kgate_tok.http("GET", f"/kernelspecs/python3/logo-64x64.png?token={TOKEN}",
                                     auth=False)
    assert status == 200, status


def test_ws_without_token_rejected(kgate_tok, tok_kernel):
    with pytest.raises(websocket.WebSocketBadStatusException) as info:
        KernelWS(kgate_tok.ws_url(tok_kernel)).close()
    assert info.value.status_code == 401, str(info.value)


def test_ws_wrong_token_rejected(kgate_tok, tok_kernel):
    with pytest.raises(websocket.WebSocketBadStatusException) as info:
        KernelWS(kgate_tok.ws_url(tok_kernel, token="wrong")).close()
    assert info.value.status_code == 401, str(info.value)


def test_ws_token_query_ok(kgate_tok, tok_kernel):
    with kgate_tok.connect(tok_kernel) as ws:
        assert ws.run("print(1 + 1)") == "2\n"


def test_ws_token_header_ok(kgate_tok, tok_kernel):
    """jupyter_server's gateway relay authenticates its websocket with the header only."""
    with KernelWS(kgate_tok.ws_url(tok_kernel),
                  headers={"Authorization": f"token {TOKEN}"}) as ws:
        assert ws.run("print(2 + 2)") == "4\n"


# ------------------------------------------- token spellings and order (as jupyter_server)

@pytest.mark.parametrize("header", ["token {}", "Token {}", "TOKEN {}", "bearer {}", "Bearer {}",
                                    "BeArEr {}", "token  {}", "token\t{}", "bearer   {}"])
def test_auth_scheme_is_case_insensitive_and_any_whitespace_follows(kgate_tok, header):
    """jupyter_server matches (token|bearer)\\s+(.+) ignoring case (RFC 7235: schemes are)."""
    status, _, body = kgate_tok.rest("GET", "/api/kernelspecs",
                                     headers={"Authorization": header.format(TOKEN)})
    assert status == 200, (header, status, body)


@pytest.mark.parametrize("header", ["token wrong", "Bearer wrong", "TOKEN  wrong", "basic {}",
                                    "tokens {}", "token{}", "{}"])
def test_other_authorization_values_are_401(kgate_tok, header):
    header = header.format(TOKEN)
    status, _, body = kgate_tok.rest("GET", "/api/kernelspecs", headers={"Authorization": header})
    assert status == 401, (header, status, body)
    assert TOKEN not in json.dumps(body), "a refusal names no token"


def test_query_token_is_read_before_the_header(kgate_tok):
    """jupyter_server and Kernel Gateway take ?token= first, the header only when there is none."""
    status, _, body = kgate_tok.rest("GET", f"/api/kernelspecs?token={TOKEN}", auth=False,
                                     headers={"Authorization": "token wrong"})
    assert status == 200, (status, body)
    status, _, body = kgate_tok.rest("GET", "/api/kernelspecs?token=wrong", auth=False,
                                     headers={"Authorization": f"token {TOKEN}"})
    assert status == 401, (status, body)
    # An empty ?token= is no token: the header is read.
    status, _, body = kgate_tok.rest("GET", "/api/kernelspecs?token=", auth=False,
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200, (status, body)


def test_ws_query_token_is_read_before_the_header(kgate_tok, tok_kernel):
    with KernelWS(kgate_tok.ws_url(tok_kernel), headers={"Authorization": f"Token {TOKEN}"}) as ws:
        assert ws.run("print(3 + 3)") == "6\n"
    with pytest.raises(websocket.WebSocketBadStatusException) as info:
        KernelWS(kgate_tok.ws_url(tok_kernel, token="wrong"),
                 headers={"Authorization": f"token {TOKEN}"}).close()
    assert info.value.status_code == 401, str(info.value)


def test_observe_and_agent_socket_read_the_token_the_same_way(kgate_tok):
    status, _, _ = kgate_tok.http("GET", "/observe", auth=False, headers={"Authorization": f"BEARER {TOKEN}"})
    assert status == 200, status
    status, _, _ = kgate_tok.http("GET", "/observe?token=wrong", auth=False,
                                  headers={"Authorization": f"token {TOKEN}"})
    assert status == 401, status
    url = kgate_tok.url.replace("http://", "ws://") + "/api/kgate/agent?agent=" + uuid.uuid4().hex
    ws = websocket.create_connection(url, header=[f"Authorization: bearer  {TOKEN}"], timeout=10)
    ws.close()
    with pytest.raises(websocket.WebSocketBadStatusException) as info:
        websocket.create_connection(url + "&token=wrong", header=[f"Authorization: token {TOKEN}"],
                                    timeout=10).close()
    assert info.value.status_code == 401, str(info.value)


# ---------------------------------------------------------------- bind policy

def test_non_loopback_on_its_own_token_starts(kgate_factory):
    kg = kgate_factory(ip="0.0.0.0")
    assert kg.own_token_file is not None, kg.log_tail()
    assert kg.rest("GET", "/api/kernelspecs")[0] == 200
    assert kg.rest("GET", "/api/kernelspecs", auth=False)[0] == 401


def test_non_loopback_without_token_refuses_to_start(kgate_bin, tmp_path):
    env = make_jupyter_env(tmp_path)
    proc = subprocess.Popen([kgate_bin, "serve", "--ip", "0.0.0.0", "--port", "0", "--no-token"], env=env,
                            cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"kgate --ip 0.0.0.0 without --token kept running; stderr: {err[-2000:]!r}")
    assert proc.returncode != 0, f"exit code 0; stderr: {err!r}"
    assert err.strip(), "refused to start without saying why on stderr"
    assert not LISTEN_RE.search(err.decode(errors="replace")), err


def test_non_loopback_with_token_starts(kgate_factory):
    kg = kgate_factory(ip="0.0.0.0", token=TOKEN)
    status, _, body = kg.rest("GET", "/api/kernelspecs")
    assert status == 200, (status, body)
    status, _, body = kg.rest("GET", "/api/kernelspecs", auth=False)
    assert status == 401, (status, body)
    # Without TLS it says what that means (test_server_tls.py: with TLS it does not).
    assert any("travel in clear text" in ln and "warn" in ln for ln in kg.log_lines), kg.log_tail()


# ---------------------------------------------------------------- Origin / Host

@pytest.mark.parametrize("origin", ["http://evil.example", "http://127.0.0.1:1", "null",
                                    "http://127.0.0.1.evil.example:{port}"])
def test_foreign_origin_is_403(kgate, origin):
    origin = origin.format(port=kgate.port)
    status, _, body = kgate.rest("GET", "/api/kernels", headers={"Origin": origin})
    assert status == 403, f"Origin: {origin} -> {status} {body!r}"


def test_foreign_origin_post_is_403_and_starts_nothing(kgate):
    before = runtime_files(kgate)
    status, _, body = kgate.rest("POST", "/api/kernels", {"name": "python3"},
                                 headers={"Origin": "http://evil.example"})
    if status == 201 and isinstance(body, dict) and "id" in body:
        kgate._kernels.add(body["id"])
    assert status == 403, (status, body)
    time.sleep(0.3)
    assert runtime_files(kgate) == before


def test_foreign_origin_with_valid_token_is_still_403(kgate_tok):
    status, _, body = kgate_tok.rest("GET", "/api/kernels", headers={"Origin": "http://evil.example"})
    assert status == 403, (status, body)


def test_own_origin_ok(kgate):
    status, _, body = kgate.rest("GET", "/api/kernels",
                                 headers={"Origin": f"http://127.0.0.1:{kgate.port}"})
    assert status == 200, (status, body)


def test_no_origin_ok(kgate):
    status, _, body = kgate.rest("GET", "/api/kernels")
    assert status == 200, (status, body)


FOREIGN_HOSTS = ["evil.example:{port}", "evil.example", "127.0.0.1.evil.example:{port}",
                 "127.attacker.example:{port}", "127.0.0.1.nip.io:{port}"]


@pytest.mark.parametrize("host", FOREIGN_HOSTS)
def test_foreign_host_is_403(kgate, host):
    """DNS rebinding: a name the attacker controls may resolve to 127.0.0.1; only real
    loopback names/addresses are acceptable Host values (a name merely starting with
    "127." is not an IPv4 address)."""
    host = host.format(port=kgate.port)
    status, _, body = kgate.rest("GET", "/api/kernels", headers={"Host": host})
    assert status == 403, f"Host: {host} -> {status} {body!r}"


def test_dns_rebinding_page_is_refused(kgate):
    """What a rebinding page sends: its own name in both Host and Origin."""
    site = f"127.0.0.1.evil.example:{kgate.port}"
    before = runtime_files(kgate)
    status, _, body = kgate.rest("POST", "/api/kernels", {"name": "python3"},
                                 headers={"Host": site, "Origin": f"http://{site}"})
    if status == 201 and isinstance(body, dict) and "id" in body:
        kgate._kernels.add(body["id"])
    assert status == 403, f"rebinding page started a kernel: {status} {body!r}"
    assert runtime_files(kgate) == before


def test_localhost_host_ok(kgate):
    """Host: localhost is a loopback name, not a rebinding attack."""
    status, _, body = kgate.rest("GET", "/api/kernels", headers={"Host": f"localhost:{kgate.port}"})
    assert status == 200, (status, body)


def test_ws_foreign_origin_is_403(kgate, shared_kernel):
    with pytest.raises(websocket.WebSocketBadStatusException) as info:
        KernelWS(kgate.ws_url(shared_kernel), origin="http://evil.example").close()
    assert info.value.status_code == 403, str(info.value)


@pytest.mark.parametrize("host", FOREIGN_HOSTS[:3])
def test_ws_foreign_host_is_403(kgate, shared_kernel, host):
    host = host.format(port=kgate.port)
    with pytest.raises(websocket.WebSocketBadStatusException) as info:
        KernelWS(kgate.ws_url(shared_kernel), host=host, origin=f"http://{host}").close()
    assert info.value.status_code == 403, str(info.value)


def test_ws_own_origin_and_no_origin_ok(kgate, shared_kernel):
    url = kgate.ws_url(shared_kernel, token=kgate.token)
    with KernelWS(url, origin=f"http://127.0.0.1:{kgate.port}") as ws:
        assert ws.run("print('own-origin')") == "own-origin\n"
    with KernelWS(url, suppress_origin=True) as ws:
        assert ws.run("print('no-origin')") == "no-origin\n"
