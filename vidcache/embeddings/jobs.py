"""The embedding jobs: which cached entries a dataset names, and ``embed`` spread over a Ray cluster.

On the jobs floor (it plans a dataset as ``prewarm`` / ``pull`` do, and starts Ray as ``prewarm`` does); the tier
and the computation it runs are ``tier`` and ``compute``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .compute import EmbedSummary, default_device, embed_entries, load_checkpoint, tower_of

if TYPE_CHECKING:
    from ..cache import VideoCache


def dataset_entries(dataset, cache: "VideoCache", options, *, input_key: str, video_key: str,
                    split: str | None = None, media_roots=None) -> tuple[list[str], int, list]:
    """The cached entries a dataset's rows name (as ``vidcache pull`` finds them: no fetch, no build), the count
    of videos no tier caches yet, and the rows that failed.  ``media_roots``: as for ``prewarm``."""
    from .. import planning as pw
    from ..pulling import pull_key
    from ..errors import BadRowError, VidcacheError
    from ..dataset import check_media_roots
    media_roots = check_media_roots(media_roots)
    reader = pw.check_keys(dataset, input_key, video_key, None, split)
    base = pw.dataset_dir(dataset)
    found, missing, failures = [], 0, []
    for _, row, where in pw.placed_rows(reader, split, False, set(), desc="embed"):
        try:
            media = pw.row_media(row, options, input_key, video_key, None, base, media_roots)
        except BadRowError as e:
            failures.append({**where, "kind": e.kind, "error": str(e)})
            continue
        for src, opts in media.videos:
            try:
                key, _, why = pull_key(cache, src, opts)
            except VidcacheError as e:
                failures.append({**where, "source": str(src), "kind": e.kind, "error": str(e)})
                continue
            if key is None:
                missing += 1
            else:
                found.append(key)
    return list(dict.fromkeys(found)), missing, failures


# --- over Ray: one task per shard of the entries, on each node's own cache (prewarm's Ray path) ----------------------
def _embed_shard(cache: "VideoCache", checkpoint: str, dtype: str, device: str | None, entries: list[str],
                 max_bytes: int | None) -> dict:
    """Runs in a Ray worker: loads the checkpoint once, embeds its shard into this node's tier (and the shared
    one).  A retried shard resumes: what a dead attempt stored is skipped."""
    from ..prewarming import node_cache
    from .tier import EmbeddingTier
    cache = node_cache(cache)
    model, processor = load_checkpoint(checkpoint, dtype, device or default_device())
    tower = tower_of(model)
    tier = EmbeddingTier(cache, max_bytes=max_bytes)
    try:
        s = embed_entries(tier, tower, processor, entries)
        tier.local.sync()
    finally:
        tier.close()
    return {"summary": s, "weights": tower.weights, "code": tower.code}


def embed_over_ray(cache: "VideoCache", checkpoint: str, dtype: str, entries: list[str], *,
                   device: str | None = None, max_bytes: int | None = None, shards: int | None = None,
                   progress: bool = False) -> EmbedSummary:
    """``embed_entries`` spread over the Ray cluster (``prewarming.init_ray`` first): one task per GPU of the
    cluster (per CPU without GPUs), each on its node's ``VIDCACHE_DIR``, all writing the shared tier.  Every
    shard must have hashed the same tower (else a node loaded another checkpoint: ``ConfigError``)."""
    import ray

    from ..errors import ConfigError
    res = ray.cluster_resources()
    gpus = int(res.get("GPU", 0))
    n = max(1, min(len(entries), shards or gpus or int(res.get("CPU", 1))))
    remote = ray.remote(num_gpus=1 if gpus else 0, num_cpus=1, max_retries=3)(_embed_shard)
    refs = [remote.remote(cache, checkpoint, dtype, device, entries[i::n], max_bytes) for i in range(n)
            if entries[i::n]]
    total, towers = EmbedSummary(failures=[]), set()
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(refs), desc="embed (ray shards)", unit="shard")
    try:
        while refs:
            done, refs = ray.wait(refs, num_returns=1)
            out = ray.get(done[0])
            s = out["summary"]
            towers.add((out["weights"], out["code"]))
            for f in ("computed", "present", "pulled", "failed", "bytes"):
                setattr(total, f, getattr(total, f) + getattr(s, f))
            total.failures += s.failures
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    if len(towers) > 1:
        raise ConfigError(f"the Ray nodes loaded different towers from {checkpoint} ({sorted(towers)}): each node's "
                          "records are keyed by its own, so they are not the same embeddings; give every node the "
                          "same checkpoint")
    return total
