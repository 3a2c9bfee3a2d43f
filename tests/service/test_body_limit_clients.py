"""An oversized body gets its 413 with every client, on a real ``pointsman serve``: clients that write
the whole body before reading the answer (Python's urllib, ``requests``, a raw socket) read the 413
rather than a connection reset, as do httpx and a chunked upload; the service keeps serving after."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import httpx
import pytest
import requests

LIMIT_BYTES = 256 * 1024
BODY = b'{"messages": [{"role": "user", "content": "' + b"x" * (8 * 1024 * 1024) + b'"}]}'  # 8 MiB: >> socket buffers


@pytest.fixture(scope="module")
def base(tmp_path_factory, serve_module):
    _, url = serve_module(tmp_path_factory.mktemp("body"), max_body_bytes=LIMIT_BYTES)
    return url


def _is_413(status: int, body: bytes) -> None:
    assert status == 413, body[:200]
    assert json.loads(body)["error"]["code"] == "body_too_large"


def _raw(base: str, head: bytes, body_parts: list[bytes]) -> bytes:
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head)
        for part in body_parts:
            sock.sendall(part)  # all of it, before reading anything
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_urllib_reads_the_413(base):
    req = urllib.request.Request(f"{base}/v1/route", data=BODY, headers={"content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=30)
    _is_413(exc.value.code, exc.value.read())
    assert exc.value.headers["connection"] == "close"


def test_requests_reads_the_413(base):
    r = requests.post(f"{base}/v1/outcomes", data=BODY, headers={"content-type": "application/json"}, timeout=30)
    _is_413(r.status_code, r.content)


def test_httpx_reads_the_413(base):
    r = httpx.post(f"{base}/v1/route", content=BODY, timeout=30)
    _is_413(r.status_code, r.content)


def test_a_raw_socket_that_writes_everything_first_reads_the_413(base):
    head = (f"POST /v1/route HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(BODY)}\r\n\r\n").encode()
    answer = _raw(base, head, [BODY])
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 413 Request Entity Too Large"
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert b"connection: close" in headers.lower()
    _is_413(413, body)


def test_a_chunked_upload_over_the_limit_reads_the_413(base):
    head = b"POST /v1/route HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    step = 64 * 1024
    chunks = [b"%x\r\n%s\r\n" % (len(BODY[i:i + step]), BODY[i:i + step]) for i in range(0, len(BODY), step)]
    answer = _raw(base, head, [*chunks, b"0\r\n\r\n"])
    assert answer.startswith(b"HTTP/1.1 413 ")
    _is_413(413, answer.partition(b"\r\n\r\n")[2])


def test_the_service_keeps_serving_after_oversized_bodies(base):
    r = httpx.post(f"{base}/v1/route", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=10)
    assert r.status_code == 200
