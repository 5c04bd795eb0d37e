"""One routed layer's weights: the router in f32 and every expert's gate_up / down matrices
stacked along a leading expert axis (engine.kernels.experts has the layouts), read from the
two checkpoint spellings and quantized while loading, one expert at a time.

Checkpoint spellings (names under the decoder prefix, layer i):

    qwen3_vl_moe  layers.i.mlp.gate.weight [E, D]; layers.i.mlp.experts.gate_up_proj and
                  .down_proj, fused 3D: as published (transformers 4.57's parameters)
                  [E, D, 2I] / [E, I, D], or as transformers 5.x saves them [E, 2I, D] /
                  [E, D, I]. As transformers (conversion_mapping "qwen3_vl_moe":
                  Transpose(1, 2, check_dims=True)), a tensor already in the [E, 2I, D] /
                  [E, D, I] shape is taken as it is, any other is the transposed layout.
    qwen3_moe     layers.i.mlp.gate.weight [E, D]; layers.i.mlp.experts.j.{gate,up,down}_proj
                  .weight [I, D], [I, D], [D, I] for each expert j.

Why the router stays f32: it is E x D (1 MB a layer for the 30B models, 2.5% of a q4
token's bytes), and the routing decisions are what must match transformers exactly.

Peak memory while loading: the stacked arrays in their final format, plus one expert's f32
rows; each checkpoint tensor's file pages are released once converted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba
import numpy as np

from ..checkpoint import Checkpoint, to_f32
from ..config import ModelConfig
from ..errors import CheckpointError
from ..kernels import experts as kx
from ..linear import GroupLinear, QLinear, quantizable, quantized_linear
from ..quant import quantize

KINDS = ("f32", "q4", "q8", "q8r")  # q8r: row-major q8 (CPUs without the grouped q8 kernel)


def layer_prefix(cfg: ModelConfig, i: int) -> str:
    return f"{cfg.text_prefix}layers.{i}.mlp."


def fused_experts(cfg: ModelConfig) -> bool:
    return cfg.model_type == "qwen3_vl_moe"


def expected_expert_tensors(cfg: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Checkpoint name -> shape of layer i's router and experts (fused tensors: the
    published shape; accepted_shapes() also allows the 5.x one)."""
    m, d = cfg.text.moe, cfg.text.hidden_size
    e, inter = m.num_experts, m.moe_intermediate_size
    p = layer_prefix(cfg, i)
    names = {p + "gate.weight": (e, d)}
    if fused_experts(cfg):
        names[p + "experts.gate_up_proj"] = (e, d, 2 * inter)
        names[p + "experts.down_proj"] = (e, inter, d)
    else:
        for j in range(e):
            names[f"{p}experts.{j}.gate_proj.weight"] = (inter, d)
            names[f"{p}experts.{j}.up_proj.weight"] = (inter, d)
            names[f"{p}experts.{j}.down_proj.weight"] = (d, inter)
    return names


def accepted_shapes(name: str, shape: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """The shapes a tensor of expected `shape` may have on disk: fused experts also in
    transformers 5.x's transposed save."""
    if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
        return (shape, (shape[0], shape[2], shape[1]))
    return (shape,)


@dataclass
class ExpertBank:
    """gate_up or down of all experts of a layer: arrays stacked on axis 0."""

    kind: str
    arrays: dict[str, np.ndarray]
    out_features: int
    in_features: int

    @property
    def fmt(self) -> str:
        return "q8" if self.kind == "q8r" else self.kind

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    @property
    def num_experts(self) -> int:
        return next(iter(self.arrays.values())).shape[0]

    def args(self) -> tuple[np.ndarray, ...]:
        if self.kind == "f32":
            return (self.arrays["w"],)
        if self.kind == "q8r":
            return (self.arrays["qs"], self.arrays["scales"])
        return (self.arrays["packed"], self.arrays["gscales"])


_KERNELS = {"f32": kx.moe_f32, "q4": kx.moe_grouped, "q8": kx.moe_grouped, "q8r": kx.moe_q8r}


@dataclass
class ExpertWeights:
    router: np.ndarray  # f32 [E, D]
    gate_up: ExpertBank  # [E] x [2I, D]
    down: ExpertBank  # [E] x [D, I]
    experts_per_token: int
    normalize: bool
    last_used: int = field(default=0, compare=False)  # experts the last forward read

    @property
    def kind(self) -> str:
        return self.gate_up.kind

    @property
    def num_experts(self) -> int:
        return self.router.shape[0]

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert's two matrices."""
        return (self.gate_up.nbytes + self.down.nbytes) // self.num_experts

    @property
    def nbytes(self) -> int:
        return self.router.nbytes + self.gate_up.nbytes + self.down.nbytes

    @property
    def bytes_per_token(self) -> int:
        """What one decode token reads: the router and its k experts."""
        return self.router.nbytes + self.experts_per_token * self.expert_bytes

    def route(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(idx [N, k], weights [N, k]) the router picks for rows x [N, D] (tests, bench)."""
        n, k = x.shape[0], self.experts_per_token
        logits = np.empty((n, self.num_experts), np.float32)
        kx.matmul_f32(np.ascontiguousarray(x), self.router, logits)
        idx = np.empty((n, k), np.int64)
        w = np.empty((n, k), np.float32)
        kx.route(logits, k, self.normalize, idx, w)
        return idx, w

    def __call__(self, x: np.ndarray, out: np.ndarray):
        """out [N, D] = the routed MLP of x [N, D]; returns (idx, weights) of the routing."""
        kernel = _KERNELS[self.kind]
        idx, w, used = kernel(
            x,
            self.router,
            self.experts_per_token,
            self.normalize,
            *self.gate_up.args(),
            *self.down.args(),
            self.down.in_features,
            numba.get_num_threads(),
            out,
        )
        self.last_used = int(used)
        return idx, w

    def arrays(self) -> dict[str, np.ndarray]:
        out = {"router": self.router}
        for part, bank in (("gate_up", self.gate_up), ("down", self.down)):
            for name, a in bank.arrays.items():
                out[f"{part}.{name}"] = a
        return out


def _container_arrays(lin) -> tuple[str, dict[str, np.ndarray]]:
    if isinstance(lin, GroupLinear):
        return lin.kind, {"packed": lin.packed, "gscales": lin.gscales}
    if isinstance(lin, QLinear):
        return "q8r", {"qs": lin.qt.qs, "scales": lin.qt.scales}
    return "f32", {"w": lin.w}


class _Stacker:
    """Fills stacked arrays expert by expert (allocated at the first expert's shapes)."""

    def __init__(self, n_experts: int, out_features: int, in_features: int):
        self.n, self.o, self.k = n_experts, out_features, in_features
        self.kind = None
        self.arrays: dict[str, np.ndarray] = {}

    def put(self, e: int, w: np.ndarray, fmt: str) -> None:
        if fmt == "f32":
            kind, parts = "f32", {"w": w}
        else:
            kind, parts = _container_arrays(quantized_linear(quantize(w, fmt)))
        if self.kind is None:
            self.kind = kind
            self.arrays = {n: np.empty((self.n, *a.shape), a.dtype) for n, a in parts.items()}
        for n, a in parts.items():
            self.arrays[n][e] = a

    def bank(self) -> ExpertBank:
        return ExpertBank(self.kind, self.arrays, self.o, self.k)


def _fused_reader(ckpt: Checkpoint, name: str, memory_shape: tuple[int, int]):
    """expert e -> its f32 [O, K] matrix from a fused 3D tensor in either layout."""
    info = ckpt.float_info(name)
    transposed = tuple(info.shape[1:]) != memory_shape
    raw = ckpt.raw(name)

    def read(e: int) -> np.ndarray:
        w = to_f32(raw[e], info.dtype)
        return np.ascontiguousarray(w.T) if transposed else w

    return read


def load_experts(ckpt: Checkpoint, cfg: ModelConfig, i: int, fmt: str) -> ExpertWeights:
    """Layer i's router and experts, the experts in `fmt` (f32 when a dimension is not a
    multiple of the 32-weight block)."""
    m, d = cfg.text.moe, cfg.text.hidden_size
    e_count, inter = m.num_experts, m.moe_intermediate_size
    p = layer_prefix(cfg, i)
    router = ckpt.read_f32(p + "gate.weight", (e_count, d))
    if not (quantizable(d) and quantizable(inter)):
        fmt = "f32"
    gu = _Stacker(e_count, 2 * inter, d)
    dn = _Stacker(e_count, d, inter)
    if fused_experts(cfg):
        read_gu = _fused_reader(ckpt, p + "experts.gate_up_proj", (2 * inter, d))
        read_dn = _fused_reader(ckpt, p + "experts.down_proj", (d, inter))
        for e in range(e_count):
            gu.put(e, read_gu(e), fmt)
            dn.put(e, read_dn(e), fmt)
        ckpt.release(p + "experts.gate_up_proj")
        ckpt.release(p + "experts.down_proj")
    else:
        for e in range(e_count):
            q = f"{p}experts.{e}."
            w = np.empty((2 * inter, d), np.float32)
            w[:inter] = ckpt.read_f32(q + "gate_proj.weight", (inter, d))
            w[inter:] = ckpt.read_f32(q + "up_proj.weight", (inter, d))
            gu.put(e, w, fmt)
            dn.put(e, ckpt.read_f32(q + "down_proj.weight", (d, inter)), fmt)
    return ExpertWeights(router, gu.bank(), dn.bank(), m.experts_per_token, m.norm_topk_prob)


def experts_from_arrays(
    kind: str, arrays: dict[str, np.ndarray], cfg: ModelConfig, name: str
) -> ExpertWeights:
    """Rebuild from ExpertWeights.arrays() (the weight cache), every shape checked (a
    mis-shaped array would make a kernel read out of bounds, not raise)."""
    from ..kernels.qgroup import GROUP, Q4_BLOCK_BYTES, Q8_BLOCK_BYTES
    from ..quant import BLOCK

    if kind not in KINDS:
        raise CheckpointError(f"{name}: unknown expert format {kind!r}")
    m, d = cfg.text.moe, cfg.text.hidden_size
    e, inter = m.num_experts, m.moe_intermediate_size
    router = arrays.get("router")
    if router is None or router.dtype != np.float32 or router.shape != (e, d):
        raise CheckpointError(f"{name}.router is damaged")
    banks = {}
    for part, (o, k) in (("gate_up", (2 * inter, d)), ("down", (d, inter))):
        if kind == "f32":
            want = {"w": (np.float32, (e, o, k))}
        elif kind == "q8r":
            want = {"qs": (np.int8, (e, o, k)), "scales": (np.uint16, (e, o, k // BLOCK))}
        else:
            g, nb = -(-o // GROUP), k // BLOCK
            dtype, width = (np.uint8, Q4_BLOCK_BYTES) if kind == "q4" else (np.int8, Q8_BLOCK_BYTES)
            want = {"packed": (dtype, (e, g, nb, width)), "gscales": (np.uint16, (e, g, nb, GROUP))}
        got = {}
        for n, (dtype, shape) in want.items():
            a = arrays.get(f"{part}.{n}")
            if a is None or a.dtype != dtype or a.shape != shape:
                raise CheckpointError(f"{name}.{part}.{n} is damaged")
            got[n] = a
        banks[part] = ExpertBank(kind, got, o, k)
    return ExpertWeights(
        router, banks["gate_up"], banks["down"], m.experts_per_token, m.norm_topk_prob
    )
