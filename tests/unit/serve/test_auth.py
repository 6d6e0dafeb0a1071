"""The bearer token on every route (issue 35, still open from the third round): with a token configured,
every request whatever its route or method (an unknown route and a wrong method too, so that nothing about
the endpoint shows without it) needs exactly one ``Authorization: Bearer TOKEN`` header carrying exactly the
token, compared in constant time; a misframed header is refused with a JSON 401, never a 500. The requests
are written byte for byte on a socket, so no client library tidies a header up first."""

from __future__ import annotations

import json
import os
import socket

import pytest

from evald.serve.token import TokenFileError, read_token

TOKEN = "s3cret-token_of.some~length"


def test_a_token_must_be_visible_ascii(tmp_path):
    """A header carries bytes: a token of other characters could never be sent as it is written."""
    path = tmp_path / "token"
    for bad in ("tökén-of-some-length-1234", "token-of-some-length-\x7f12", "token-of-some-length-\u00a0x"):
        path.write_text(bad + "\n", "utf-8")
        os.chmod(path, 0o600)
        with pytest.raises(TokenFileError, match="ASCII"):
            read_token(path)
    path.write_text(TOKEN + "\n")
    assert read_token(path) == TOKEN


def test_a_fifo_as_the_token_file_is_refused_at_once(tmp_path):
    """open(2) of a FIFO without a writer blocks: evald's start hung there. Read in a thread that must end
    within a generous 10 s (the issue's "nothing hangs"); a blocked one is released by opening the writer."""
    import threading

    path = tmp_path / "token"
    os.mkfifo(path, 0o600)
    outcome: list[BaseException | str] = []

    def read() -> None:
        try:
            outcome.append(read_token(path))
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10.0)
    if reader.is_alive():
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))   # the blocked open returns; the thread ends
        reader.join(10.0)
        pytest.fail("reading a FIFO as the token file blocked")
    assert isinstance(outcome[0], TokenFileError) and "a FIFO" in str(outcome[0]), outcome


ms = pytest.importorskip("mindspore")

from evald.config import ServeOptions  # noqa: E402
from evald.serve.app import Context, build_app  # noqa: E402
from evald.serve.http_thread import HttpThread  # noqa: E402
from tests.networks import demo_network_in_graph_mode  # noqa: E402
from tests.unit.serve.rig import Loop, Rig, snapshot  # noqa: E402

OPTIONS = ServeOptions(listen="127.0.0.1:0", batch_size=4, request_timeout_s=60)
ROUTES = [("POST", "/v1/completions", {"model": "unit@10", "prompt": "ab", "max_tokens": 1}),
          ("POST", "/v1/chat/completions", {"model": "unit@10", "messages": [{"role": "user", "content": "a"}]}),
          ("GET", "/v1/models", None), ("GET", "/health", None), ("GET", "/tokenizer_info", None),
          ("POST", "/tokenize", {"prompt": "ab"}), ("POST", "/detokenize", {"tokens": [97]}),
          ("HEAD", "/v1/models", None), ("GET", "/v1/completions", None), ("POST", "/v1/embeddings", {"input": "a"}),
          ("OPTIONS", "/v1/completions", None), ("GET", "/", None)]


@pytest.fixture(scope="module")
def guarded():
    with demo_network_in_graph_mode(seed=3) as net:
        rig = Rig(net, OPTIONS, {10: snapshot(net, 1)})
        context = Context(OPTIONS, rig.tokenizer, rig.queue, rig.stats, rig.runner, token=TOKEN,
                          window=rig.scorer.max_length)
        http = HttpThread(build_app(context), "127.0.0.1", 0, keep_alive_s=5, limit_concurrency=64,
                          header_timeout_s=10)
        http.start()
        try:
            with Loop(rig):
                yield http.port
        finally:
            http.stop()
            rig.close()


def send(port: int, method: str, path: str, body: dict | None, headers: list[bytes]) -> tuple[int, dict, bytes]:
    """One request written as raw bytes; (status, headers, body) of the answer."""
    data = json.dumps(body).encode() if body is not None else b""
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close",
             f"Content-Length: {len(data)}".encode(), b"Content-Type: application/json", *headers]
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.split(b"\r\n")
    fields = {k.strip().lower().decode(): v.strip().decode("latin-1") for k, _, v in
              (line.partition(b":") for line in header_lines)}
    return int(status_line.split()[1]), fields, payload


def _refused(status: int, fields: dict, payload: bytes, method: str) -> None:
    assert status == 401, (status, payload)
    assert fields.get("content-type") == "application/json" and fields.get("www-authenticate", "").startswith("Bearer")
    if method != "HEAD":
        assert json.loads(payload)["error"]["code"] == 401


@pytest.mark.parametrize("method, path, body", ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_every_route_and_method_needs_the_token(guarded, method, path, body):
    _refused(*send(guarded, method, path, body, []), method)
    status, _, payload = send(guarded, method, path, body, [b"Authorization: Bearer " + TOKEN.encode()])
    assert status != 401, payload


MISFRAMED = {
    "no space": [b"Authorization: Bearer" + TOKEN.encode()],
    "two spaces": [b"Authorization: Bearer  " + TOKEN.encode()],
    "a tab": [b"Authorization: Bearer\t" + TOKEN.encode()],
    "another scheme": [b"Authorization: Basic " + TOKEN.encode()],
    "trailing junk": [b"Authorization: Bearer " + TOKEN.encode() + b"x"],
    "a second word": [b"Authorization: Bearer " + TOKEN.encode() + b" x"],
    "a trailing no-break space": [b"Authorization: Bearer " + TOKEN.encode() + b"\xa0"],
    "a trailing next-line": [b"Authorization: Bearer " + TOKEN.encode() + b"\x85"],
    "a leading no-break space": [b"Authorization: Bearer \xa0" + TOKEN.encode()],
    "non-ASCII": [b"Authorization: Bearer " + "tökén".encode()],
    "latin-1 bytes": [b"Authorization: Bearer \xe9\xe8"],
    "a prefix of the token": [b"Authorization: Bearer " + TOKEN.encode()[:-1]],
    "empty": [b"Authorization: "],
    "right, then wrong": [b"Authorization: Bearer " + TOKEN.encode(), b"Authorization: Bearer wrong"],
    "wrong, then right": [b"Authorization: Bearer wrong", b"Authorization: Bearer " + TOKEN.encode()],
    "right twice": [b"Authorization: Bearer " + TOKEN.encode()] * 2,
}


@pytest.mark.parametrize("name", sorted(MISFRAMED))
def test_a_misframed_header_is_refused(guarded, name):
    for method, path, body in ROUTES[:7]:
        _refused(*send(guarded, method, path, body, MISFRAMED[name]), method)


def test_the_scheme_is_case_insensitive_and_surrounding_whitespace_is_not_the_value(guarded):
    """RFC 9110: the scheme is case-insensitive, and the whitespace around a field value is not part of it."""
    for header in (b"authorization: bearer " + TOKEN.encode(), b"AUTHORIZATION:   BEARER " + TOKEN.encode() + b"  "):
        status, _, payload = send(guarded, "GET", "/v1/models", None, [header])
        assert status == 200, payload
