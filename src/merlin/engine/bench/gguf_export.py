"""A Qwen3-VL checkpoint's text decoder written as GGUF (llama.cpp's "qwen3" architecture), for
`python -m merlin.engine.bench peer`.

    python gguf_export.py CHECKPOINT_DIR OUT.gguf [f32|f16]

Self-contained (NumPy, the `gguf` package and the standard library only; no Merlin import):
it runs in the peer venv that holds llama.cpp (peer.py), never in Merlin's own environment, and
`gguf` is not a Merlin dependency. It reads model.safetensors directly (the header is JSON, the
data little-endian; bf16 is the top half of an f32).

What it writes (the names and keys llama.cpp's qwen3 loader reads; its convert_hf_to_gguf.py
maps Qwen3 the same way):
  tensors  token_embd, output_norm, output (absent when the embeddings are tied: llama.cpp
           then uses token_embd), blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output,
           attn_q_norm, attn_k_norm, ffn_norm, ffn_gate, ffn_up, ffn_down}; matrices as stored
           ([out, in], no q/k permutation: qwen3 uses NEOX rotary, as the checkpoint does),
           1-D norms always f32;
  keys     qwen3.{context_length, embedding_length, block_count, feed_forward_length,
           attention.head_count, attention.head_count_kv, attention.key_length,
           attention.value_length, attention.layer_norm_rms_epsilon, rope.freq_base};
  chat template  the checkpoint's (tokenizer.chat_template), for llama.cpp's server;
  tokenizer  byte-level BPE ("gpt2", pre-tokenizer "qwen2") from tokenizer.json: tokens by id,
           merges, added tokens as control (special) or user-defined tokens, and "[PADn]"
           unused tokens up to the embedding's row count (as convert_hf_to_gguf.py pads Qwen).

Text positions only: Qwen3-VL's interleaved M-RoPE with equal (t, h, w) positions is the
standard rotary embedding with the same frequencies, which is what llama.cpp's qwen3 applies.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np

PREFIX = "model.language_model."
LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


class SafeTensors:
    """Read-only tensors of one .safetensors file, memory-mapped."""

    def __init__(self, path: Path):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            self.header = json.loads(f.read(n))
        self.header.pop("__metadata__", None)
        self.data = np.memmap(path, np.uint8, "r", offset=8 + n)

    def __contains__(self, name: str) -> bool:
        return name in self.header

    def f32(self, name: str) -> np.ndarray:
        meta = self.header[name]
        a, b = meta["data_offsets"]
        raw = self.data[a:b]
        if meta["dtype"] == "BF16":
            out = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif meta["dtype"] == "F16":
            out = raw.view(np.float16).astype(np.float32)
        elif meta["dtype"] == "F32":
            out = np.array(raw.view(np.float32))
        else:
            raise ValueError(f"{name}: unsupported dtype {meta['dtype']}")
        return out.reshape(meta["shape"])


def gguf_tensor_names(n_layers: int, tied: bool) -> dict[str, str]:
    """Checkpoint name -> GGUF name for the text decoder."""
    names = {
        PREFIX + "embed_tokens.weight": "token_embd.weight",
        PREFIX + "norm.weight": "output_norm.weight",
    }
    if not tied:
        names["lm_head.weight"] = "output.weight"
    for i in range(n_layers):
        for ours, theirs in LAYER_NAMES.items():
            names[f"{PREFIX}layers.{i}.{ours}.weight"] = f"blk.{i}.{theirs}.weight"
    return names


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


def export(folder: Path, out: Path, dtype: str = "f16") -> dict:
    """Write the GGUF; returns a summary (tensor count, bytes)."""
    import gguf

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    text = config.get("text_config", config)
    tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    st = SafeTensors(folder / "model.safetensors")
    n_layers = text["num_hidden_layers"]
    head_dim = text.get("head_dim", text["hidden_size"] // text["num_attention_heads"])
    w = gguf.GGUFWriter(str(out), "qwen3")
    w.add_name(folder.name)
    w.add_context_length(text["max_position_embeddings"])
    w.add_embedding_length(text["hidden_size"])
    w.add_block_count(n_layers)
    w.add_feed_forward_length(text["intermediate_size"])
    w.add_head_count(text["num_attention_heads"])
    w.add_head_count_kv(text["num_key_value_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(float(text["rms_norm_eps"]))
    w.add_rope_freq_base(float(text["rope_theta"]))
    ftype = gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16
    w.add_file_type(ftype)
    tokenizer = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    tokens, types, merges = tokenizer_tables(tokenizer, text["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eos = text.get("eos_token_id")
    if isinstance(eos, int):
        w.add_eos_token_id(eos)
    bos = text.get("bos_token_id")
    if isinstance(bos, int):
        w.add_bos_token_id(bos)
    w.add_add_bos_token(False)
    template = chat_template(folder)
    if template:  # llama.cpp's server renders chats with it, as Merlin does
        w.add_chat_template(template)
    names = gguf_tensor_names(n_layers, tied)
    missing = [n for n in names if n not in st]
    if missing:
        raise ValueError(f"the checkpoint lacks {len(missing)} text tensors, e.g. {missing[0]}")
    nbytes = 0
    for ours, theirs in names.items():
        a = st.f32(ours)
        if a.ndim > 1 and dtype == "f16":
            a = a.astype(np.float16)
        w.add_tensor(theirs, np.ascontiguousarray(a))
        nbytes += a.nbytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"tensors": len(names), "bytes": nbytes, "path": str(out)}


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
