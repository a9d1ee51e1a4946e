"""Draw cached frames as one PNG grid, captioned with their source frame index."""
from __future__ import annotations

import math

import torch
from PIL import Image, ImageDraw


def contact_sheet(frames: torch.Tensor, manifest, max_frames: int = 32, thumb_width: int = 240) -> Image.Image:
    n = min(len(frames), max_frames)
    step = len(frames) / n
    picks = [int(i * step) for i in range(n)]
    h, w = frames.shape[2:]
    tw, th = thumb_width, max(1, round(h * thumb_width / w))
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    sheet = Image.new("RGB", (cols * tw, rows * (th + 14)), "black")
    draw = ImageDraw.Draw(sheet)
    idx = manifest.sampling.frame_indices
    fps = manifest.source.average_fps_from_decoder
    for j, i in enumerate(picks):
        img = Image.fromarray(frames[i].permute(1, 2, 0).numpy()).resize((tw, th), Image.BILINEAR)
        x, y = (j % cols) * tw, (j // cols) * (th + 14)
        sheet.paste(img, (x, y))
        draw.text((x + 2, y + th + 1), f"#{i} src {idx[i]} @ {idx[i] / fps:.2f}s", fill="white")
    return sheet
