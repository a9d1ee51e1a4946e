"""Issue 51 item 8: the first run.  README's command 1, less the install, on a fresh directory through the CLI:
after the demo's prewarm the user is told what to do next, with the cache they named."""
from support.cli import run_cli


def test_the_demo_prewarm_says_what_to_do_next(tmp_path):
    run_cli(["demo", "--dir", "demo", "--videos", "2"], cwd=tmp_path, pythonpath=[], check=True, timeout=600)
    r = run_cli(["prewarm", "demo/dataset.jsonl", "--cache", "demo/cache", "--no-progress"], cwd=tmp_path,
                pythonpath=[], timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    nxt = [ln for ln in r.stderr.splitlines() if ln.startswith("prewarm: next: ")]
    assert len(nxt) == 1 and "`vidcache ls --cache demo/cache`" in nxt[0] and "VideoCache('demo/cache')" in nxt[0]
    ls = run_cli(["ls", "--cache", "demo/cache"], cwd=tmp_path, pythonpath=[], check=True)     # the advice works
    assert ls.stdout.splitlines()[-1].split()[0] != "0" and "demo/videos/clip000" in ls.stdout
