import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))   # the support package (tests/support/): toy_processors, sglang_peer, ...

# scripts/setup_miles.sh checks Miles out here; point the Miles tests at it unless told otherwise.
_MILES = os.path.join(os.path.dirname(__file__), "..", "third_party", "miles")
if "MILES_SRC" not in os.environ and os.path.isfile(os.path.join(_MILES, "miles", "__init__.py")):
    os.environ["MILES_SRC"] = os.path.abspath(_MILES)

from vidcache.testing.videos import make_video, suffix_for  # noqa: E402
from support.net import free_port  # noqa: E402
from support.media import ASPECT_SHAPES, VIDEOS  # noqa: E402



@pytest.fixture(scope="session")
def aspect_clips(tmp_path_factory):
    """(w, h) -> an 8-frame 8 fps h264 clip of that shape, for every ASPECT_SHAPES entry."""
    d = tmp_path_factory.mktemp("aspect")
    return {(w, h): make_video(str(d / f"{w}x{h}.mp4"), codec="h264", width=w, height=h, fps=8, n_frames=8, seed=i)
            for i, (w, h) in enumerate(ASPECT_SHAPES)}


@pytest.fixture(scope="session")
def video_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("videos")


@pytest.fixture(scope="session")
def videos(video_dir):
    """name -> path of generated videos (made once per session)."""
    out = {}
    for name, (codec, w, h, fps, n) in VIDEOS.items():
        out[name] = make_video(str(video_dir / (name + suffix_for(codec))), codec=codec, width=w, height=h,
                               fps=fps, n_frames=n, seed=len(out))
    return out


@pytest.fixture
def cache(tmp_path):
    from vidcache import VideoCache
    c = VideoCache(tmp_path / "cache")
    yield c
    c.close()


class NodeA:
    """Node A of a cluster: its own node directory (``tmp_path/"a"``) and the shared tier it fills
    (``tmp_path/"tier"``), opened as ``cache``; other nodes on the same tier come from ``node``."""

    def __init__(self, tmp_path, request) -> None:
        from vidcache import VideoCache
        self.tmp_path, self._request = tmp_path, request
        self.tier = tmp_path / "tier"
        self.shared = str(self.tier)
        self.cache = VideoCache(tmp_path / "a", shared=self.shared)

    def build(self, *names, options=None) -> list[str]:
        """The keys of ``videos[name]`` for each name, built on node A (so published to the tier)."""
        from vidcache import VideoOptions
        videos = self._request.getfixturevalue("videos")       # made only for a test that builds them
        return [self.cache.ensure(videos[n], options or VideoOptions()).key for n in names]

    def node(self, name: str, **settings):
        """Another node on node A's tier: a fresh directory ``tmp_path/name``."""
        from vidcache import VideoCache
        return VideoCache(self.tmp_path / name, shared=self.shared, **settings)


@pytest.fixture
def node_a(tmp_path, request):
    """A fresh node A and its shared tier (``NodeA``); nothing built yet."""
    return NodeA(tmp_path, request)


@pytest.fixture
def hung_endpoint():
    """``http://127.0.0.1:PORT`` of a server that accepts connections and never answers (as a stopped
    server's kernel does): for bounds on S3 calls and on source fetches alike."""
    import socket
    import threading
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held, stop = [], threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join(5)
    for c in held:
        c.close()
    srv.close()


@pytest.fixture
def count_decodes(monkeypatch):
    """A list that records every decoder open (the entry point of every decode)."""
    import vidcache.loader.build as build
    calls = []
    real = build.open_reader
    monkeypatch.setattr(build, "open_reader", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    return calls


@pytest.fixture
def s3(monkeypatch):
    """An S3 endpoint: moto's server on loopback, with a bucket "cache" (credentials are dummies)."""
    from types import SimpleNamespace

    import boto3
    from moto.server import ThreadedMotoServer
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    srv.start()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    endpoint = f"http://127.0.0.1:{srv._server.server_port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="cache")
    try:
        yield SimpleNamespace(endpoint=endpoint, client=client)
    finally:
        srv.stop()


# --- Miles present but its extra packages missing: fail with the fix, never stop collection ----------------
# Importing a Miles test module would raise ModuleNotFoundError (e.g. pylatexenc) at collection, which stops
# the whole pytest run.  Instead such a module collects as one failing test that prints the one command that
# installs Miles' extras; every other test still runs.
_MILES_TEST_FILES = {"test_miles_integration.py"}       # the modules that import Miles itself


class _MilesNotImportable(pytest.File):
    problem = ""

    def collect(self):
        yield _MilesExtrasInstalled.from_parent(self, name="test_miles_imports")


class _MilesExtrasInstalled(pytest.Item):
    def runtest(self):
        pytest.fail(self.parent.problem, pytrace=False)

    def reportinfo(self):
        return self.path, 0, "Miles imports"


def pytest_pycollect_makemodule(module_path, parent):
    if module_path.name not in _MILES_TEST_FILES:
        return None
    from support.miles_compat import missing_miles_dependency
    problem = missing_miles_dependency(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if problem is None:
        return None
    f = _MilesNotImportable.from_parent(parent, path=module_path)
    f.problem = problem
    return f
