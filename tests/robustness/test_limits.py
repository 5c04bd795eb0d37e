"""Every number read from the command line, an environment variable, settings.ini or a file is
validated with a bound (engine.limits) before it sizes anything."""

from __future__ import annotations

import time

import pytest
from fuzzutil import fuzz
from hypothesis import given
from hypothesis import strategies as st

from merlin.engine import limits
from merlin.engine.errors import InputError

NUMBERS = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=60),
    st.sampled_from(["0", "-5", "1e9", "99999999999999999999999999999999999", " 7 ", "0x10"]),
    st.booleans(),
    st.none(),
)
HELPERS = [
    (limits.context_tokens, 0, limits.MAX_CONTEXT_TOKENS),
    (limits.threads, 0, limits.MAX_THREADS),
    (limits.seed, 0, limits.MAX_SEED),
    (limits.new_tokens, 1, limits.MAX_NEW_TOKENS),
    (limits.pixels, 1, limits.MAX_IMAGE_PIXELS),
    (limits.row_id, 0, limits.MAX_ROW_ID),
]


@fuzz(400)
@given(value=NUMBERS, which=st.integers(0, len(HELPERS) - 1))
def test_each_kind_of_number_is_bounded(value, which):
    fn, lo, hi = HELPERS[which]
    try:
        n = fn(value, "the value")
    except InputError as e:
        assert "the value" in str(e) and len(str(e)) < 300
        return
    assert type(n) is int and lo <= n <= hi


@fuzz(300)
@given(
    text=st.one_of(
        st.text(alphabet="0123456789-, ", max_size=40),
        st.builds(lambda a, b: f"{a}-{b}", st.integers(0, 10**15), st.integers(0, 10**15)),
    )
)
def test_cpu_lists_are_bounded(text):
    t0 = time.perf_counter()
    try:
        cpus = limits.cpu_list(text)
    except InputError:
        cpus = ()
    assert time.perf_counter() - t0 < 1.0
    assert all(0 <= c <= limits.MAX_CPU_INDEX for c in cpus)


def test_huge_cpu_range_from_flag_env_and_settings(monkeypatch):
    from merlin.engine import cpu

    with pytest.raises(InputError, match="out of range"):
        cpu.choose("0-99999999999")
    monkeypatch.setenv("MERLIN_CPUS", "0-99999999999")
    with pytest.raises(InputError, match="MERLIN_CPUS"):
        cpu.place()
    monkeypatch.setenv("MERLIN_CPUS", "all")
    monkeypatch.setenv("MERLIN_THREADS", "-5")
    with pytest.raises(InputError, match="MERLIN_THREADS"):
        cpu.place()


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["generate", "hi", "--max-context", "-5"], "--max-context"),
        (["generate", "hi", "--seed", "-1"], "--seed"),
        (["generate", "hi", "--threads", "-5"], "--threads"),
        (["generate", "hi", "--max-new-tokens", "0"], "--max-new-tokens"),
        (["generate", "hi", "--max-pixels", "-3"], "--max-pixels"),
        (["generate", "hi", "--cpus", "0-99999999999"], "--cpus"),
        (["chat", "--max-context", "99999999999"], "--max-context"),
        (["generate", "hi", "--top-k", "-1"], "--top-k"),
    ],
)
def test_cli_numbers_refused_before_any_work(argv, fragment, capsys, monkeypatch):
    from merlin.engine import cli
    from merlin.engine.commands import args as command_args
    from merlin.engine.commands import chat, generate

    def fail(args):
        pytest.fail("the model was loaded")

    for module in (command_args, chat, generate):
        monkeypatch.setattr(module, "load", fail, raising=False)
    assert cli.main(argv) == cli.EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err and len(err) < 500


def test_kv_cache_sized_past_memory_is_refused(demo_model, monkeypatch):
    from merlin.engine.errors import ResourceError

    monkeypatch.setenv("MERLIN_AVAILABLE_MEMORY", str(1 << 20))
    with pytest.raises(ResourceError, match="context"):
        demo_model.new_cache(demo_model.max_context)


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("max_position_embeddings", 10**9, "max_position_embeddings"),
        ("num_key_value_heads", 0, "num_key_value_heads"),
        ("head_dim", 0, "head_dim"),
        ("head_dim", 4096, "head_dim"),
    ],
)
def test_config_numbers_refused(demo_dir, key, value, fragment):
    import json

    from merlin.engine.config import parse_config
    from merlin.engine.errors import CheckpointError

    raw = json.loads((demo_dir / "config.json").read_text())
    raw["text_config"][key] = value
    with pytest.raises(CheckpointError, match=fragment):
        parse_config(raw, demo_dir / "config.json")


@fuzz(200)
@given(
    std=st.floats(min_value=0, max_value=1e300, allow_subnormal=True),
    mean=st.floats(min_value=-1e300, max_value=1e300),
    rescale=st.floats(min_value=0, max_value=1e300, allow_subnormal=True),
)
def test_preprocessor_constants_give_finite_pixels(tmp_path_factory, std, mean, rescale):
    import numpy as np

    from merlin.engine.errors import CheckpointError
    from merlin.engine.vision.preprocess import MAX_PIXEL_VALUE, _lut, parse_preprocess_config

    raw = {"image_std": [std] * 3, "image_mean": [mean] * 3, "rescale_factor": rescale}
    try:
        cfg = parse_preprocess_config(raw, tmp_path_factory.getbasetemp() / "p.json")
    except CheckpointError:
        return
    with np.errstate(all="ignore"):
        lut = _lut(cfg)
    assert np.isfinite(lut).all() and np.abs(lut).max() <= MAX_PIXEL_VALUE
