"""The example runs and checks itself."""
import pathlib
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "kv_cache.py"


def test_kv_cache_example_runs():
    out = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "kv_cache.py: ok" in out.stdout


def readme_block(after):
    """The first Python block of the README after the text `after`."""
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = readme.index(after)
    block = readme[readme.index("```python\n", start) + len("```python\n") :]
    return block[: block.index("```")]


def test_readme_quick_start_runs():
    code = readme_block("Quick start:")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split() == [str(128 << 20), str(3 << 20), str(64 << 20)]


def test_readme_streams_example_runs():
    code = readme_block("Streams and fences, where the mechanism")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "streams: ok"
