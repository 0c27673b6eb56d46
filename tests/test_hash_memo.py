"""The weights-hash memo (kvbench.engine.weights.file_hash) is shared by every run on a
machine: runs side by side (an audit beside another, sharded workers) must not trip
over each other's writes of it, and a memo that cannot be written costs a re-hash only."""

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from kvbench.engine.weights import file_hash

WORKER = """
import sys
import tempfile
from pathlib import Path
from kvbench.engine.weights import file_hash
paths = [Path(p) for p in sys.argv[1:]]
for i in range(40):
    for p in paths:
        p.touch()  # a new mtime: a new memo key, so every call rewrites the memo
        file_hash([p])
"""


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def test_side_by_side_runs_share_the_memo(tmp_path):
    env = {**os.environ, "KVBENCH_CACHE_DIR": str(tmp_path / "cache")}
    files = []
    for i in range(8):
        f = tmp_path / f"w{i}.bin"
        f.write_bytes(os.urandom(1000 + i))
        files.append(f)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(files[2 * i]), str(files[2 * i + 1])],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(errors)[-2000:]
    assert not list((tmp_path / "cache").glob(".hashes-*")), "temp files left behind"


def test_unwritable_memo_still_hashes(tmp_path, monkeypatch):
    """A memo write that fails (full disk, read-only cache) still returns the digest."""
    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "w.bin"
    f.write_bytes(os.urandom(4096))

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tempfile, "mkstemp", no_space)
    assert file_hash([f]) == digest(f)
    assert not (tmp_path / "cache" / "hashes.json").exists()
    monkeypatch.undo()
    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path / "cache"))
    assert file_hash([f]) == digest(f)  # writable again: memoised
    assert (tmp_path / "cache" / "hashes.json").exists()
