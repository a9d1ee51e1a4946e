"""A TCP proxy in front of an S3 endpoint (moto's server), run as a process of its own so that a test can kill it
with SIGKILL: to a client, the endpoint dies mid-transfer.  moto keeps its objects behind it, so what survived is
checked against moto directly once the proxy is back.

    python faulty_proxy.py LISTEN_PORT UPSTREAM_PORT [--die-after BYTES] [--short-bodies MIN]

``--die-after``: exit (``os._exit``, as abrupt as SIGKILL) once that many bytes went either way in all.
``--short-bodies``: every response whose Content-Length is at least MIN says half that length and carries half the
body, then the connection closes: a wrong-length body that looks complete to HTTP.
"""
from __future__ import annotations

import os
import re
import socket
import sys
import threading

moved = [0]
lock = threading.Lock()


def count(n: int, die_after: int | None) -> None:
    with lock:
        moved[0] += n
        if die_after is not None and moved[0] >= die_after:
            os._exit(9)


def pump(src: socket.socket, dst: socket.socket, die_after, short_min) -> None:
    buf = b""
    try:
        while data := src.recv(65536):
            if short_min is not None:
                buf += data
                head, sep, body = buf.partition(b"\r\n\r\n")
                m = re.search(rb"(?im)^content-length:\s*(\d+)", head) if sep else None
                if m and int(m.group(1)) >= short_min:
                    want = int(m.group(1)) // 2
                    while len(body) < want and (more := src.recv(65536)):
                        body += more
                    head = head[:m.start(1)] + str(want).encode() + head[m.end(1):]
                    dst.sendall(head + sep + body[:want])
                    break                          # and close: the rest of the body never comes
                if sep or len(buf) > 65536:
                    dst.sendall(buf)
                    count(len(buf), die_after)
                    buf = b""
                continue
            count(len(data), die_after)
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def main() -> None:
    args = sys.argv[1:]
    listen, upstream = int(args[0]), int(args[1])
    die_after = int(args[args.index("--die-after") + 1]) if "--die-after" in args else None
    short_min = int(args[args.index("--short-bodies") + 1]) if "--short-bodies" in args else None
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", listen))
    srv.listen(128)
    print("ready", flush=True)
    while True:
        client, _ = srv.accept()
        server = socket.create_connection(("127.0.0.1", upstream))
        threading.Thread(target=pump, args=(client, server, die_after, None), daemon=True).start()
        threading.Thread(target=pump, args=(server, client, die_after, short_min), daemon=True).start()


if __name__ == "__main__":
    main()
