"""A checkpoint's text decoder written as GGUF, for `python -m merlin.engine.bench peer` and
`moe`: a dense Qwen3-VL folder as llama.cpp's "qwen3" architecture, a Qwen3-MoE one (the text
Qwen3MoeForCausalLM, or the text part of Qwen3VLMoeForConditionalGeneration) as "qwen3moe".

    python gguf_export.py CHECKPOINT_DIR OUT.gguf [f32|f16]

Self-contained (NumPy, the `gguf` package and the standard library only; no Merlin import):
it runs in the peer venv that holds llama.cpp (peer.py), never in Merlin's own environment, and
`gguf` is not a Merlin dependency. It reads the safetensors files directly (model.safetensors,
or the shards named by model.safetensors.index.json; the header is JSON, the data
little-endian; bf16 is the top half of an f32).

What it writes (the names and keys llama.cpp's qwen3 / qwen3moe loaders read, as its
convert_hf_to_gguf.py maps Qwen3 and Qwen3-MoE):
  tensors  token_embd, output_norm, output (absent when the embeddings are tied: llama.cpp
           then uses token_embd), blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output,
           attn_q_norm, attn_k_norm, ffn_norm}, and
             qwen3     blk.N.{ffn_gate, ffn_up, ffn_down};
             qwen3moe  blk.N.ffn_gate_inp (the router, [E, D], always f32 as llama.cpp's
                       converter and quantizer keep it), blk.N.ffn_gate_exps / ffn_up_exps
                       [E, I, D] and ffn_down_exps [E, D, I]: the experts stacked on a leading
                       axis (GGUF lists dimensions the other way round: ne = [D, I, E]);
           matrices as stored ([out, in], no q/k permutation: qwen3 uses NEOX rotary, as the
           checkpoint does), 1-D norms always f32;
  keys     {arch}.{context_length, embedding_length, block_count, feed_forward_length,
           attention.head_count, attention.head_count_kv, attention.key_length,
           attention.value_length, attention.layer_norm_rms_epsilon, rope.freq_base}, and for
           qwen3moe {expert_count, expert_used_count, expert_feed_forward_length};
  chat template  the checkpoint's (tokenizer.chat_template), for llama.cpp's server;
  tokenizer  byte-level BPE ("gpt2", pre-tokenizer "qwen2") from tokenizer.json: tokens by id,
           merges, added tokens as control (special) or user-defined tokens, and "[PADn]"
           unused tokens up to the embedding's row count (as convert_hf_to_gguf.py pads Qwen).

What llama.cpp's qwen3moe cannot express, refused with a ValueError: a dense layer
(mlp_only_layers, decoder_sparse_step > 1: every qwen3moe layer is routed) and
norm_topk_prob false on a qwen3_moe config (qwen3moe always renormalises the top-k weights;
the published 30B-A3B models set it true, and Qwen3-VL-MoE's router always renormalises).

Streaming: every tensor's name, shape and type go into the header first (from the
safetensors headers alone); then the tensors are converted and written one at a time, in
blocks of rows (fused Qwen3-VL-MoE experts one expert at a time), and the checkpoint's mapped
pages are dropped after each. The peak is the largest single output tensor plus 64 MB (at
Qwen3-30B-A3B's widths in f16: the embedding or the head, 620 MB, or one stacked expert
matrix of a layer, 400 MB), not the model.

Text positions only: Qwen3-VL's interleaved M-RoPE with equal (t, h, w) positions is the
standard rotary embedding with the same frequencies, which is what llama.cpp's qwen3 and
qwen3moe apply.
"""

from __future__ import annotations

import json
import mmap
import struct
import sys
from pathlib import Path

import numpy as np

PREFIX = "model.language_model."  # Qwen3-VL (dense and MoE); Qwen3MoeForCausalLM: "model."
MOE_MODEL_TYPES = ("qwen3_moe", "qwen3_vl_moe")
ATTENTION_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
}
LAYER_NAMES = {
    **ATTENTION_NAMES,
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
# GGUF name of each stacked expert matrix -> (qwen3_moe per-expert name, which half of
# qwen3_vl_moe's fused tensor)
EXPERT_NAMES = {
    "ffn_gate_exps": ("gate_proj", "gate"),
    "ffn_up_exps": ("up_proj", "up"),
    "ffn_down_exps": ("down_proj", "down"),
}


class SafeTensors:
    """Read-only tensors of one .safetensors file, memory-mapped."""

    def __init__(self, path: Path):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            self.header = json.loads(f.read(n))
        self.header.pop("__metadata__", None)
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.data = np.frombuffer(self._map, np.uint8, offset=8 + n)

    def release(self) -> None:
        """Drop the pages read so far from this process (they stay in the page cache)."""
        if hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def __contains__(self, name: str) -> bool:
        return name in self.header

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.header[name]["shape"])

    def f32(self, name: str, index: int | None = None) -> np.ndarray:
        """The tensor in f32; with `index`, only its slice [index] along the first axis."""
        if index is None:
            return self.f32_rows(name, 0, self.header[name]["shape"][0])
        return self.f32_rows(name, index, index + 1)[0]

    def f32_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Slices [start:stop] along the first axis, in f32."""
        meta = self.header[name]
        a, b = meta["data_offsets"]
        shape = list(meta["shape"])
        if shape:
            step = (b - a) // max(shape[0], 1)
            a, b, shape = a + start * step, a + stop * step, [stop - start, *shape[1:]]
        raw = self.data[a:b]
        if meta["dtype"] == "BF16":
            out = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif meta["dtype"] == "F16":
            out = raw.view(np.float16).astype(np.float32)
        elif meta["dtype"] == "F32":
            out = np.array(raw.view(np.float32))
        else:
            raise ValueError(f"{name}: unsupported dtype {meta['dtype']}")
        return out.reshape(shape)


class Tensors:
    """The checkpoint's tensors by name: model.safetensors, or the shards of its index."""

    def __init__(self, folder: Path):
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = {f: SafeTensors(folder / f) for f in sorted(set(weight_map.values()))}
            self.where = {n: files[f] for n, f in weight_map.items()}
            self.files = list(files.values())
        else:
            st = SafeTensors(folder / "model.safetensors")
            self.where = {n: st for n in st.header}
            self.files = [st]

    def __contains__(self, name: str) -> bool:
        return name in self.where and name in self.where[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.where[name].shape(name)

    def f32(self, name: str, index: int | None = None) -> np.ndarray:
        return self.where[name].f32(name, index)

    def read(self, name: str, dtype) -> np.ndarray:
        """The tensor in `dtype`, converted in blocks of rows (the f16 embedding of a 150k
        vocabulary without its 1.2 GB f32 copy)."""
        shape = self.shape(name)
        out = np.empty(shape, dtype)
        step = max(1, (1 << 24) // max(1, int(np.prod(shape[1:]))))  # 64 MB of f32
        for a in range(0, shape[0], step):
            out[a : a + step] = self.where[name].f32_rows(name, a, min(a + step, shape[0]))
        return out

    def release(self) -> None:
        for st in self.files:
            st.release()


def gguf_tensor_names(n_layers: int, tied: bool, prefix: str = PREFIX) -> dict[str, str]:
    """Checkpoint name -> GGUF name for a dense text decoder (qwen3)."""
    names = _common_names(tied, prefix)
    for i in range(n_layers):
        for ours, theirs in LAYER_NAMES.items():
            names[f"{prefix}layers.{i}.{ours}.weight"] = f"blk.{i}.{theirs}.weight"
    return names


def _common_names(tied: bool, prefix: str) -> dict[str, str]:
    names = {
        prefix + "embed_tokens.weight": "token_embd.weight",
        prefix + "norm.weight": "output_norm.weight",
    }
    if not tied:
        names["lm_head.weight"] = "output.weight"
    return names


def text_config(config: dict) -> tuple[dict, str]:
    """(the text part of config.json, its tensors' name prefix)."""
    if "text_config" in config:
        return config["text_config"], PREFIX
    return config, "model."


def moe_settings(config: dict) -> dict | None:
    """The qwen3moe keys of a Qwen3-MoE config (None for a dense one); ValueError for what
    llama.cpp's qwen3moe cannot express (module docstring)."""
    model_type = config.get("model_type")
    if model_type not in MOE_MODEL_TYPES:
        return None
    text, _ = text_config(config)
    where = "text_config." if "text_config" in config else ""
    if text.get("mlp_only_layers") or text.get("decoder_sparse_step", 1) != 1:
        raise ValueError(
            f"{where}mlp_only_layers / decoder_sparse_step give this checkpoint dense layers; "
            "llama.cpp's qwen3moe routes every layer"
        )
    if model_type == "qwen3_moe" and not text.get("norm_topk_prob", False):
        raise ValueError(
            "norm_topk_prob is false; llama.cpp's qwen3moe always renormalises the top-k "
            "expert weights, so it would compute another model"
        )
    experts = text.get("num_experts", text.get("num_local_experts"))
    return {
        "experts": int(experts),
        "used": int(text["num_experts_per_tok"]),
        "width": int(text["moe_intermediate_size"]),
        "fused": model_type == "qwen3_vl_moe",
    }


def _expert_reader(st: Tensors, p: str, moe: dict, what: str, dims: tuple[int, int]):
    """expert e -> its f32 [O, K] matrix of `what` ("gate", "up", "down"), from either
    spelling (moe.weights in Merlin has the layouts; the fused tensors as published, [E, D, 2I]
    / [E, I, D], or as transformers 5.x saves them, [E, 2I, D] / [E, D, I])."""
    inter = moe["width"]
    if not moe["fused"]:
        per_expert = dict(gate="gate_proj", up="up_proj", down="down_proj")[what]
        return lambda e: st.f32(f"{p}experts.{e}.{per_expert}.weight")
    name = p + ("experts.down_proj" if what == "down" else "experts.gate_up_proj")
    memory = (dims[0] * (2 if what != "down" else 1), dims[1])  # [2I, D] or [D, I]
    transposed = st.shape(name)[1:] != memory
    rows = {"gate": slice(0, inter), "up": slice(inter, 2 * inter), "down": slice(None)}[what]

    def read(e: int) -> np.ndarray:
        w = st.f32(name, e)
        return (w.T if transposed else w)[rows]

    return read


def tensor_plan(folder: Path, st: Tensors) -> list[tuple[str, tuple[int, ...], object]]:
    """(GGUF name, shape, read(dtype) -> array) of every tensor, in file order."""
    config = json.loads((folder / "config.json").read_text())
    text, prefix = text_config(config)
    tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    n_layers = text["num_hidden_layers"]
    moe = moe_settings(config)
    plan = []

    def direct(ours: str, theirs: str):
        if ours not in st:
            raise ValueError(f"the checkpoint lacks the text tensor {ours}")
        plan.append((theirs, st.shape(ours), lambda dtype: st.read(ours, dtype)))

    if moe is None:
        for ours, theirs in gguf_tensor_names(n_layers, tied, prefix).items():
            direct(ours, theirs)
        return plan
    for ours, theirs in _common_names(tied, prefix).items():
        direct(ours, theirs)
    e_count, inter, d = moe["experts"], moe["width"], text["hidden_size"]
    for i in range(n_layers):
        p = f"{prefix}layers.{i}."
        for ours, theirs in ATTENTION_NAMES.items():
            direct(f"{p}{ours}.weight", f"blk.{i}.{theirs}.weight")
        direct(f"{p}mlp.gate.weight", f"blk.{i}.ffn_gate_inp.weight")
        for theirs, (per_expert, what) in EXPERT_NAMES.items():
            dims = (d, inter) if what == "down" else (inter, d)
            needed = (
                [f"{p}mlp.experts.{'down_proj' if what == 'down' else 'gate_up_proj'}"]
                if moe["fused"]
                else [f"{p}mlp.experts.{e}.{per_expert}.weight" for e in range(e_count)]
            )
            for name in needed:
                if name not in st:
                    raise ValueError(f"the checkpoint lacks the expert tensor {name}")
            read = _expert_reader(st, f"{p}mlp.", moe, what, dims)

            def stacked(dtype, read=read, dims=dims):  # one expert in f32 at a time
                out = np.empty((e_count, *dims), dtype)
                for e in range(e_count):
                    out[e] = read(e)
                return out

            plan.append((f"blk.{i}.{theirs}.weight", (e_count, *dims), stacked))
    return plan


def _keep_f32(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) == 1 or name.endswith("ffn_gate_inp.weight")


def tokenizer_tables(tokenizer: dict, vocab_size: int):
    """(tokens by id, token types, merges) for GGUF from a tokenizers BPE tokenizer.json."""
    import gguf

    model = tokenizer["model"]
    if model.get("type") != "BPE":
        raise ValueError("the checkpoint's tokenizer is not BPE; GGUF export supports BPE only")
    by_id: dict[int, tuple[str, int]] = {
        i: (t, gguf.TokenType.NORMAL) for t, i in model["vocab"].items()
    }
    for added in tokenizer.get("added_tokens", []):
        kind = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
        by_id[added["id"]] = (added["content"], kind)
    if max(by_id) >= vocab_size:
        raise ValueError(f"the tokenizer has ids up to {max(by_id)}, the model {vocab_size} rows")
    tokens, types = [], []
    for i in range(vocab_size):
        text, kind = by_id.get(i, (f"[PAD{i}]", gguf.TokenType.UNUSED))
        tokens.append(text)
        types.append(kind)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, types, merges


def _rope_theta(text: dict) -> float:
    if "rope_theta" in text:
        return float(text["rope_theta"])
    return float((text.get("rope_parameters") or {})["rope_theta"])  # transformers 5.x


def export(folder: Path, out: Path, dtype: str = "f16") -> dict:
    """Write the GGUF; returns a summary (architecture, tensor count, bytes)."""
    import gguf

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    text, _ = text_config(config)
    moe = moe_settings(config)
    st = Tensors(folder)
    plan = tensor_plan(folder, st)  # raises before the file is opened
    n_layers = text["num_hidden_layers"]
    head_dim = text.get("head_dim", text["hidden_size"] // text["num_attention_heads"])
    arch = "qwen3" if moe is None else "qwen3moe"
    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(folder.name)
    w.add_context_length(text["max_position_embeddings"])
    w.add_embedding_length(text["hidden_size"])
    w.add_block_count(n_layers)
    if moe is None:
        w.add_feed_forward_length(text["intermediate_size"])
    else:  # llama.cpp reads the experts' width from expert_feed_forward_length
        w.add_feed_forward_length(text.get("intermediate_size", moe["width"] * moe["used"]))
        w.add_expert_count(moe["experts"])
        w.add_expert_used_count(moe["used"])
        w.add_expert_feed_forward_length(moe["width"])
    w.add_head_count(text["num_attention_heads"])
    w.add_head_count_kv(text["num_key_value_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(float(text["rms_norm_eps"]))
    w.add_rope_freq_base(_rope_theta(text))
    ftype = gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16
    w.add_file_type(ftype)
    tokenizer = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    tokens, types, merges = tokenizer_tables(tokenizer, text["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eos = text.get("eos_token_id", config.get("eos_token_id"))
    if isinstance(eos, int):
        w.add_eos_token_id(eos)
    bos = text.get("bos_token_id", config.get("bos_token_id"))
    if isinstance(bos, int):
        w.add_bos_token_id(bos)
    w.add_add_bos_token(False)
    template = chat_template(folder)
    if template:  # llama.cpp's server renders chats with it, as Merlin does
        w.add_chat_template(template)
    out_dtypes = []
    for name, shape, _ in plan:
        np_dtype = np.float32 if dtype == "f32" or _keep_f32(name, shape) else np.float16
        out_dtypes.append(np_dtype)
        w.add_tensor_info(
            name, shape, np.dtype(np_dtype), int(np.prod(shape)) * np_dtype().itemsize
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    nbytes = 0
    for (name, shape, read), np_dtype in zip(plan, out_dtypes):
        a = np.ascontiguousarray(read(np_dtype))
        if a.shape != tuple(shape):
            raise ValueError(f"{name}: read {a.shape}, the header says {tuple(shape)}")
        w.write_tensor_data(a)
        nbytes += a.nbytes
        del a
        st.release()
    w.close()
    return {"arch": arch, "tensors": len(plan), "bytes": nbytes, "path": str(out)}


def chat_template(folder: Path) -> str | None:
    """The checkpoint's chat template (chat_template.jinja, chat_template.json or
    tokenizer_config.json, in Merlin's order), or None."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    for name in ("chat_template.json", "tokenizer_config.json"):
        path = folder / name
        if path.is_file():
            value = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
            if isinstance(value, str):
                return value
    return None


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__.split("\n\n")[1])
    summary = export(Path(sys.argv[1]), Path(sys.argv[2]), *(sys.argv[3:] or ["f16"]))
    print(json.dumps(summary))
