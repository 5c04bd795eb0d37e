"""Kernel warm-up: compile every Numba kernel variant that chosen settings use, ahead of time.

Numba compiles a kernel the first time it runs with a new combination of argument types and
keeps the machine code in its on-disk cache (engine/kernels/__init__.py puts that cache in an
app-owned folder versioned by Merlin's version). A visitor should never wait for that, so
`merlin --warmup` (and `merlin-cli warmup`, and the app before its first load) runs tiny
forwards on the small demo checkpoint, which has the real structure and so goes through the
same code with the same argument types as a real model:

- per weights format (f32, q8, q4): the small-N kernels (decode, speculative verify) and the
  prefill path (a prompt longer than linear.SMALL_N rows); for q8/q4 twice, once on freshly
  converted weights and once on weights mapped read-only from the converted-weight disk cache,
  because Numba types a read-only array differently (a second start would compile again);
- per KV format (f32, q8): attention over the cache and the KV quantizer;
- the vision encoder (image prompt) and the sampler (greedy, and temperature/top-k/top-p).

Which CPU the cache belongs to: Numba keys every cached entry by the function's bytecode, its
argument types and the target machine (LLVM triple, host CPU name and CPU features; numba/core/
caching.py `_index_key`, codegen `magic_tuple`). Two different CPUs sharing a home folder keep
separate entries side by side in the same index and never load each other's code. The warm-up
stamps below also include the CPU name, so a warm-up on one machine does not mark another warm.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .formats import DEFAULT_KV, DEFAULT_WEIGHTS, KV_FORMATS, WEIGHT_CHOICES

KV_CHOICES = KV_FORMATS
ENV_STAMPS = "MERLIN_KERNEL_STAMPS"
# the folder a child warm-up makes its private weight cache in (warm_up_in_child's, which
# removes it even when it has to kill the child)
SCRATCH_ENV = "MERLIN_WARMUP_SCRATCH"

Progress = Callable[[float, str], None]


@dataclass
class Step:
    label: str
    run: Callable[[], None]
    weight: float = 1.0  # relative duration, for the progress fraction
    always: bool = False  # run even when an earlier step failed or was interrupted (cleanup)


class WarmupCancelled(Exception):
    pass


def parse_formats(text: str | None, choices: tuple[str, ...], default: str) -> tuple[str, ...]:
    """'q8,q4' / 'all' / None -> a tuple of formats in canonical order."""
    from .errors import InputError

    if not text:
        return (default,)
    if text.strip().lower() == "all":
        return tuple(c for c in choices if c != "auto")  # the formats themselves
    wanted = {t.strip().lower() for t in text.split(",") if t.strip()}
    bad = sorted(wanted - set(choices))
    if bad or not wanted:
        raise InputError(
            f"unknown format {', '.join(bad) or repr(text)}; choose from {', '.join(choices)} "
            "or all (several: comma-separated)."
        )
    return tuple(c for c in choices if c in wanted)


# ---------------------------------------------------------------------------- the steps


def plan(
    weights: tuple[str, ...] = (DEFAULT_WEIGHTS,),
    kv: tuple[str, ...] = (DEFAULT_KV,),
    vision: bool = True,
    model_dir: str | Path | None = None,
) -> list[Step]:
    """The warm-up steps for these formats (built lazily: nothing runs until a step does)."""
    state: dict = {}
    steps: list[Step] = []

    def demo_dir() -> Path:
        if "dir" not in state:
            if model_dir is not None:
                state["dir"] = Path(model_dir)
            else:
                from .demo import ensure_demo_checkpoint

                state["dir"] = ensure_demo_checkpoint()
        return state["dir"]

    def load(fmt: str, from_cache: bool) -> None:
        from .model import load_model

        # a private converted-weight cache: the first load converts (writable arrays), the
        # second maps the file it wrote (read-only arrays), whatever the user's cache holds
        if "weights_dir" not in state:  # inside the parent's folder when run in a child
            scratch = os.environ.get(SCRATCH_ENV) or None
            state["weights_dir"] = tempfile.mkdtemp(prefix="merlin-warmup-", dir=scratch)
        folder = state["weights_dir"]
        old = os.environ.get("MERLIN_WEIGHT_CACHE")
        os.environ["MERLIN_WEIGHT_CACHE"] = folder
        try:
            state["model"] = load_model(demo_dir(), weights=fmt, kv=kv[0])
        finally:
            if old is None:
                os.environ.pop("MERLIN_WEIGHT_CACHE", None)
            else:
                os.environ["MERLIN_WEIGHT_CACHE"] = old
        state["from_cache"] = from_cache

    def ask(kv_fmt: str, image: bool, sampled: bool = False) -> None:
        run_question(state["model"], kv_fmt, image=image and vision, sampled=sampled)

    for w in weights:
        steps.append(Step(f"{w} weights: loading the demo checkpoint", lambda w=w: load(w, False)))
        for i, k in enumerate(kv):
            what = (
                "image question (vision, prefill, decode, verify)"
                if vision and i == 0
                else ("question (prefill, decode, verify)")
            )
            steps.append(
                Step(
                    f"{w} weights, {k} KV: {what}",
                    lambda k=k, i=i: ask(k, image=(i == 0)),
                    weight=4.0,
                )
            )
        if w != "f32":
            steps.append(
                Step(
                    f"{w} weights from the disk cache (read-only): loading",
                    lambda w=w: load(w, True),
                )
            )
            steps.append(
                Step(
                    f"{w} weights from the disk cache: question (prefill, decode, verify)",
                    lambda: ask(kv[0], image=False),
                    weight=3.0,
                )
            )
    steps.append(
        Step("sampling (temperature, top-k, top-p)", lambda: ask(kv[0], False, sampled=True))
    )
    steps.append(Step("cleaning up", lambda: _cleanup(state), weight=0.1, always=True))
    return steps


def _cleanup(state: dict) -> None:
    import shutil

    state.pop("model", None)
    folder = state.pop("weights_dir", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


QUESTION = (
    "Describe this picture in a few short words, then repeat the words once more, "
    "and say how many colours you can see in it."
)


def run_question(model, kv_fmt: str, image: bool, sampled: bool = False) -> None:
    """One short generation: a prompt longer than the small-N limit (prefill path), a few
    decode steps and speculative verifies (spec on), in the given KV format."""
    from dataclasses import replace

    from .generate import AnswerOptions, generate
    from .linear import SMALL_N
    from .prompt import build_prompt, text_prompt
    from .sampling import SamplingParams

    model = replace(model, kv_fmt=kv_fmt)
    images = []
    if image and model.vision is not None and model.vision.available:
        from PIL import Image

        from .vision import prepare_pil

        pre = model.vision.preprocess
        cfg = pre.with_max_pixels(pre.factor**2 * 4)
        picture = Image.new("RGB", (64, 64), (120, 140, 160))
        images = [prepare_pil(picture, cfg, "warm-up")]
    prompt = build_prompt(model.tokenizer, model.config, QUESTION, images)
    assert len(prompt.ids) > SMALL_N, "the warm-up prompt must take the prefill path"
    sampling = (
        SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.02, repetition_penalty=1.1,
                       seed=0)
        if sampled
        else SamplingParams(temperature=0.0)
    )  # fmt: skip
    options = AnswerOptions(
        sampling, max_new_tokens=6, ignore_eos=True, spec="off" if sampled else "on", spec_k=4
    )
    for _ in generate(model, prompt, options, max_context=len(prompt.ids) + 16):
        pass
    if not sampled:
        # a one-token forward and a K+1-token verify on an image-free context (text positions)
        ids = model.tokenizer.encode_text("a a a a a a a a")
        options = AnswerOptions(sampling, max_new_tokens=4, ignore_eos=True, spec="on", spec_k=3)
        for _ in generate(model, text_prompt(ids), options, max_context=32):
            pass


def warm_up(
    weights: tuple[str, ...] = (DEFAULT_WEIGHTS,),
    kv: tuple[str, ...] = (DEFAULT_KV,),
    vision: bool = True,
    progress: Progress | None = None,
    model_dir: str | Path | None = None,
    stamp: bool = True,
) -> list[tuple[str, float]]:
    """Run the warm-up steps in this process; progress(fraction, label) before each step and
    progress(1.0, "done") at the end. Returns (label, seconds) per step. Marks each
    (weights, kv) pair warm (see is_warm) unless stamp is False."""
    steps = plan(weights, kv, vision, model_dir)
    total = sum(s.weight for s in steps)
    done = 0.0
    timings = []
    finished = False
    try:
        for step in steps:
            if progress:
                progress(done / total, step.label)
            t0 = time.perf_counter()
            step.run()
            timings.append((step.label, time.perf_counter() - t0))
            done += step.weight
        finished = True
    finally:
        if not finished:  # interrupted or failed: the private weight cache goes all the same
            for step in steps:
                if step.always:
                    step.run()
    if stamp and model_dir is None and vision:  # (the app needs the vision kernels too)
        for w in weights:
            for k in kv:
                mark_warm(w, k)
    if progress:
        progress(1.0, "done")
    return timings


# ---------------------------------------------------------------------------- stamps


def stamp_dir() -> Path:
    override = os.environ.get(ENV_STAMPS)
    if override:
        return Path(override)
    from . import kernels  # noqa: F401  (sets NUMBA_CACHE_DIR)

    return Path(os.environ["NUMBA_CACHE_DIR"]) / "warm"


def cpu_name() -> str:
    try:
        from llvmlite import binding as llvm

        return llvm.get_host_cpu_name()
    except Exception:
        import platform

        return platform.machine()


def stamp_path(weights: str, kv: str) -> Path:
    """A file that exists once the kernels for (weights, kv) were compiled on this CPU from
    this engine source; its name changes whenever an engine source file, Numba, Python or the
    CPU changes (the Numba cache itself is versioned by folder and keyed by CPU)."""
    import numba  # the engine imports it anyway (cheaper than importlib.metadata)

    numba_version = numba.__version__
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    h.update(
        f"{sys.version}|{numba_version}|{cpu_name()}|{os.environ.get('NUMBA_CACHE_DIR')}".encode()
    )
    for dirpath, _dirs, files in sorted(os.walk(root)):
        for name in sorted(files):
            if name.endswith(".py"):
                st = os.stat(os.path.join(dirpath, name))
                h.update(f"{dirpath}/{name}|{st.st_mtime_ns}|{st.st_size}".encode())
    return stamp_dir() / f"{h.hexdigest()[:20]}-{weights}-{kv}"


def is_warm(weights: str, kv: str) -> bool:
    try:
        return stamp_path(weights, kv).exists()
    except OSError:
        return False


def mark_warm(weights: str, kv: str) -> None:
    try:
        path = stamp_path(weights, kv)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError:
        pass  # a read-only cache folder: the next start warms up again (fast: cache hits)


# ---------------------------------------------------------------------------- in a child


def child_command(weights: str, kv: str) -> list[str]:
    """The command that warms up in a separate process and prints JSON progress lines: the
    bundle's own executable (`merlin --warmup`) when frozen, else this module."""
    args = ["--weights", weights, "--kv", kv, "--json-progress"]
    if getattr(sys, "frozen", False):
        return [sys.executable, "--warmup", *args]
    return [sys.executable, "-m", "merlin.engine.warmup", *args]


def warm_up_in_child(
    weights: str,
    kv: str,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> bool:
    """Warm up (weights, kv) in a child process unless is_warm says it was done, relaying its
    progress. Compiling holds the GIL for up to half a second at a time, which would freeze a
    window; a child does not. Returns True if a child ran and succeeded. Raises
    WarmupCancelled when `cancel` is set; other failures are printed to stderr and otherwise
    ignored (the kernels then compile at first use)."""
    if is_warm(weights, kv):
        return False
    # the child's private weight cache goes in here, removed even when the child is killed
    with (
        tempfile.TemporaryFile() as err,
        tempfile.TemporaryDirectory(prefix="merlin-warmup-") as scratch,
    ):
        proc = subprocess.Popen(
            child_command(weights, kv), stdout=subprocess.PIPE, stderr=err, text=True,
            env={**os.environ, SCRATCH_ENV: scratch},
        )  # fmt: skip
        lines: list[str] = []

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            while proc.poll() is None or reader.is_alive():
                if cancel is not None and cancel.is_set():
                    proc.kill()
                    proc.wait()
                    raise WarmupCancelled
                while lines:
                    _relay(lines.pop(0), progress)
                time.sleep(0.05)  # sleeping releases the GIL: the window stays responsive
            while lines:
                _relay(lines.pop(0), progress)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if proc.returncode != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace")[-2000:]
            print(f"merlin: kernel warm-up in a child process failed:\n{tail}", file=sys.stderr)
            return False
    return True


def _relay(line: str, progress: Progress | None) -> None:
    try:
        msg = json.loads(line)
        fraction, phase = float(msg["progress"]), str(msg["phase"])
    except (ValueError, KeyError, TypeError):
        return
    if progress:
        progress(fraction, phase)


# ---------------------------------------------------------------------------- command line


def add_arguments(p: argparse.ArgumentParser, defaults_from: str = "") -> None:
    """--weights/--kv for a warm-up (used by `merlin-cli warmup` and `merlin --warmup`)."""
    p.add_argument(
        "--weights",
        default=None,
        help="weights formats to compile for: auto, f32, q8, q4, comma-separated, or all "
        f"(default: {defaults_from or DEFAULT_WEIGHTS})",
    )
    p.add_argument(
        "--kv",
        default=None,
        help="KV cache formats: f32, q8, comma-separated, or all "
        f"(default: {defaults_from or DEFAULT_KV})",
    )
    p.add_argument("--no-vision", action="store_true", help="skip the vision encoder kernels")
    p.add_argument("--json-progress", action="store_true", help=argparse.SUPPRESS)


class TerminalProgress:
    """Progress on a terminal: one rewritten line with a bar on a tty, else a line per step."""

    def __init__(self, stream=None, width: int = 24):
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.width = width
        self.t0 = time.perf_counter()

    def __call__(self, fraction: float, phase: str) -> None:
        fill = int(round(fraction * self.width))
        bar = "#" * fill + "-" * (self.width - fill)
        elapsed = time.perf_counter() - self.t0
        text = f"warm-up [{bar}] {fraction * 100:3.0f}%  {elapsed:6.1f} s  {phase}"
        if self.tty:
            self.stream.write("\r\033[K" + text + ("\n" if fraction >= 1.0 else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def run(args, default_weights: str = DEFAULT_WEIGHTS, default_kv: str = DEFAULT_KV) -> int:
    """Warm up as the parsed arguments say; progress on stderr (or JSON lines on stdout)."""
    weights = parse_formats(args.weights, WEIGHT_CHOICES, default_weights)
    kv = parse_formats(args.kv, KV_CHOICES, default_kv)
    if getattr(args, "json_progress", False):

        def progress(fraction: float, phase: str) -> None:
            print(json.dumps({"progress": round(fraction, 4), "phase": phase}), flush=True)

    else:
        progress = TerminalProgress()
        from . import kernels  # noqa: F401

        print(
            f"Compiling Merlin's kernels for weights {','.join(weights)}, KV {','.join(kv)} "
            f"into {os.environ['NUMBA_CACHE_DIR']} (cpu {cpu_name()})",
            file=sys.stderr,
        )
    t0 = time.perf_counter()
    warm_up(weights, kv, vision=not getattr(args, "no_vision", False), progress=progress)
    if not getattr(args, "json_progress", False):
        print(f"Kernels ready in {time.perf_counter() - t0:.1f} s.", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    from .errors import MerlinError

    p = argparse.ArgumentParser(
        prog="python -m merlin.engine.warmup", description="compile Merlin's kernels ahead of time"
    )
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run(args)
    except MerlinError as e:
        print(f"warm-up: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
