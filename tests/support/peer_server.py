"""An SGLang stand-in in a process of its own: SGLang's own Qwen-VL processor behind its HTTP endpoints
(``sglang_peer.PeerServer``), on whatever transformers this interpreter imports, so a test can put the server
on one transformers release and the trainer (the CLI, ``layout_client.py``) on another:

    PYTHONPATH=.overlays/transformers-5.19.0 python tests/support/peer_server.py \
        --family qwen3_vl --mode plugin --ckpt DIR --url-file F

It writes its URL to ``--url-file`` once it serves, and serves until it is killed.  Plugin mode: the processor
class is the one SGLang's ``import_processors`` registers from ``vidcache.sglang.plugin``, resolving references
through this process's ``VIDCACHE_DIR`` + ``VIDCACHE_SHARED``, as a server would.  Like SGLang, it does not
report its transformers in ``/server_info`` (check-server then goes by the SGLang release's pin).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # tests/, for support.*


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", required=True)
    ap.add_argument("--mode", choices=("stock", "plugin"), required=True)
    ap.add_argument("--ckpt", required=True, help="the processor directory the server loads (its tokenizer_path)")
    ap.add_argument("--url-file", required=True)
    a = ap.parse_args(argv)

    from transformers import AutoProcessor

    from support import sglang_peer as sp
    from vidcache.sglang.config import mm_process_config

    cls = None
    if a.mode == "plugin":
        import importlib
        cls = importlib.import_module("vidcache.sglang.plugin.qwen_vl").VidcacheQwenVLProcessor
    peer = sp.build_peer(a.family, AutoProcessor.from_pretrained(a.ckpt), video_config=mm_process_config()["video"],
                         processor_cls=cls)
    with sp.PeerServer(peer, tokenizer_path=a.ckpt, mm_process_config=mm_process_config()) as srv:
        tmp = a.url_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(srv.url)
        os.replace(tmp, a.url_file)              # the URL appears whole, once the server answers
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
