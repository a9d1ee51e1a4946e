"""What running each entry's round trips side by side buys ``pull`` and ``verify --shared`` when a round trip
costs what it does on S3, not what moto on loopback costs (issue 50).

    nice .venv/bin/python benchmarks/round_trips.py [--entries 500] [--rtt-ms 20]

moto's server runs in a process of its own behind a TCP proxy on loopback that holds each request ``--rtt-ms``
before passing it on (a region's S3 answers a GET in tens of ms; moto here in about one).  ``n`` small entries are
written through the stores (``scale.fill``); then, each on a fresh node, ``pull`` of every row one at a time
(``--depth 1``) and as it runs by default, and ``verify --shared`` one at a time (``--workers 1``) and by default.
Prints each wall time and the ratios, one at a time / default, in the same run.  Never asserts on time.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _common import report  # noqa: E402


@contextlib.contextmanager
def delaying_proxy(target_port: int, delay_s: float):
    """``127.0.0.1:PORT`` forwarding to ``target_port``; each chunk the client sends waits ``delay_s`` first
    (a request is one chunk or a few: about one round trip's latency a request)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box = {}

    async def pipe(reader, writer, delay):
        try:
            while data := await reader.read(1 << 16):
                if delay:
                    await asyncio.sleep(delay)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def handle(cr, cw):
        sr, sw = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pipe(cr, sw, delay_s), pipe(sr, cw, 0.0))

    async def start():
        box["server"] = await asyncio.start_server(handle, "127.0.0.1", 0)
        box["port"] = box["server"].sockets[0].getsockname()[1]
        ready.set()

    def serve():
        loop.run_until_complete(start())
        loop.run_forever()                  # until stopped below

    threading.Thread(target=serve, daemon=True).start()
    ready.wait(10)
    try:
        yield box["port"]
    finally:
        loop.call_soon_threadsafe(loop.stop)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=500)
    ap.add_argument("--rtt-ms", type=float, default=20.0, help="added to each request (default 20 ms)")
    args = ap.parse_args()
    import scale
    from shared_tier_read import moto_s3
    scale.OPTION_FLAGS.extend(["--nframes", "2"])
    work = tempfile.mkdtemp(prefix="vidcache-rtt-")
    try:
        with moto_s3(bucket="rtt", process=True) as (url, opts):
            moto_port = int(opts["endpoint_url"].rsplit(":", 1)[1])
            env = {"AWS_ENDPOINT_URL": opts["endpoint_url"], "AWS_DEFAULT_REGION": "us-east-1",
                   "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
            os.environ.update(env)
            shared, data = f"s3://rtt/n{args.entries}", os.path.join(work, "rows.jsonl")
            fill_s, _ = scale.fill(os.path.join(work, "node"), shared, os.path.join(work, "src"), args.entries, data)
            with delaying_proxy(moto_port, args.rtt_ms / 1000) as port:
                base = {k: v for k, v in os.environ.items() if not k.startswith("VIDCACHE_")}
                base.update({**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "PYTHONPATH": scale.ROOT,
                             "VIDCACHE_SHARED": shared})
                t = {}
                runs = [("pull, one at a time", ["pull", data, "--depth", "1", *scale.OPTION_FLAGS]),
                        ("pull", ["pull", data, *scale.OPTION_FLAGS]),
                        ("verify --shared, one at a time", ["verify", "--shared", "--workers", "1"]),
                        ("verify --shared", ["verify", "--shared"])]
                for i, (name, cmd) in enumerate(runs):
                    # each pull on a fresh node; verify on the node the fill wrote (it checks both tiers)
                    node = os.path.join(work, f"fresh{i}") if cmd[0] == "pull" else os.path.join(work, "node")
                    r = scale.run(cmd, {**base, "VIDCACHE_DIR": node}, limit=3600)
                    t[name] = r["s"]
                    print(f"{name}: {t[name]:.1f} s ({r['last']})", flush=True)
        report(f"round trips side by side: {args.entries} entries on S3 (moto behind a {args.rtt_ms:g} ms proxy), "
               f"fill {fill_s:.0f} s, {os.cpu_count()} cores",
               [(name, f"{s:.1f} s") for name, s in t.items()]
               + [("pull: one at a time / default", f"{t['pull, one at a time'] / t['pull']:.1f}x"),
                  ("verify --shared: one at a time / default",
                   f"{t['verify --shared, one at a time'] / t['verify --shared']:.1f}x")])
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
