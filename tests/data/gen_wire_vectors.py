#!/usr/bin/python3
# Generates wire_vectors.json: reference frames and signatures from jupyter_client's Session.
#
# Run with Debian's interpreter (it has jupyter_client):
#     /usr/bin/python3 tests/data/gen_wire_vectors.py > tests/data/wire_vectors.json
#
# Every input is fixed (msg_id, date, session ids, buffers), so the output is deterministic
# and can be committed.  All frames are stored base64-encoded because identities and buffers
# are binary; the JSON parts are also stored as text for readability.

import base64
import json
import sys

import jupyter_client
from jupyter_client.session import Session

KEYS = {
    "empty": "",
    "ascii": "secret",
    "uuid": "a0436f6c-1916-498b-8eb9-e81ab9368e84",
    "unicode": "ключ-🔑-clé-鍵",
    # Longer than every digest's block size, so HMAC hashes the key first.
    "long": "k" * 150 + "-λ" * 40,
}

SCHEMES = [
    "hmac-sha256",
    "hmac-sha512",
    "hmac-sha384",
    "hmac-sha224",
    "hmac-sha1",
    "hmac-md5",
    "hmac-sha3_256",
    "hmac-blake2b",
    "hmac-blake2s",
]


def header(msg_id, msg_type, session="6f0c2a9e4d2b4b8e9a1c3d5e7f901234"):
    return {
        "msg_id": msg_id,
        "session": session,
        "username": "kgate-test",
        "date": "2024-03-01T12:34:56.789012Z",
        "msg_type": msg_type,
        "version": "5.3",
    }


def messages():
    """(name, identities, msg pieces, buffers) for each reference message."""
    yield (
        "execute_request",
        [b"\x00k\x8b\x45\x67"],
        dict(
            header=header("0d6c1b4cbb3f4fb0a1c2d3e4f5a6b7c8", "execute_request"),
            parent=None,
            metadata=None,
            content={
                "code": "print(1 + 1)",
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": False,
                "stop_on_error": True,
            },
        ),
        [],
    )
    yield (
        "stream_unicode",
        [b"kernel.6f0c2a9e.stream"],
        dict(
            header=header("a1b2c3d4e5f60718293a4b5c6d7e8f90", "stream"),
            parent=header("0d6c1b4cbb3f4fb0a1c2d3e4f5a6b7c8", "execute_request",
                          session="ffeeddccbbaa99887766554433221100"),
            metadata={"ünïcödé": "ναι", "n": 3},
            content={
                "name": "stdout",
                "text": "héllo 世界 🎉\n\ttab \"quoted\" back\\slash \u0001\u001f \u2028 end\n",
            },
        ),
        [],
    )
    yield (
        "comm_msg_buffers",
        [b"id-one", b"\xff\xfe\x00\x01id-two"],
        dict(
            header=header("00000000000000000000000000000001", "comm_msg"),
            parent={},
            metadata={"buffer_paths": [["data"], ["empty"]]},
            content={"comm_id": "c0ffee", "data": {"method": "update", "value": 1.5}},
        ),
        [bytes(range(256)), b"", "ünicode buffer".encode("utf-8")],
    )
    yield (
        "no_identities_empty_content",
        [],
        dict(
            header=header("deadbeefdeadbeefdeadbeefdeadbeef", "kernel_info_request"),
            parent=None,
            metadata=None,
            content={},
        ),
        [b"\x00"],
    )


def b64(data):
    return base64.b64encode(data).decode("ascii")


def make_case(key_name, key, scheme, msg_name, idents, pieces, buffers):
    session = Session(key=key.encode("utf-8"), signature_scheme=scheme,
                      session="fixed-session", username="kgate-test")
    msg = session.msg(pieces["header"]["msg_type"], content=pieces["content"],
                      parent=pieces["parent"], header=pieces["header"],
                      metadata=pieces["metadata"])
    frames = session.serialize(msg, ident=list(idents))
    # Session.send appends buffers after the serialized frames; do the same here.
    frames = frames + list(buffers)
    n = len(idents)
    assert frames[n] == b"<IDS|MSG>"
    parts = frames[n + 2:n + 6]
    return {
        "name": f"{msg_name}/{key_name}/{scheme}",
        "key": key,
        "scheme": scheme,
        "signature": frames[n + 1].decode("ascii"),
        "n_identities": n,
        "n_buffers": len(buffers),
        "frames_b64": [b64(f) for f in frames],
        "parts_text": {
            "header": parts[0].decode("utf-8"),
            "parent_header": parts[1].decode("utf-8"),
            "metadata": parts[2].decode("utf-8"),
            "content": parts[3].decode("utf-8"),
        },
    }


def main():
    cases = []
    msgs = list(messages())
    # Every scheme with an ordinary key, then every key with the default scheme.
    combos = [("ascii", s) for s in SCHEMES]
    combos += [(k, "hmac-sha256") for k in KEYS if k != "ascii"]
    combos += [("unicode", "hmac-sha512"), ("long", "hmac-md5"), ("long", "hmac-sha384")]
    for key_name, scheme in combos:
        for msg_name, idents, pieces, buffers in msgs:
            cases.append(make_case(key_name, KEYS[key_name], scheme, msg_name, idents,
                                   pieces, buffers))
    doc = {
        "generator": "tests/data/gen_wire_vectors.py",
        "jupyter_client": jupyter_client.__version__,
        "cases": cases,
    }
    json.dump(doc, sys.stdout, indent=1, sort_keys=True, ensure_ascii=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
