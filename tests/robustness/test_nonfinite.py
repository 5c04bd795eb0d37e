"""Non-finite values: NaN/inf weights are refused at load with the tensor's name in every
weights format; the vision exp kernel is NaN-safe; a forward that produces non-finite logits
stops the answer with a message and the next question works."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from merlin.engine.checkpoint import Checkpoint, save_safetensors
from merlin.engine.errors import CheckpointError


def _poisoned(demo_dir, tmp_path, name_part: str, value: float, whole=False, dtype="BF16"):
    folder = tmp_path / "m"
    shutil.copytree(demo_dir, folder)
    with Checkpoint(demo_dir) as ckpt:
        names = list(ckpt.tensors)
        target = next(n for n in names if name_part in n)
        tensors = {}
        for n in names:
            a = ckpt.read_f32(n).astype(np.float64 if dtype == "F64" else np.float32)
            if n == target:  # (an F64 value may lie beyond float32)
                if whole:
                    a[...] = value
                else:
                    a.reshape(-1)[a.size // 2] = value
            tensors[n] = a
    save_safetensors(folder / "model.safetensors", tensors, dtype=None if dtype == "F64" else dtype)
    return folder, target


@pytest.mark.parametrize(
    "part, value, whole, weights",
    [
        ("layers.1.mlp.down_proj", np.nan, False, "f32"),
        ("layers.1.mlp.down_proj", np.inf, False, "q8"),
        ("layers.0.self_attn.q_proj", -np.inf, False, "q4"),
        ("layers.2.input_layernorm", np.nan, True, "f32"),
        ("embed_tokens", np.nan, False, "q4"),
        ("visual.blocks.0.mlp.linear_fc1.weight", np.nan, False, "f32"),
        ("visual.merger.linear_fc2.weight", np.inf, False, "q8"),
    ],
)
def test_nonfinite_weights_refused_at_load(demo_dir, tmp_path, part, value, whole, weights):
    from merlin.engine.model import load_model

    folder, target = _poisoned(demo_dir, tmp_path, part, value, whole)
    with pytest.raises(CheckpointError) as e:
        load_model(folder, weights=weights)
    message = str(e.value)
    assert target in message and ("NaN" in message or "infinite" in message)
    assert "cannot quantize" not in message


@pytest.mark.parametrize("weights", ["f32", "q8"])
def test_an_f64_value_beyond_float32_is_refused_at_load_with_its_name(demo_dir, tmp_path, weights):
    """1e300 is finite in an F64 checkpoint but infinite once converted: it had failed with
    "cannot quantize" (q4/q8) or a NaN forward naming no tensor (f32)."""
    from merlin.engine.model import load_model

    folder, target = _poisoned(demo_dir, tmp_path, "layers.0.mlp.down_proj", 1e300, dtype="F64")
    with pytest.raises(CheckpointError, match="beyond what float32 holds") as e:
        load_model(folder, weights=weights)
    assert target in str(e.value)


def test_an_f64_value_that_rounds_to_float32s_largest_is_accepted():
    """float32's largest value as printed (3.4028235e38) is a hair above it in float64 and
    rounds to it, not to infinity: it is a finite weight."""
    from merlin.engine.finite import check_tensor

    check_tensor(np.array([1.0, 3.4028235e38, -3.4028235e38]), "F64", "w", "f.safetensors")
    with pytest.raises(CheckpointError, match="beyond what float32 holds"):
        check_tensor(np.array([1.0, 3.5e38]), "F64", "w", "f.safetensors")


def test_vision_exp_is_nan_safe():
    from numba import njit

    from merlin.engine.vision.kernels import POW2, _exp

    @njit
    def run(x, out):
        for i in range(x.size):
            out[i] = _exp(x[i], POW2)

    x = np.array([np.nan, np.inf, -np.inf, 3e38, -3e38, 0.0, 1.0], np.float32)
    out = np.empty_like(x)
    run(x, out)  # a NaN used to become an int32 table index (SIGSEGV)
    assert np.isnan(out[0]) and np.isfinite(out[1:]).all()
    assert out[5] == 1.0 and abs(out[6] - np.e) < 1e-5


def test_gelu_on_nan_activations_does_not_crash():
    from merlin.engine.vision.kernels import POW2, bias_gelu_tanh

    a = np.full((4, 8), np.nan, np.float32)
    a[0] = 1e38
    bias_gelu_tanh(a, np.zeros(8, np.float32), POW2)
    assert a.shape == (4, 8)


def test_nonfinite_logits_stop_the_answer(demo_model, monkeypatch):
    from merlin.engine.finite import NonFiniteError
    from merlin.engine.session import Session

    s = Session(demo_model)
    real = demo_model.text.forward

    def nan_forward(*args, **kwargs):
        out = real(*args, **kwargs)
        return np.full_like(out, np.nan)

    monkeypatch.setattr(demo_model.text, "forward", nan_forward)
    with pytest.raises(NonFiniteError, match="NaN"):
        list(s.ask("hello", max_new_tokens=3))
    monkeypatch.setattr(demo_model.text, "forward", real)
    events = list(s.ask("hello again", max_new_tokens=3))
    assert events[-1].reason in ("max_tokens", "stop_token")


def test_cli_generate_with_nan_weights_exits_with_a_message(demo_dir, tmp_path):
    from support import assert_user_error, run_cli

    folder, target = _poisoned(demo_dir, tmp_path, "layers.0.mlp.up_proj", np.nan)
    result = run_cli("generate", "hi", "--model", str(folder), "--weights", "q8")
    assert_user_error(result, target)
