"""What a Jupyter client asks of the kernels and kernelspecs API, against a real kgate:

- POST /api/kernels with a client-chosen "kernel_id" (jupyter_server 2.x): a fresh UUID becomes
  the kernel's id (model, Location, connection file, the process's argv, the websocket), also
  when a warm kernel is ready in the pool (the start is cold; the pool keeps its kernel); an id
  a kernel has, one a concurrent start is taking, or a malformed one is refused with 400.
- GET /kernelspecs/{name}/{file}: any regular file in the kernelspec's directory, subdirectories
  included, with a content type by extension; nothing outside it (symlinks, "..", encodings).
- default_kernel naming no kernelspec: a warning at start and on SIGHUP that names the setting
  and the kernelspecs there are."""

import json
import os
import signal
import threading
import uuid

import pytest

from conftest import Kgate, wait_until


# ------------------------------------------------------------------------ kernel_id

def pool_status(kg):
    status, _, body = kg.rest("GET", "/api/kgate/pool")
    assert status == 200, (status, body)
    return body["kernels"].get("python3", {"ready": 0})  # absent until the first catalog


def test_client_kernel_id_is_the_kernels_id(kgate):
    # a warm kernel is ready: the chosen id still wins (a cold start), and the pool keeps it
    assert wait_until(lambda: pool_status(kgate)["ready"] >= 1, 60), pool_status(kgate)
    before = pool_status(kgate)
    kid = str(uuid.uuid4())
    status, hdrs, model = kgate.rest("POST", "/api/kernels", {"name": "python3", "kernel_id": kid})
    assert status == 201, (status, model)
    kgate._kernels.add(model["id"])
    assert model["id"] == kid, model
    assert hdrs.get("Location") == f"/api/kernels/{kid}", hdrs.get("Location")
    after = pool_status(kgate)
    assert after["handed_out"] == before["handed_out"], (before, after)
    assert kgate.kernel_model(kid)["id"] == kid
    assert kgate.connection_file(kid).is_file(), sorted(os.listdir(kgate.runtime_dir))
    pid = kgate.kernel_pid(kid)
    assert any(f"kernel-{kid}.json" in a for a in open(f"/proc/{pid}/cmdline").read().split("\0"))
    with kgate.connect(kid) as ws:
        assert ws.run("print(6 * 7)") == "42\n"

    # the same id again: refused, and the kernel is untouched
    status, _, body = kgate.rest("POST", "/api/kernels", {"name": "python3", "kernel_id": kid})
    assert status == 400, (status, body)
    assert kid in body["message"] and "exists" in body["message"], body
    assert [k["id"] for k in kgate.rest("GET", "/api/kernels")[2]].count(kid) == 1
    kgate.delete_kernel(kid)


def test_uppercase_kernel_id_is_taken_in_lowercase(kgate):
    kid = str(uuid.uuid4())
    status, _, model = kgate.rest("POST", "/api/kernels", {"kernel_id": kid.upper()})
    assert status == 201, (status, model)
    kgate._kernels.add(model["id"])
    assert model["id"] == kid, model
    kgate.delete_kernel(kid)


@pytest.mark.parametrize("bad", ["abc", "", 42, ["x"], {"id": "x"}, True,
                                 "9078f9cc81b14a0395af2ea4ca17b4b3",
                                 "9078f9cc-81b1-4a03-95af-2ea4ca17b4b3/../x",
                                 "../9078f9cc-81b1-4a03-95af-2ea4ca17b4"])
def test_malformed_kernel_id_is_400(kgate, bad):
    ids_before = {k["id"] for k in kgate.rest("GET", "/api/kernels")[2]}
    status, _, body = kgate.rest("POST", "/api/kernels", {"name": "python3", "kernel_id": bad})
    assert status == 400, (bad, status, body)
    assert "kernel_id" in body["message"] and "UUID" in body["message"], body
    assert {k["id"] for k in kgate.rest("GET", "/api/kernels")[2]} == ids_before


def test_concurrent_starts_with_one_kernel_id(kgate):
    kid = str(uuid.uuid4())
    results = []

    def post():
        results.append(kgate.rest("POST", "/api/kernels", {"name": "python3", "kernel_id": kid}))

    threads = [threading.Thread(target=post) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    statuses = sorted(r[0] for r in results)
    kgate._kernels.add(kid)
    assert statuses == [201, 400, 400], [(r[0], r[2]) for r in results]
    assert [k["id"] for k in kgate.rest("GET", "/api/kernels")[2]].count(kid) == 1
    kgate.delete_kernel(kid)
    # once deleted, the id is free again
    status, _, model = kgate.rest("POST", "/api/kernels", {"name": "python3", "kernel_id": kid})
    assert status == 201 and model["id"] == kid, (status, model)
    kgate.delete_kernel(kid)


# ------------------------------------------------------------------------ kernelspec files

@pytest.fixture(scope="module")
def spec_files(kgate):
    d = kgate.spec_dir
    (d / "static" / "ext").mkdir(parents=True, exist_ok=True)
    (d / "static" / "ext" / "main.js").write_text("console.log('kgate');\n")
    (d / "kernel.css").write_text("body {}\n")
    (d / "notes.txt").write_text("notes\n")
    (d / "blob.bin").write_bytes(b"\x00\x01\x02")
    (d / "page.html").write_text("<script>alert(1)</script>")
    share = kgate.root / "share"
    (d / "out-link.txt").symlink_to(share / "secret.txt")
    (d / "out-dir").symlink_to(share / "kernels")
    (d / "in-link.js").symlink_to("static/ext/main.js")
    return d


@pytest.mark.parametrize("rel,ctype", [
    ("kernel.json", "application/json"),
    ("static/ext/main.js", "text/javascript"),
    ("kernel.css", "text/css"),
    ("notes.txt", "text/plain"),
    ("blob.bin", "application/octet-stream"),
    ("page.html", "application/octet-stream"),
    ("in-link.js", "text/javascript"),
    ("logo-64x64.png", "image/png"),
])
def test_kernelspec_files_are_served(kgate, spec_files, rel, ctype):
    status, hdrs, data = kgate.http("GET", f"/kernelspecs/python3/{rel}")
    assert status == 200, (rel, status, data[:200])
    assert data == (spec_files / rel).read_bytes(), rel
    assert hdrs.get("Content-Type", "").split(";")[0] == ctype, (rel, hdrs.get("Content-Type"))
    assert hdrs.get("X-Content-Type-Options") == "nosniff"
    status, hdrs, data = kgate.http("HEAD", f"/kernelspecs/python3/{rel}")
    assert status == 200 and data == b"", (rel, status)
    assert int(hdrs["Content-Length"]) == (spec_files / rel).stat().st_size


@pytest.mark.parametrize("path", [
    "/kernelspecs/python3/out-link.txt",
    "/kernelspecs/python3/out-dir/secret.txt",
    "/kernelspecs/python3/out-dir%2fsecret.txt",
    "/kernelspecs/python3/static/..%2f..%2fsecret.txt",
    "/kernelspecs/python3/static/%2e%2e/%2e%2e/secret.txt",
    "/kernelspecs/python3/static",
    "/kernelspecs/python3/static/ext/",
    "/kernelspecs/python3/%2f" + "%2f".join(str(os.path.dirname(__file__)).strip("/").split("/")) + "%2fconftest.py",
    "/kernelspecs/python3/kernel.json%00.png",
])
def test_kernelspec_files_do_not_escape(kgate, spec_files, path):
    status, _, data = kgate.http("GET", path)
    assert status in (400, 404), (path, status, data[:200])
    assert b"KGATE-TRAVERSAL-SECRET" not in data and b"import" not in data, (path, data[:200])


# ------------------------------------------------------------------------ default_kernel

def test_missing_default_kernel_is_warned_at_start_and_on_sighup(kgate_bin, tmp_path):
    cfg = tmp_path / "kgate.toml"
    cfg.write_text('[server]\ndefault_kernel = "no-such-kernel"\n')
    kg = Kgate(kgate_bin, tmp_path / "root", config=cfg).start()
    try:
        def warned(prefix):
            return [ln for ln in kg.log_lines
                    if f'{prefix}default_kernel = "no-such-kernel"' in ln and "names no kernelspec" in ln]

        lines = wait_until(lambda: warned(""), 30)
        assert lines, "no default_kernel warning at start\n" + kg.log_tail()
        assert "Kernelspecs: python3" in lines[0] and "start python3 instead" in lines[0], lines[0]
        # what the warning says is what happens
        status, _, model = kg.rest("POST", "/api/kernels", {})
        assert status == 201 and model["name"] == "python3", (status, model)
        kg._kernels.add(model["id"])

        kg.proc.send_signal(signal.SIGHUP)
        lines = wait_until(lambda: warned("SIGHUP: "), 30)
        assert lines, "no default_kernel warning on SIGHUP\n" + kg.log_tail()
        assert "Kernelspecs: python3" in lines[0], lines[0]
    finally:
        kg.cleanup_kernels()
        kg.stop()


def test_a_default_kernel_that_exists_is_not_warned(kgate, shared_kernel):
    kgate.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: any("SIGHUP: settings reloaded" in ln for ln in kgate.log_lines), 10), kgate.log_tail()
    assert not [ln for ln in kgate.log_lines if "default_kernel =" in ln], kgate.log_tail()
