"""The frozen-file format's in-memory expansion (``frames_bytes``): what a node decodes a compact shared-tier
object with.  Planes are copied straight into TCHW order, so every test compares against an independent decode
(PyAV's own rgb24 conversion, and the frames written) with ``torch.equal``."""
import io

import av
import numpy as np
import pytest
import torch

from vidcache.errors import FrozenFileError
from vidcache.frozen_file import FORMATS, decode_all, frames_bytes, write_frozen


def frames_of(t, h, w, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (t, 3, h, w), dtype=torch.uint8, generator=g)


def as_tensor(buf, shape):
    return torch.frombuffer(buf, dtype=torch.uint8).reshape(shape)


# Widths that are not a multiple of FFmpeg's row alignment, so planes carry padding (line_size > width).
@pytest.mark.parametrize("h,w", [(28, 28), (56, 84), (30, 398), (252, 420)])
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_frames_bytes_equals_the_frames_written(tmp_path, fmt, h, w):
    want = frames_of(4, h, w, seed=h * w)
    path = tmp_path / ("x" + FORMATS[fmt].suffix)
    write_frozen(want, str(path), fmt)
    got, trailing = frames_bytes(path.read_bytes(), tuple(want.shape))
    assert trailing is None
    assert isinstance(got, np.ndarray) and got.ndim == 1 and got.flags.writeable and got.flags.owndata
    assert torch.equal(as_tensor(got, want.shape), want)
    assert torch.equal(as_tensor(got, want.shape), decode_all(str(path), "pyav")[0])   # PyAV's rgb24 path


def test_frames_bytes_planes_really_are_padded_in_the_padded_case(tmp_path):
    """The point of the odd widths above: the gbrp planes of a 398-wide frame carry row padding."""
    want = frames_of(2, 30, 398)
    path = tmp_path / "x.nut"
    write_frozen(want, str(path), "magicyuv")
    with av.open(str(path)) as c:
        frame = next(c.decode(video=0))
    assert frame.format.name == "gbrp" and frame.planes[0].line_size > 398


@pytest.mark.parametrize("shape,why", [((5, 3, 28, 28), "holds 4 frames, the entry has 5"),
                                       ((4, 3, 28, 56), "a frame of 28x28, not 28x56")])
def test_frames_bytes_refuses_a_file_of_another_shape(tmp_path, shape, why):
    path = tmp_path / "x.nut"
    write_frozen(frames_of(4, 28, 28), str(path), "magicyuv")
    with pytest.raises(FrozenFileError, match=why):
        frames_bytes(path.read_bytes(), shape)


def test_frames_bytes_refuses_bytes_that_are_no_video():
    with pytest.raises(FrozenFileError, match="does not decode"):
        frames_bytes(b"\x00" * 4096, (1, 3, 28, 28))


def test_frames_past_the_entrys_are_reported_not_refused(tmp_path):
    """A file of 4 frames read as an entry of 3: the 3 are whole (the digest decides whether they are the entry's);
    the fourth is damage beyond the last frame, reported."""
    want = frames_of(4, 28, 28)
    path = tmp_path / "x.nut"
    write_frozen(want, str(path), "magicyuv")
    got, trailing = frames_bytes(path.read_bytes(), (3, 3, 28, 28))
    assert torch.equal(as_tensor(got, (3, 3, 28, 28)), want[:3])
    assert trailing is not None and "more than the entry's 3 frames" in trailing


@pytest.mark.parametrize("tail", [b"\0", b"\0" * 7, b"\0" * 100, b"\0" * 4096, "random"])
def test_bytes_appended_after_the_last_frame_spare_every_frame(tmp_path, tail):
    """D55: PyAV decodes all T frames of an object with bytes appended, then raises on the appended bytes; that
    error turned a file holding every frame exactly into "does not decode"."""
    if tail == "random":
        tail = np.random.default_rng(55).integers(0, 256, 1024, dtype=np.uint8).tobytes()
    want = frames_of(4, 56, 84, seed=5)
    path = tmp_path / "x.nut"
    write_frozen(want, str(path), "magicyuv")
    got, trailing = frames_bytes(path.read_bytes() + tail, tuple(want.shape))
    assert torch.equal(as_tensor(got, want.shape), want)
