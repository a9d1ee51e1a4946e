"""The Python API a user reaches for (issue 13 item 7): vidcache.prewarm over rows or a JSONL,
prepare with a dataset row's own prompt, and vidcache.testing.toy_processor."""
import importlib
import json

import pytest
import torch

import vidcache
from vidcache import VideoOptions
from vidcache.processing import VIDEO_PLACEHOLDER
from vidcache.testing import toy_processor


def test_prewarm_takes_rows_or_a_jsonl_and_returns_the_failures(tmp_path, videos):
    cache = vidcache.VideoCache(tmp_path / "c")
    rows = [{"prompt": "<video> hi", "videos": [videos["ffv1_10_small"]]},
            {"prompt": "<video> gone", "videos": [str(tmp_path / "gone.mp4")]},
            "not a row"]
    s = vidcache.prewarm(rows, cache, VideoOptions(), progress=False)
    assert (s.new, s.failed) == (1, 2)
    assert sorted((f["row"], f["kind"]) for f in s.failures) == [(1, "not_found"), (2, "bad_row")]
    assert all("line" not in f for f in s.failures)                 # rows have no lines; a JSONL's do
    ds = tmp_path / "d.jsonl"
    ds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = vidcache.prewarm(str(ds), cache, VideoOptions(), progress=False, failures_path=str(tmp_path / "f.jsonl"))
    assert (s.new, s.hit, s.failed) == (0, 1, 2) and {f["line"] for f in s.failures} == {2, 3}
    assert len((tmp_path / "f.jsonl").read_text().splitlines()) == 2
    job = importlib.import_module("vidcache.prewarming")     # the job's module: importing it leaves the function be
    assert vidcache.prewarm is job.prewarm and not isinstance(vidcache.prewarm, type(job))
    assert vidcache.prewarm(rows[:1], cache, VideoOptions(), progress=False).hit == 1


def test_prepare_takes_a_dataset_rows_prompt_as_it_is(tmp_path, videos):
    cache = vidcache.VideoCache(tmp_path / "c")
    h = vidcache.get(videos["ffv1_10_small"], VideoOptions(), cache)
    proc = toy_processor("qwen2_5_vl")
    from_row = vidcache.prepare(proc, "<video> what happens?", [h], mode="plugin")
    templated = vidcache.prepare(proc, VIDEO_PLACEHOLDER + " what happens?", [h], mode="plugin")
    assert from_row.expanded_ids == templated.expanded_ids and from_row.compact_ids == templated.compact_ids
    assert all(torch.equal(from_row.train_inputs[k], templated.train_inputs[k]) for k in templated.train_inputs)
    with pytest.raises(ValueError) as e:
        vidcache.prepare(proc, "no marker here", [h], mode="plugin")
    assert VIDEO_PLACEHOLDER in str(e.value) and "'<video>'" in str(e.value)


def test_toy_processor_is_a_real_processor_of_the_family():
    p = toy_processor("qwen3_vl")
    assert type(p).__name__ == "Qwen3VLProcessor" and p.video_processor.patch_size == 16
    with pytest.raises(ValueError, match="unknown family"):
        toy_processor("qwen9")


def test_prepare_takes_a_rows_image_placeholders_and_message_lists(tmp_path, videos):
    """Issue 40: a Miles row as it is -- `<image>` markers with its images, or a message-list prompt (rendered by the
    processor's chat template) -- gives what the templated text gives; otherwise the error names the fix."""
    from PIL import Image

    from vidcache.rollout.prompt import IMAGE_PLACEHOLDER
    cache = vidcache.VideoCache(tmp_path / "c")
    h = vidcache.get(videos["ffv1_10_small"], VideoOptions(), cache)
    proc = toy_processor("qwen2_5_vl")
    img = Image.new("RGB", (56, 56), (200, 30, 30))
    row = vidcache.prepare(proc, "<image> then <video>: same colour?", [h], mode="stock", images=[img])
    text = vidcache.prepare(proc, f"{IMAGE_PLACEHOLDER} then {VIDEO_PLACEHOLDER}: same colour?", [h], mode="stock",
                            images=[img])
    assert row.expanded_ids == text.expanded_ids and row.compact_ids == text.compact_ids
    assert set(row.train_inputs) >= {"pixel_values", "image_grid_thw", "pixel_values_videos"}
    assert all(torch.equal(row.train_inputs[k], text.train_inputs[k]) for k in text.train_inputs)
    with pytest.raises(ValueError, match=r"images=\[\.\.\.\], one per placeholder"):
        vidcache.prepare(proc, "<image> then <video>", [h], mode="stock")
    messages = [{"role": "user", "content": [{"type": "video", "video": videos["ffv1_10_small"]},
                                             {"type": "text", "text": "What happens?"}]}]
    with pytest.raises(ValueError, match="no chat template.*AutoProcessor.from_pretrained"):
        vidcache.prepare(proc, messages, [h], mode="stock")
    proc.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
                          "{% if c['type'] == 'text' %}{{ c['text'] }}{% elif c['type'] == 'video' %}"
                          "<|vision_start|><|video_pad|><|vision_end|>{% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
                          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    chat = vidcache.prepare(proc, messages, [h], mode="stock")
    rendered = vidcache.prepare(proc, f"<|im_start|>user\n{VIDEO_PLACEHOLDER}What happens?<|im_end|>\n"
                                      "<|im_start|>assistant\n", [h], mode="stock")
    assert chat.expanded_ids == rendered.expanded_ids and chat.compact_ids == rendered.compact_ids
