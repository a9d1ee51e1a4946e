"""benchmarks/round_trips.py, reduced (20 entries, 5 ms a request): the proxy passes every request on, so each
run it times does its whole job (every entry pulled on its fresh node, every entry verified), and the ratios are
printed.  The figures themselves are the script's (time: never asserted)."""
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..")


def test_round_trips_pulls_and_verifies_every_entry_through_the_delaying_proxy():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "round_trips.py"), "--entries", "20",
                        "--rtt-ms", "5"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert out.count("(pull: 20 pulled, 0 already here, 0 not cached") == 2, out
    assert out.count("(verify: 20 ok, 0 bad)") == 2, out
    assert "pull: one at a time / default" in out and "verify --shared: one at a time / default" in out, out
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
