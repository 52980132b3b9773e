#!/usr/bin/env python3
"""Write a Stable Diffusion checkpoint of RANDOM weights in the SDXS-512 architecture (a one-step
distilled SD 1.x: a pruned UNet, CLIP ViT-L/14's text encoder, the tiny TAESD autoencoder),
as a safetensors file stable-diffusion.cpp's sd-server loads.

    sd_random_weights.py TENSORS.txt OUT.safetensors [--seed N]

No package on the registries this machine reaches ships Stable Diffusion weights (see
docs/ARCHITECTURE.md), so this file exercises the image plumbing only: sd-server really runs its
text encoder, UNet, sampler and decoder on it, and answers real PNGs of the requested size, but
the pictures are noise. Never assert anything about what an image shows.

TENSORS.txt lists every tensor sd.cpp expects for this architecture with its ggml shape (dumped
from sd.cpp's own loader). Matrices are drawn from N(0, 1/fan_in) with numpy's PCG64 seeded by
--seed (the same bytes on every machine), stored as float16; norm weights are 1 and biases 0, in
float32, so activations stay finite.
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np


def main():
    args = sys.argv[1:]
    seed = 20261123
    if "--seed" in args:
        i = args.index("--seed")
        seed = int(args[i + 1])
        del args[i : i + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    table, out = Path(args[0]), Path(args[1])
    specs = []
    for line in table.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, *ne = line.split()
        ne = [int(d) for d in ne]
        while len(ne) > 1 and ne[-1] == 1:
            ne.pop()
        specs.append((name, tuple(reversed(ne))))
    specs.sort()

    rng = np.random.Generator(np.random.PCG64(seed))
    header, blobs, offset = {}, [], 0
    for name, shape in specs:
        if len(shape) == 1:
            norm = "norm" in name or name.endswith("ln.weight") or ".ln_" in name
            value = 1.0 if name.endswith(".weight") and norm else 0.0
            data = np.full(shape, value, dtype=np.float32)
            dtype = "F32"
        else:
            fan_in = int(np.prod(shape[1:]))
            data = (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(fan_in)).astype(np.float16)
            dtype = "F16"
        raw = data.tobytes()
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"lemonade": "random weights for plumbing tests; the images are noise", "seed": str(seed)}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * ((8 - len(encoded) % 8) % 8)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with tmp.open("wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for raw in blobs:
            f.write(raw)
    tmp.rename(out)
    print(f"wrote {out}: {len(specs)} tensors, {offset / 1e6:.0f} MB of random weights (seed {seed})")


if __name__ == "__main__":
    main()
