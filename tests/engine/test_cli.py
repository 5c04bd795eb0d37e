"""merlin-cli end to end on the demo checkpoint, in a subprocess like a user runs it: streaming,
--json events, logits, info, and one clear line plus a non-zero exit for every bad input."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from support import assert_user_error, run_cli


def test_generate_json_stream(demo_dir):
    r = run_cli(
        "generate",
        "--model",
        str(demo_dir),
        "--max-new-tokens",
        "12",
        "--temperature",
        "0",
        "--ignore-eos",
        "--json",
        "Describe a cat.",
    )
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert events[0]["event"] == "prefill" and events[0]["n_tokens"] > 5
    tokens = [e for e in events if e["event"] == "tokens" and e["ids"]]
    assert len(tokens) == 12
    for e in tokens:
        p = e["profile"]
        assert p["gemm_ms"] > 0 and p["total_ms"] >= p["gemm_ms"] + p["attn_ms"] - 1e-6
    last = events[-1]
    assert last["event"] == "finished" and last["reason"] == "max_tokens"
    assert last["token_ids"] == [i for e in tokens for i in e["ids"]]
    assert last["text"] == "".join(e["text"] for e in events if e["event"] == "tokens")


def test_greedy_is_deterministic_and_text_streams(demo_dir):
    args = (
        "generate",
        "--model",
        str(demo_dir),
        "--max-new-tokens",
        "8",
        "--temperature",
        "0",
        "--ignore-eos",
        "你好，世界",
    )
    a, b = run_cli(*args), run_cli(*args)
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout and a.stdout.strip()


def test_seeded_sampling_repeats(demo_dir):
    args = (
        "generate",
        "--model",
        str(demo_dir),
        "--max-new-tokens",
        "10",
        "--seed",
        "5",
        "--temperature",
        "1.0",
        "--top-k",
        "50",
        "--top-p",
        "0.95",
        "--ignore-eos",
        "--json",
        "hi",
    )
    a, b = run_cli(*args), run_cli(*args)
    ids = [json.loads(x.stdout.splitlines()[-1])["token_ids"] for x in (a, b)]
    assert ids[0] == ids[1] and len(ids[0]) == 10


def test_logits_shape_matches_prompt(demo_dir, tmp_path, demo_model):
    from merlin.engine.prompt import chat_prompt_ids

    out = tmp_path / "l.npy"
    r = run_cli("logits", "--model", str(demo_dir), "--out", str(out), "What is this?")
    assert r.returncode == 0, r.stderr
    logits = np.load(out)
    n = len(chat_prompt_ids(demo_model.tokenizer, "What is this?"))
    assert logits.shape == (n, demo_model.config.text.vocab_size)
    assert logits.dtype == np.float32 and np.isfinite(logits).all()


def test_logits_go_to_the_file_named_and_a_folder_is_refused(demo_dir, tmp_path):
    """np.save had added ".npy" to a name without it (the message named a file never
    written) and turned a folder's name into FOLDER.npy beside it, exit 0."""
    out = tmp_path / "run1"
    r = run_cli("logits", "--model", str(demo_dir), "--out", str(out), "hi")
    assert r.returncode == 0 and str(out) in r.stderr, r.stderr
    assert np.load(out).ndim == 2 and not (tmp_path / "run1.npy").exists()
    folder = tmp_path / "results"
    folder.mkdir()
    r = run_cli("logits", "--model", str(demo_dir), "--out", str(folder), "hi")
    assert_user_error(r, "is a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results", "run1"]
    r = run_cli("logits", "--model", str(demo_dir), "--out", "/dev/null", "hi")
    assert_user_error(r, "not a regular file")


def test_info(demo_dir):
    r = run_cli("info", "--model", str(demo_dir), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["layers"] == 4
    read = info["weight_bytes_per_token"]
    assert 0 < read["q4"] < read["q8"] < read["f32"] / 3
    assert info["kv_bytes_per_token"]["q8"] * 3.5 < info["kv_bytes_per_token"]["f32"]
    r = run_cli("info", "--model", str(demo_dir), "--weights", "q8", "--kv", "f32")
    assert f"{read['q8'] / 1e6:,.1f} MB of q8 weights" in r.stdout, r.stdout


def test_a_terminal_that_cannot_show_a_character_gets_a_question_mark(demo_dir, tmp_path):
    """A Latin-1 (or LANG=C) stdout: the characters it cannot encode become "?" instead of
    a UnicodeEncodeError traceback that ended the answer."""
    folder = tmp_path / "模型"
    folder.symlink_to(demo_dir)
    r = run_cli("info", "--model", str(folder), env_extra={"PYTHONIOENCODING": "latin-1"})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "??" in r.stdout and "模型" not in r.stdout


def test_default_model_is_demo(tmp_path):
    import merlin.engine.kernels  # noqa: F401  (sets NUMBA_CACHE_DIR: reuse the warmed kernel cache)

    env = {"XDG_CACHE_HOME": str(tmp_path), "NUMBA_CACHE_DIR": os.environ["NUMBA_CACHE_DIR"]}
    r = run_cli("generate", "--max-new-tokens", "60", "Hello!", env_extra=env)
    assert r.returncode == 0, r.stderr
    # the shipped demo model, trained to say what it is to anything but a picture of shapes
    from merlin.engine.demo_scenes import TEXT_ONLY_ANSWER

    assert r.stdout.strip() == TEXT_ONLY_ANSWER["en"]
    assert not (tmp_path / "merlin" / "checkpoints").exists()  # nothing was built


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["generate", "--model", "/nonexistent/folder", "hi"], ["no such folder"]),
        (["generate", "--weights", "f7", "hi"], ["unknown weights format"]),
        (["generate", "   "], ["empty"]),
        (["generate", "--max-new-tokens", "0", "hi"], ["max-new-tokens"]),
        (["generate", "--temperature", "-1", "hi"], ["temperature"]),
        (["generate", "--max-context", "8", "hello " * 20], ["context"]),
        # an unset shell variable had run the demo model; info had printed a traceback
        (["generate", "--model", "", "hi"], ["--model is empty"]),
        (["info", "--weights", "bogus"], ["unknown weights format"]),
        (["info", "--kv", "bogus"], ["unknown KV cache format"]),
        # tracebacks until session 35: a user that does not exist, a name too long
        (["info", "--model", "~no-such-user-merlin/m"], ["no such folder"]),
        (["info", "--model", "m" * 300], ["cannot be opened (File name too long)"]),
        (["generate", "--image", "~no-such-user-merlin/x.png", "hi"], ["no such file"]),
        (["logits", "hi", "--out", "o" * 300], ["File name too long"]),
    ],
)
def test_bad_input_gives_clear_error(demo_dir, args, fragments):
    if "--model" not in args:
        args = [args[0], "--model", str(demo_dir), *args[1:]]
    assert_user_error(run_cli(*args), *fragments)


def test_folder_without_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    assert_user_error(run_cli("info", "--model", str(tmp_path)), "not supported")


def test_q8_kv_and_profile_lines(demo_dir):
    r = run_cli(
        "generate",
        "--model",
        str(demo_dir),
        "--kv",
        "q8",
        "--profile",
        "--ignore-eos",
        "--max-new-tokens",
        "4",
        "--temperature",
        "0",
        "hello",
    )
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("step")]
    assert len(lines) == 4
    assert all("gemm" in x and "attn" in x and "GB/s" in x for x in lines)


def test_unknown_kv_format(demo_dir):
    assert_user_error(
        run_cli("generate", "--model", str(demo_dir), "--kv", "q3", "hi"), "unknown KV cache format"
    )


def test_a_small_forward_runs_on_one_kernel_thread(demo_dir, monkeypatch):
    """Decode and verify steps of a tiny model (the demo's 1.6 MB a token) run their kernels
    on the calling thread alone, a long prefill on the pool; the count comes back after."""
    import numba

    from merlin.engine import text
    from merlin.engine.model import load_model
    from merlin.engine.rope import text_positions

    seen = []
    real = text.TextModel._forward

    def spy(self, *args, **kwargs):
        seen.append(numba.get_num_threads())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(text.TextModel, "_forward", spy)
    pool = numba.get_num_threads()
    model = load_model(demo_dir, weights="q4").text
    rows = text.SERIAL_WORK_BYTES // model.w.bytes_per_token + 1  # the pool's work
    assert 4 < rows < 1000
    cache = model.new_cache(rows + 8)
    ids = np.zeros(rows, np.int64)
    model.forward(ids[:4], text_positions(0, 4), cache)
    model.forward(ids, text_positions(4, rows), cache)
    assert seen == [1, pool] and numba.get_num_threads() == pool


def test_without_max_context_the_cache_holds_the_default_context(demo_dir, tmp_path):
    """A config with Qwen3-VL's 262,144 positions: generate, chat and a library Session had
    sized their KV cache for all of them (15 GB of q8 KV for the 2B; 1.2 GB RSS for a tiny
    model), while `info` and the load-time guard count 8,192 (memory.DEFAULT_CONTEXT)."""
    import shutil

    from merlin.engine import generate as gen
    from merlin.engine.memory import DEFAULT_CONTEXT
    from merlin.engine.model import load_model
    from merlin.engine.prompt import build_prompt
    from merlin.engine.session import Session

    folder = tmp_path / "long"
    shutil.copytree(demo_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["max_position_embeddings"] = 262_144
    (folder / "config.json").write_text(json.dumps(config))
    model = load_model(folder, weights="f32")
    assert model.max_context == 262_144 and model.default_context == DEFAULT_CONTEXT
    assert model.new_cache().max_tokens == DEFAULT_CONTEXT
    assert Session(model).cache.max_tokens == DEFAULT_CONTEXT
    sizes = []
    real = model.new_cache
    model.new_cache = lambda n=None: sizes.append(n) or real(n)
    built = build_prompt(model.tokenizer, model.config, "hi")
    for _ in gen.generate(model, built, gen.AnswerOptions(max_new_tokens=1)):
        pass
    assert sizes == [DEFAULT_CONTEXT]
    assert model.new_cache(100_000).max_tokens == 100_000  # asked for: as asked


TERMINATED_DURING_A_SAVE = """
import os, signal, sys
import numpy as np
from merlin.engine import arrayfile, cli, cli_checks

def chunks():
    yield np.zeros(1000, np.float32)
    os.kill(os.getpid(), signal.SIGTERM)  # while the temporary is half written
    yield np.zeros(1000, np.float32)

def save(args):
    spec = arrayfile.ArraySpec("a", np.float32, (2000,), chunks)
    arrayfile.write(sys.argv[1], "test", {}, [spec])

class Args:
    func = staticmethod(save)

cli.build_parser = lambda: type("Parser", (), {"parse_args": lambda self, argv: Args()})()
cli_checks.check_args = lambda args: None
cli.main([])
"""


def test_sigterm_during_a_save_leaves_no_temporary(tmp_path):
    """SIGTERM (a service stopping; SIGHUP, a closed terminal) ended the process at once, and
    every `chat --session` interrupted while saving left a hidden temporary of megabytes."""
    script = tmp_path / "save.py"
    script.write_text(TERMINATED_DURING_A_SAVE)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "chat.mss")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 128 + 15, done.stderr
    assert list(tmp_path.iterdir()) == [script]  # neither the file nor a temporary


def test_closed_or_full_output_is_one_line(demo_dir, tmp_path):
    """`>&-`, `<&-` and a full disk (/dev/full) had ended in tracebacks."""
    base = [sys.executable, "-m", "merlin.engine.cli"]
    gen = [*base, "generate", "hi", "--model", str(demo_dir), "--max-new-tokens", "2"]
    closed = subprocess.run(gen, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            timeout=300, close_fds=True, pass_fds=(),
                            preexec_fn=lambda: os.close(1))  # fmt: skip
    assert closed.returncode == 0 and "Traceback" not in closed.stderr, closed.stderr
    chat = subprocess.run([*base, "chat", "--model", str(demo_dir)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: os.close(0))  # fmt: skip
    assert chat.returncode == 0 and "Traceback" not in chat.stderr, chat.stderr
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            r = subprocess.run(gen, stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
        assert_user_error(r, "No space left on device")


def test_a_session_name_near_the_file_system_limit_is_saved(tmp_path):
    """The temporary `.NAME.PID.tmp` of a 245-character name went past 255: such a session
    could never be saved."""
    from merlin.engine import arrayfile

    path = tmp_path / ("q" * 245 + ".mss")
    arrayfile.write(path, "test", {}, [arrayfile.array_spec("a", np.zeros(3, np.float32))])
    assert path.is_file() and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_nul_in_an_image_line_is_one_turn_s_error(demo_dir):
    """`/image x<NUL>.png` ended the whole chat with a ValueError traceback."""
    r = subprocess.run(
        [sys.executable, "-m", "merlin.engine.cli", "chat", "--model", str(demo_dir),
         "--max-new-tokens", "2"],
        input="hi\n/image x\0.png\nhi again\n", capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "embedded null byte" in r.stderr and r.stderr.count("prefill") == 1


def test_numba_threads_of_zero_is_one_line(demo_dir):
    """NUMBA_NUM_THREADS=0 made Numba's import raise: a traceback out of every command."""
    r = run_cli("generate", "hi", "--model", str(demo_dir), env_extra={"NUMBA_NUM_THREADS": "0"})
    assert_user_error(r, "NUMBA_NUM_THREADS=0: it must be at least 1")
