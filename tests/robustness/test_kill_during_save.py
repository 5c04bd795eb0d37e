"""kill -9 while the engine writes its files (the app-side test, the SQLite chat store, is the
app's): a process is killed at random moments while it saves the quantized-weight cache or a
KV cache file (engine.arrayfile, used for saved sessions). Afterwards the file under the real
name is either the previous one or the complete new one, never a torn file; loading works;
and leftovers of the interrupted write are cleaned up later."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from merlin.engine import weight_cache
from merlin.engine.checkpoint import Checkpoint
from merlin.engine.config import load_config
from merlin.engine.kv_cache import KVCache

KILLS = 10  # per kind of file

# The child slows every write down a little (so a kill lands inside the write, not before or
# after it) and says when writing starts.
SLOW_WRITES = textwrap.dedent(
    """
    import builtins, sys, time
    import merlin.engine.{module} as target
    real_open = builtins.open

    class Slow:
        def __init__(self, f):
            self.f = f
        def write(self, b):
            time.sleep(0.002)
            return self.f.write(b)
        def __getattr__(self, name):
            return getattr(self.f, name)
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

    def slow_open(file, mode="r", *a, **k):
        f = real_open(file, mode, *a, **k)
        if "w" in mode:
            print("WRITING", flush=True)
            return Slow(f)
        return f

    target.open = slow_open
    """
)


def run_and_kill(script: str, env: dict, seed: int, max_delay: float) -> bool:
    """Start `script`, kill -9 it a random moment after it starts writing. True if killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    try:
        line = proc.stdout.readline()
        if line.strip() != "WRITING":
            proc.wait(60)
            raise AssertionError(f"child did not start writing: {line!r} {proc.stderr.read()}")
        time.sleep(random.Random(seed).uniform(0, max_delay))
        proc.send_signal(signal.SIGKILL)
        return proc.wait(60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("seed", range(KILLS))
def test_kill_while_saving_the_weight_cache(demo_dir, tmp_path, seed):
    folder = tmp_path / "cache"
    cfg = load_config(demo_dir)
    with Checkpoint(demo_dir) as ckpt:
        key = weight_cache.cache_key(ckpt, cfg, "q8")
    script = SLOW_WRITES.format(module="checkpoint") + textwrap.dedent(
        f"""
        from merlin.engine.model import load_model
        load_model({str(demo_dir)!r}, weights="q8")
        print("DONE", flush=True)
        """
    )
    run_and_kill(script, {"MERLIN_WEIGHT_CACHE": str(folder)}, seed, max_delay=0.15)
    final = folder / f"{key}.safetensors"
    if final.exists():  # the rename happened: the file is complete and valid
        os.environ["MERLIN_WEIGHT_CACHE"], old = str(folder), os.environ["MERLIN_WEIGHT_CACHE"]
        try:
            assert weight_cache.load(key, cfg) is not None
        finally:
            os.environ["MERLIN_WEIGHT_CACHE"] = old
    # A torn .part (each writer has its own: checkpoint.part_path) is left behind by a killed
    # write, so evict() removes stale ones.
    parts = list(folder.glob(f"{key}.safetensors*.part"))
    assert len(parts) <= 1, parts
    stale = folder / ("f" * 24 + ".safetensors.1-1.part")
    if parts:
        parts[0].rename(stale)
    else:
        stale.write_bytes(b"torn")
    old_time = time.time() - 2 * weight_cache.STALE_PART_SECONDS
    os.utime(stale, (old_time, old_time))
    env = {"MERLIN_WEIGHT_CACHE": str(folder)}
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "from merlin.engine.model import load_model\n"
            f"m = load_model({str(demo_dir)!r}, weights='q8')\n"
            "from merlin.engine import weight_cache\n"
            f"weight_cache.evict(weight_cache.cache_dir(), 10**12)\n",
        ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert check.returncode == 0, check.stderr
    assert final.exists() and not stale.exists()
    assert not list(folder.glob("*.part"))  # the check's own write renamed its part


def _kv_cache(n: int, value: float) -> KVCache:
    cache = KVCache(2, 2, 8, 64)
    cache.reserve(n)
    cache.k[...] = value
    cache.v[:, :, :n] = value
    cache.length = n
    return cache


@pytest.mark.parametrize("seed", range(KILLS))
def test_kill_while_saving_a_kv_cache_file(tmp_path, seed):
    path = tmp_path / "chat.kv"
    _kv_cache(10, 1.0).save(path, {"version": "old"})
    script = SLOW_WRITES.format(module="arrayfile") + textwrap.dedent(
        f"""
        import numpy as np
        from merlin.engine.kv_cache import KVCache
        cache = KVCache(2, 2, 8, 64)
        cache.reserve(50)
        cache.k[...] = 2.0
        cache.v[:, :, :50] = 2.0
        cache.length = 50
        specs = cache.array_specs()
        # many small chunks: the kill lands between writes
        for s in specs:
            full = s.chunks
            s.chunks = lambda full=full: (c[..., i : i + 1] if c.ndim else c
                                          for c in full() for i in range(c.shape[-1]))
        from merlin.engine import arrayfile
        arrayfile.write({str(path)!r}, "merlin-kv", {{"kv": cache.describe(), "version": "new"}},
                        specs)
        print("DONE", flush=True)
        """
    )
    run_and_kill(script, {}, seed, max_delay=0.4)
    cache, meta = KVCache.load(path)  # never torn: the old file or the new one, complete
    if meta["version"] == "old":
        assert cache.length == 10 and np.all(cache.keys() == 1.0)
    else:
        assert cache.length == 50 and np.all(cache.v[:, :, :50] == 2.0)
