"""vidcache <-> Miles integration: video RL on Miles without forking it.

Each module plugs into one Miles extension point (see docs/miles.md):

  data_source.VidcacheDataSource       --data-source-path            lazy prompts, handles in metadata, no decoding
  generate.generate                    --custom-generate-function-path   compact ids + video_data to SGLang,
  generate.generate_multi_turn                                       expanded ids + tensors to the trainer
  rollout.VidcacheRolloutFn            --rollout-function-path       video-aware prefill recompute, lazy eval
  train_hooks.install_train_hooks      --custom-megatron-init-path   (--vidcache-train-inputs handles) rebuild
                                                                     tensors from the cache inside each train actor
  args                                 the --vidcache-* flags, VideoOptions / cache from them
  meta                                 handle <-> sample.metadata conversion (plain dicts; no Miles import)

Only ``args``, ``meta`` and ``train_hooks``' pure helpers import without Miles on the path.
"""
