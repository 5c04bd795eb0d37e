"""`python -m merlin.engine.bench peer`: llama.cpp side by side with Merlin on the same checkpoint.

1. llama.cpp from PyPI: llama-cpp-python built from source with CMAKE_ARGS=-DGGML_NATIVE=ON (for
   this CPU, as Merlin's kernels are) into a venv of its own under the user cache folder
   (<cache>/merlin/peer/venv, or MERLIN_PEER_DIR/venv), with `gguf`; built once (5-10 minutes
   on 2 cores), reused after while the build arguments are the same (venv/merlin-cmake-args).
   Never a Merlin dependency: Merlin only runs that venv's python. On CPUs with AMX the build
   leaves llama.cpp's AMX backend out (-mno-amx-*): its repacked Q8_0 / Q4_0 weights crash in
   the first llama_decode (docs/benchmarks.md, the `peer` section), and without extra buffer
   types at all llama.cpp would lose its repacked Q4_0 kernels, which would not be a fair
   comparison. The AVX-512 VNNI kernels stay. When Merlin's kernels are built for less than
   this CPU has (NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES= on an AVX-512 host, to see the AVX2
   class's code), llama.cpp is built for the same instruction sets instead (narrow_class,
   CLASS_BUILDS) into a venv of its own (venv-x86-avx2, ...), so the two compare like for like.
2. The checkpoint's text decoder written as GGUF (gguf_export.py, f16) and quantized by
   llama.cpp's own quantizer to Q8_0 and Q4_0 (llama_driver.py quantize), cached beside it.
3. A correctness check first (check_greedy, on the small demo checkpoint, whose f32 GGUF is
   a few MB and written afresh each time): the greedy continuation of a short prompt by
   llama.cpp (f32 GGUF) and by Merlin (f32 weights, f32 KV) must be the same tokens, and the
   prompt's last logits close with the same best tokens (compare_logits), which they are only
   if the conversion (tensor names, RoPE base, norm epsilon, q/k norms, tied embeddings) is
   right. `bench moe` runs the same check on a tiny MoE checkpoint.
4. Timing, `repeats` rounds alternating the two engines, each run in its own process with the
   same thread count: per format (Merlin q8 / llama.cpp Q8_0, Merlin q4 / Q4_0) decode ms/token
   at each context (Merlin's KV cache in q8, filled with random rows; llama.cpp's f16, filled
   by evaluating a prompt of that many tokens) and a prefill of 512 tokens. The figure is the
   median over rounds of llama.cpp's time over Merlin's (> 1: Merlin is faster).

The llama.cpp side runs llama_driver.py and gguf_export.py from this folder by path with the
peer venv's python: they import nothing of Merlin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from .machine import cpuinfo
from .sections import SectionUnavailable

HERE = Path(__file__).resolve().parent
# [server]: llama.cpp's OpenAI server, for tests/app/test_remote_llamacpp.py
PEER_PACKAGES = ("llama-cpp-python[server]", "gguf", "numpy")
BUILD_MINUTES = "5-10 minutes on 2 cores"
CHECK_PROMPT = [3, 17, 42, 99, 250, 7, 512, 1000]
CHECK_TOKENS = 8
CHECK_TOP = 5  # best tokens of the prompt's logits that must agree in order
CHECK_REL_DIFF = 2e-3  # largest logit difference allowed, over the largest |logit|


def peer_dir() -> Path:
    from platformdirs import user_cache_dir

    return Path(os.environ.get("MERLIN_PEER_DIR") or Path(user_cache_dir("merlin")) / "peer")


# llama.cpp built for one of Merlin's narrower x86 classes: those instruction sets, no -march
_AVX2 = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
CLASS_BUILDS = {"x86-avx2": _AVX2, "x86-avxvnni": _AVX2 + " -DGGML_AVX_VNNI=ON"}


def narrow_class(cpu_flags: set[str], class_name: str) -> str | None:
    """Merlin's kernel class when it uses less than this CPU has (a build for another class on
    this host), else None: llama.cpp is then built for that class, not natively."""
    if class_name == "x86-avx2" and cpu_flags & {"avx512f", "avx512_vnni", "avx_vnni"}:
        return class_name
    if class_name == "x86-avxvnni" and "avx512f" in cpu_flags:
        return class_name
    return None


def _kernel_class() -> str:
    from ..kernels.target import TARGET

    return TARGET.name


def venv_dir() -> Path:
    narrow = narrow_class(_cpu_flags(), _kernel_class())
    return peer_dir() / (f"venv-{narrow}" if narrow else "venv")


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def _peer_version(python: Path) -> str | None:
    if not python.exists():
        return None
    done = subprocess.run(
        [str(python), "-c", "import llama_cpp, gguf; print(llama_cpp.__version__)"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() if done.returncode == 0 else None


def cmake_args(cpu_flags: set[str] | None = None, class_name: str | None = None) -> str:
    """llama.cpp's build arguments for this CPU and Merlin's kernel class (module docstring:
    why AMX is left out, when the build is not native)."""
    flags = _cpu_flags() if cpu_flags is None else cpu_flags
    narrow = narrow_class(flags, _kernel_class() if class_name is None else class_name)
    if narrow:
        return CLASS_BUILDS[narrow]
    args = "-DGGML_NATIVE=ON"
    if flags & {"amx_tile", "amx_int8", "amx_bf16"}:
        no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        args += f" -DCMAKE_C_FLAGS='{no_amx}' -DCMAKE_CXX_FLAGS='{no_amx}'"
    return args


def _cpu_flags() -> set[str]:
    return set(cpuinfo("flags", "Features").split())


def ensure_llama_cpp(progress=print) -> str:
    """The peer venv, built if missing or built with other arguments; returns
    llama-cpp-python's version."""
    python = venv_python()
    args = cmake_args()
    venv = venv_dir()
    stamp = venv / "merlin-cmake-args"
    version = _peer_version(python)
    if version and stamp.is_file() and stamp.read_text().strip() == args:
        return version
    if version:
        progress("peer: llama.cpp was built with other arguments; building it again")
        import shutil

        shutil.rmtree(venv)
    root = peer_dir()
    root.mkdir(parents=True, exist_ok=True)
    log = root / ("build.log" if venv.name == "venv" else f"build-{venv.name}.log")
    progress(
        f"peer: building llama.cpp from PyPI (llama-cpp-python, {args}) into "
        f"{venv}; {BUILD_MINUTES}, once (log: {log})"
    )
    env = dict(os.environ, CMAKE_ARGS=args)
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    with open(log, "w", encoding="utf-8") as f:
        steps = [
            [sys.executable, "-m", "venv", str(venv)],
            [str(python), "-m", "pip", "install", "--no-cache-dir", *PEER_PACKAGES],
        ]
        for cmd in steps:
            if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode:
                tail = log.read_text(errors="replace")[-3000:]
                raise SectionUnavailable(
                    f"building llama.cpp failed (needs a C++ compiler and cmake: "
                    f"`apt-get install build-essential cmake`); {log} ends:\n{tail}"
                )
    version = _peer_version(python)
    if not version:
        raise SectionUnavailable(f"llama-cpp-python installed but does not import; see {log}")
    stamp.write_text(args + "\n")
    return version


def peer_environment() -> dict[str, str]:
    """The environment llama.cpp runs in: the user's, without what Merlin set for its own
    kernels (GOMP_SPINCOUNT, NUMBA_CACHE_DIR), so that llama.cpp runs as its users run it."""
    from ..kernels import SET_ENVIRONMENT

    return {k: v for k, v in os.environ.items() if k not in SET_ENVIRONMENT}


def _run_peer(*args, timeout=7200) -> dict:
    """A command in the peer venv; its last stdout line as JSON."""
    done = subprocess.run(
        [str(venv_python()), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=peer_environment(),
    )
    if done.returncode:
        raise RuntimeError(f"llama.cpp side failed ({args[0]}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def ensure_ggufs(folder: Path, progress=print, kinds=("q8_0", "q4_0"), out_dir=None):
    """{"f16": path, "q8_0": path, "q4_0": path} of the checkpoint's text decoder, cached in
    out_dir (default <peer dir>/gguf) by the folder's name."""
    out_dir = Path(out_dir) if out_dir else peer_dir() / "gguf"
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"f16": out_dir / f"{folder.name}-f16.gguf"}
    if not paths["f16"].exists():
        progress(f"peer: writing {paths['f16'].name} ...")
        tmp = paths["f16"].with_suffix(".tmp")
        _run_peer(HERE / "gguf_export.py", folder, tmp, "f16")
        os.replace(tmp, paths["f16"])
    for kind in kinds:
        paths[kind] = out_dir / f"{folder.name}-{kind}.gguf"
        if not paths[kind].exists():
            progress(f"peer: quantizing to {kind.upper()} with llama.cpp ...")
            tmp = paths[kind].with_suffix(".tmp")
            _run_peer(HERE / "llama_driver.py", "quantize", paths["f16"], tmp, kind)
            os.replace(tmp, paths[kind])
    return paths


def merlin_greedy(folder: Path, ids: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """Merlin's greedy continuation and the prompt's last logits, f32 weights and f32 KV."""
    from ..model import load_model
    from ..rope import text_positions

    model = load_model(folder, weights="f32", kv="f32")
    cache = model.new_cache(len(ids) + n + 8)
    logits = model.text.forward(np.array(ids), text_positions(0, len(ids)), cache)
    prompt_logits = np.array(logits[-1], np.float64)
    out = []
    for _ in range(n):
        nxt = int(np.argmax(logits[-1]))
        out.append(nxt)
        logits = model.text.forward(np.array([nxt]), text_positions(cache.length, 1), cache)
    return out, prompt_logits


def compare_logits(ours, theirs, top: int = CHECK_TOP) -> dict:
    """How far llama.cpp's logits of the prompt's last token are from Merlin's: the largest
    difference over the largest |logit| (llama.cpp keeps its KV cache in f16, so ~1e-3,
    where a wrong RoPE base, norm or head gives ~1) and whether the `top` best tokens are
    the same in the same order. A trained model can answer a short prompt with one token
    over and over, which equal greedy tokens alone would not tell apart from many bugs."""
    a, b = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    if a.shape != b.shape:
        return {"logits_rel_diff": float("inf"), "top_same": False}
    rel = float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(a))), 1e-30))
    best_a, best_b = (np.argsort(-v, kind="stable")[:top] for v in (a, b))
    return {"logits_rel_diff": rel, "top_same": bool(np.array_equal(best_a, best_b))}


def check_greedy(folder: Path, progress=print, n: int = CHECK_TOKENS) -> dict:
    """Greedy tokens and the prompt's last logits of a small checkpoint (a few MB): llama.cpp
    on its f32 GGUF, written afresh into a temporary folder, against Merlin f32 weights / f32
    KV. Same only if the tokens are equal, the CHECK_TOP best tokens of the logits are in the
    same order and the logits differ by at most CHECK_REL_DIFF of their largest."""
    import tempfile

    folder = Path(folder)
    progress(f"peer: greedy tokens of {folder.name}, llama.cpp f32 vs Merlin f32 ...")
    with tempfile.TemporaryDirectory(prefix="merlin-peer-check-") as tmp:
        path = Path(tmp) / f"{folder.name}-f32.gguf"
        _run_peer(HERE / "gguf_export.py", folder, path, "f32")
        theirs = _run_peer(HERE / "llama_driver.py", "greedy", path, n, *CHECK_PROMPT)
    ours, our_logits = merlin_greedy(folder, CHECK_PROMPT, n)
    logits = compare_logits(our_logits, theirs["prompt_logits"])
    same = (
        ours == theirs["tokens"]
        and logits["top_same"]
        and logits["logits_rel_diff"] <= CHECK_REL_DIFF
    )
    return {"checkpoint": folder.name, "prompt": CHECK_PROMPT, "merlin": ours,
            "llama_cpp": theirs["tokens"], **logits, "same": same}  # fmt: skip


def check_conversion(progress=print) -> dict:
    """check_greedy on the demo checkpoint (the dense qwen3 conversion)."""
    from ..demo import ensure_demo_checkpoint

    return check_greedy(ensure_demo_checkpoint(), progress)


def merlin_times(folder: Path, weights: str, contexts, threads: int) -> dict:
    """Merlin's figures in a process of its own (decode.run: q8 KV, prefill of 512)."""
    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads))
    cmd = [sys.executable, "-m", "merlin.engine.bench.peer", "merlin", str(folder), weights]
    done = subprocess.run(cmd + [str(c) for c in contexts], capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"Merlin's side failed ({weights}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def llama_times(path: Path, contexts, threads: int, flash_attn: bool) -> dict:
    args = [HERE / "llama_driver.py", "time", path, "--contexts", *contexts]
    args += ["--threads", threads, "--prefill", 512] + (["--flash-attn"] if flash_attn else [])
    return _run_peer(*args)


PAIRS = (("q8", "q8_0"), ("q4", "q4_0"))


def result_header(version: str, folder: Path, threads: int, contexts, repeats: int) -> dict:
    """What a side-by-side result starts with (this section's and bench moe's)."""
    return {"llama_cpp_python": version, "build": cmake_args(), "merlin_class": _kernel_class(),
            "checkpoint": str(folder), "threads": threads, "contexts": list(contexts),
            "repeats": repeats}  # fmt: skip


def build_label(result: dict) -> str:
    """llama.cpp's version and build, and Merlin's kernel class, for a report's first line."""
    build = result.get("build", "-DGGML_NATIVE=ON").split(" -DCMAKE_")[0]
    merlin = result.get("merlin_class", "?")
    version = result["llama_cpp_python"]
    return f"llama.cpp (llama-cpp-python {version}, {build}) vs Merlin ({merlin})"


def run(folder: Path | None, contexts=(128, 2048), repeats: int = 3, threads: int = 2,
        flash_attn=(True,), check: bool = True, progress=print) -> dict:  # fmt: skip
    from ..demo import QWEN3VL_2B, ensure_random_checkpoint

    version = ensure_llama_cpp(progress)
    folder = Path(folder) if folder else ensure_random_checkpoint(QWEN3VL_2B)
    paths = ensure_ggufs(folder, progress)
    result = result_header(version, folder, threads, contexts, repeats)
    if check:
        result["check"] = check_conversion(progress)
    result["rounds"] = time_rounds(folder, paths, PAIRS, contexts, repeats, threads, flash_attn,
                                   progress)  # fmt: skip
    result["summary"] = summarize(result)
    return result


def time_rounds(folder, paths, pairs, contexts, repeats, threads, flash_attn, progress):
    """`repeats` rounds, each timing per (Merlin format, llama.cpp GGUF kind) of `pairs`
    Merlin then llama.cpp (once per flash-attention setting), each in its own process."""
    rounds = []
    for r in range(repeats):
        for ours, theirs in pairs:
            progress(f"peer: round {r + 1}/{repeats}, Merlin {ours} ...")
            m = merlin_times(folder, ours, contexts, threads)
            for fa in flash_attn:
                progress(f"peer: round {r + 1}/{repeats}, llama.cpp {theirs.upper()} fa={fa} ...")
                ll = llama_times(paths[theirs], contexts, threads, fa)
                rounds.append({"weights": ours, "flash_attn": fa, "merlin": m, "llama_cpp": ll})
    return rounds


def summarize(result: dict) -> list[dict]:
    """Per (weights, flash_attn): medians over rounds of each engine's ms and of the ratios."""
    rows = []
    keys = sorted({(r["weights"], r["flash_attn"]) for r in result["rounds"]}, reverse=True)
    for weights, fa in keys:
        rounds = [r for r in result["rounds"] if (r["weights"], r["flash_attn"]) == (weights, fa)]
        for i, ctx in enumerate(result["contexts"]):
            m = [r["merlin"]["decode"][i]["ms_per_token"] for r in rounds]
            ll = [r["llama_cpp"]["decode"][i]["ms_per_token"] for r in rounds]
            rows.append(_row(weights, fa, f"decode @ {ctx}", m, ll))
        m = [r["merlin"]["prefill"]["seconds"] * 1e3 for r in rounds]
        ll = [r["llama_cpp"]["prefill"]["seconds"] * 1e3 for r in rounds]
        rows.append(_row(weights, fa, "prefill 512", m, ll))
    return rows


def _row(weights, fa, what, merlin_ms, llama_ms) -> dict:
    ratios = [b / a for a, b in zip(merlin_ms, llama_ms)]
    return {
        "weights": weights,
        "flash_attn": fa,
        "what": what,
        "merlin_ms": float(np.median(merlin_ms)),
        "llama_cpp_ms": float(np.median(llama_ms)),
        "ratio": float(np.median(ratios)),
        "ratio_range": [float(min(ratios)), float(max(ratios))],
    }


def report(result: dict) -> str:
    lines = [
        f"peer: {build_label(result)}, {result['threads']} threads, medians of "
        f"{result['repeats']} alternating rounds",
    ]
    c = result.get("check")
    if c:
        lines.append(check_line(c))
    return "\n".join(lines + table(result["summary"]))


def check_line(c: dict) -> str:
    verdict = "SAME" if c["same"] else "DIFFERENT"
    logits = ""
    if "logits_rel_diff" in c:
        top = "same" if c["top_same"] else "different"
        diff = c["logits_rel_diff"]
        logits = f"; prompt logits: top {CHECK_TOP} {top}, largest difference {diff:.1e} of max"
    return (
        f"conversion check ({c.get('checkpoint', 'demo checkpoint')}, f32, greedy "
        f"{len(c['merlin'])} tokens): {verdict} (Merlin {c['merlin']}, llama.cpp {c['llama_cpp']}"
        f"{logits})"
    )


def table(summary: list[dict]) -> list[str]:
    """The summary rows as lines: each engine's median ms and llama.cpp over Merlin."""
    lines = [
        f"{'weights':<8}{'fa':<4}{'':<15}{'Merlin ms':>10}{'llama.cpp ms':>13}"
        f"{'llama/Merlin':>13}  range"
    ]
    for r in summary:
        w = f"{r['weights']}/{r['weights'].upper()}_0"
        lines.append(
            f"{w:<8}{'on' if r['flash_attn'] else 'off':<4}{r['what']:<15}{r['merlin_ms']:>10.1f}"
            f"{r['llama_cpp_ms']:>13.1f}{r['ratio']:>13.2f}  "
            f"{r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}"
        )
    lines.append("ratio > 1: Merlin takes less time (decode: ms per token; prefill: the whole 512)")
    return lines


def add_arguments(p) -> None:
    from .sections import choice_list

    p.add_argument(
        "--flash-attn",
        type=choice_list("on", "off"),
        default="on",
        help="peer, moe: llama.cpp's flash attention: on, off or on,off (both timed)",
    )
    p.add_argument("--no-check", action="store_true", help="peer, moe: skip the greedy-token check")


def section(args) -> dict:
    fa = tuple({"on": True, "off": False}[v] for v in args.flash_attn.split(","))
    repeats = args.repeats if args.repeats is not None else 3
    result = run(
        args.model,
        tuple(args.contexts),
        repeats,
        args.threads or 2,
        fa,
        not args.no_check,
        progress=lambda m: print(m, file=sys.stderr),
    )
    print(report(result))
    return result


def _merlin_child(folder: str, weights: str, contexts: list[str]) -> int:
    from . import decode

    result = decode.run(folder, weights, "q8", contexts=tuple(int(c) for c in contexts),
                        with_prefill=True, with_verify=False)  # fmt: skip
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "merlin":
        sys.exit(_merlin_child(sys.argv[2], sys.argv[3], sys.argv[4:]))
    sys.exit("usage: python -m merlin.engine.bench peer (this module's entry is internal)")
