"""Every output kept (issue 61, part 1): a cell's record holds its outputs as nbformat outputs in
the order they came, images and HTML included; display updates and clear_output leave the final
state; big values live in files of the state dir; the export carries them and validates with
nbformat; a limit leaves a note. The cells here are the person's (a websocket client) and an
agent's, on real ipykernels."""

import base64
import json
import os
import stat

import nbformat
from records_util import agent_execute, records_config

PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c63f8cfc0f01f0005000201a5d2f6c80000000049454e44ae426082")).decode()

CELL = f"""# kept-outputs
import sys, time
from IPython.display import display, HTML, Image, clear_output, update_display
print('out 1'); sys.stdout.flush()
print('err 1', file=sys.stderr); sys.stderr.flush()
print('out 2'); sys.stdout.flush()
display(Image(data=__import__('base64').b64decode('{PNG}')))
display(HTML('<b>bold</b><script>window.ran = 1</script>'))
h = display({{'text/plain': 'progress 0%'}}, raw=True, display_id=True)
for i in range(1, 4):
    h.update({{'text/plain': 'progress %d%%' % (i * 25)}}, raw=True)
for i in range(5):
    clear_output(wait=True)
    print('step', i); sys.stdout.flush()
"""


def job_of(kg, kid, code_part):
    body = kg.rest("GET", f"/api/kgate/jobs?kernel={kid}")[2]
    return next(j["job"] for j in body["jobs"] if code_part in j["code"])


def outputs_of(kg, job):
    status, _, body = kg.rest("GET", f"/api/kgate/jobs/{job}?outputs=1")
    assert status == 200, body
    return body["outputs"]


def test_every_output_is_kept_in_order_and_exported(kgate, kernel):
    with kgate.connect(kernel) as ws:
        ws.run("1")  # a first cell, so the kernel side and the records are warm
        ws.execute(CELL, timeout=60)
        ws.execute("from IPython.display import display; display({'text/plain': 'in another cell'}, raw=True)")
    job = job_of(kgate, kernel, "# kept-outputs")
    outs = outputs_of(kgate, job)
    # clear_output(wait=True) in a loop: the last step alone is left of this cell's outputs.
    assert outs == [{"output_type": "stream", "name": "stdout", "text": "step 4\n"}], outs

    # The same without the clears: everything, in order.
    code = CELL.split("for i in range(5):")[0].replace("# kept-outputs", "# kept-outputs, no clears")
    with kgate.connect(kernel) as ws:
        ws.execute(code, timeout=60)
    body = kgate.rest("GET", f"/api/kgate/jobs?kernel={kernel}")[2]
    job = next(j["job"] for j in body["jobs"] if "# kept-outputs, no clears" in j["code"])
    outs = outputs_of(kgate, job)
    kinds = [(o["output_type"], o.get("name")) for o in outs]
    assert kinds == [("stream", "stdout"), ("stream", "stderr"), ("stream", "stdout"), ("display_data", None),
                     ("display_data", None), ("display_data", None)], outs
    assert [o.get("text") for o in outs[:3]] == ["out 1\n", "err 1\n", "out 2\n"], outs
    assert outs[3]["data"]["image/png"].strip() == PNG, outs[3]
    assert "<script>" in outs[4]["data"]["text/html"]  # kept as sent; the page shows it sandboxed
    assert outs[5]["data"]["text/plain"] == "progress 75%", outs[5]  # updated by display_id

    # The export: every kept output, and it validates.
    status, _, nb = kgate.rest("GET", f"/api/kgate/kernels/{kernel}/notebook")
    assert status == 200, nb
    nbformat.validate(nbformat.from_dict(nb))
    cell = next(c for c in nb["cells"] if c.get("id") == job)
    assert any("image/png" in o.get("data", {}) for o in cell["outputs"]), cell["outputs"]


def test_a_plot_goes_to_a_file_of_the_state_dir_and_back(kgate, kernel):
    big = "import base64\nfrom IPython.display import Image, display\n" \
          f"display(Image(data=base64.b64decode('{PNG}') + b'\\0' * 30000))"
    status, body = agent_execute(kgate, kernel, big, "agent-outputs", wait=30)
    assert status == 200 and body["status"] == "ok", body
    outs = outputs_of(kgate, body["job"])
    assert outs[0]["output_type"] == "display_data" and len(outs[0]["data"]["image/png"]) > 30000, outs
    blobs = kgate.own_token_file.parent / "outputs"
    assert stat.S_IMODE(os.stat(blobs).st_mode) == 0o700
    files = [p for p in blobs.iterdir()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files), files


def test_an_output_past_its_limit_leaves_a_note(kgate_factory, tmp_path):
    kg = kgate_factory(config=records_config(tmp_path, output_bytes=1024))
    kid = kg.start_kernel()["id"]
    status, body = agent_execute(kg, kid, "from IPython.display import display, HTML\n"
                                          "display(HTML('x' * 5000))\nprint('after')", "agent-limit", wait=30)
    assert status == 200 and body["status"] == "ok", body
    outs = outputs_of(kg, body["job"])
    assert outs[0]["output_type"] == "stream" and outs[0]["name"] == "stderr", outs
    assert outs[0]["text"].startswith("[kgate] A display_data of") and "output_bytes" in outs[0]["text"], outs
    assert outs[1]["text"] == "after\n", outs
    nb = kg.rest("GET", f"/api/kgate/kernels/{kid}/notebook")[2]
    nbformat.validate(nbformat.from_dict(nb))
    cell = next(c for c in nb["cells"] if c.get("id") == body["job"])
    assert "output_bytes" in "".join(cell["outputs"][0]["text"]), cell
    kg.delete_kernel(kid)


def test_outputs_survive_a_restart_and_readoption(kgate_bin, tmp_path):
    from conftest import Kgate
    kg = Kgate(kgate_bin, tmp_path / "kg").start()
    again = None
    try:
        kid = kg.start_kernel()["id"]
        code = "import base64\nfrom IPython.display import Image, display\n" \
               f"print('before')\ndisplay(Image(data=base64.b64decode('{PNG}') + b'\\0' * 20000))"
        status, body = agent_execute(kg, kid, code, "agent-restart", wait=30)
        assert status == 200 and body["status"] == "ok", body
        job = body["job"]
        kept = outputs_of(kg, job)
        kg.stop(sweep=False)  # SIGTERM: the kernel stays for the next kgate
        again = Kgate(kgate_bin, tmp_path / "kg").start()
        assert outputs_of(again, job) == kept
        nb = again.rest("GET", f"/api/kgate/kernels/{kid}/notebook")[2]
        nbformat.validate(nbformat.from_dict(nb))
        cell = next(c for c in nb["cells"] if c.get("id") == job)
        assert any("image/png" in o.get("data", {}) for o in cell["outputs"]), cell
        again.delete_kernel(kid)
    finally:
        (again or kg).stop()
