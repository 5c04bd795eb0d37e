"""Bytes of the routed layers, for engine.memory's estimate and `merlin-cli info`: what all
experts hold, what one decode token reads (the router and k experts a layer), and the
working rows a forward adds. Expert matrices whose sizes are not multiples of the 32-weight
block stay f32 (engine.moe.weights.load_experts)."""

from __future__ import annotations

from ..config import ModelConfig
from ..linear import quantizable


def _matrix(out_features: int, in_features: int, fmt: str) -> int:
    from ..memory import matrix_bytes

    return matrix_bytes(out_features, in_features, fmt)


def expert_bytes(cfg: ModelConfig, fmt: str) -> int:
    """One expert's gate_up [2I, D] and down [D, I]."""
    m, d = cfg.text.moe, cfg.text.hidden_size
    inter = m.moe_intermediate_size
    if not (quantizable(d) and quantizable(inter)):
        fmt = "f32"
    return _matrix(2 * inter, d, fmt) + _matrix(d, inter, fmt)


def routed_layers(cfg: ModelConfig) -> int:
    t = cfg.text
    return sum(t.is_moe_layer(i) for i in range(t.num_hidden_layers))


def router_bytes(cfg: ModelConfig) -> int:
    return 4 * cfg.text.moe.num_experts * cfg.text.hidden_size


def all_expert_bytes(cfg: ModelConfig, fmt: str) -> int:
    """Every expert of every routed layer (what may live in the mapped weight cache)."""
    if cfg.text.moe is None:
        return 0
    return routed_layers(cfg) * cfg.text.moe.num_experts * expert_bytes(cfg, fmt)


def routed_weight_bytes(cfg: ModelConfig, fmt: str) -> int:
    """Routers and experts of every routed layer."""
    if cfg.text.moe is None:
        return 0
    return all_expert_bytes(cfg, fmt) + routed_layers(cfg) * router_bytes(cfg)


def routed_bytes_per_token(cfg: ModelConfig, fmt: str) -> int:
    """What one decode token reads of the routed layers: each router and k experts."""
    if cfg.text.moe is None:
        return 0
    m = cfg.text.moe
    return routed_layers(cfg) * (router_bytes(cfg) + m.experts_per_token * expert_bytes(cfg, fmt))


def routed_bytes_per_row(cfg: ModelConfig) -> int:
    """f32 working rows a forward adds per row: router logits, the k expert outputs, and
    (at most) the gathered rows of one expert with its gate_up and activation."""
    if cfg.text.moe is None:
        return 0
    m, d = cfg.text.moe, cfg.text.hidden_size
    return 4 * (m.num_experts + m.experts_per_token * (d + 2) + 2 * d + 3 * m.moe_intermediate_size)


def layer_expert_bytes(cfg: ModelConfig, fmt: str) -> int:
    """One routed layer's experts: the least a memory-mapped model keeps resident to run a
    forward (a prefill may touch every expert of a layer)."""
    return cfg.text.moe.num_experts * expert_bytes(cfg, fmt) if cfg.text.moe else 0


def describe_experts(cfg: ModelConfig) -> dict | None:
    """`merlin-cli info`'s mixture-of-experts block: counts, active vs total decoder
    parameters (embedding excluded, the lm_head included) and bytes one token reads of
    the routed layers per weights format."""
    m = cfg.text.moe
    if m is None:
        return None
    t = cfg.text
    head = t.vocab_size * t.hidden_size
    return {
        "experts": m.num_experts,
        "experts_per_token": m.experts_per_token,
        "moe_intermediate_size": m.moe_intermediate_size,
        "norm_topk_prob": m.norm_topk_prob,
        "routed_layers": routed_layers(cfg),
        "params_decoder_total": t.n_params + head,
        "params_decoder_active": t.n_active_params + head,
        "routed_bytes_per_token": {f: routed_bytes_per_token(cfg, f) for f in ("f32", "q8", "q4")},
        "expert_bytes_total": {f: all_expert_bytes(cfg, f) for f in ("f32", "q8", "q4")},
    }
