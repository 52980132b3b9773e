"""Image generation, edits and variations through lemonade with the official openai SDK (run by
crates/cli/tests/images.rs). The model has random weights, so only the form of each answer is
checked: every image must be a PNG that decodes (zlib, filter bytes, the exact pixel count) to
the requested size. Bad input must raise the SDK's 4xx errors. A failure exits non-zero naming
what was wrong."""

import base64
import struct
import sys
import zlib

import openai

base, model, llm = sys.argv[1:4]
client = openai.OpenAI(base_url=f"{base}/api/v1", api_key="unused", max_retries=0, timeout=300)


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


def png_size(data, what):
    """Decodes a PNG far enough to trust it: signature, IHDR, every chunk's CRC, and the
    inflated IDAT holding exactly one filter byte plus width x channels bytes per row."""
    check(data[:8] == b"\x89PNG\r\n\x1a\n", f"{what}: not a PNG: {data[:16]!r}")
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        check(zlib.crc32(kind + body) == crc, f"{what}: bad CRC in {kind!r}")
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    check(ihdr is not None, f"{what}: no IHDR")
    width, height, depth, color = ihdr[:4]
    channels = {2: 3, 6: 4, 0: 1}[color]
    raw = zlib.decompress(idat)
    check(depth == 8 and len(raw) == height * (1 + width * channels), f"{what}: {len(raw)} bytes for {width}x{height}")
    check(all(raw[r * (1 + width * channels)] <= 4 for r in range(height)), f"{what}: bad filter bytes")
    return width, height


def pngs(resp, n, size, what):
    check(len(resp.data) == n, f"{what}: {len(resp.data)} images, asked {n}")
    out = []
    for i, d in enumerate(resp.data):
        data = base64.b64decode(d.b64_json)
        check(png_size(data, f"{what}[{i}]") == size, f"{what}[{i}]: size {png_size(data, what)}, asked {size}")
        out.append(data)
    return out


fast = {"steps": 1, "cfg_scale": 1.0, "seed": 7}
img = pngs(client.images.generate(model=model, prompt="a glass of lemonade", size="256x256",
                                  response_format="b64_json", extra_body=fast), 1, (256, 256), "generate")[0]
# The model's defaults (1 step, 256x256) when nothing is asked, and a wide size with two images.
pngs(client.images.generate(model=model, prompt="a lemon tree"), 1, (256, 256), "defaults")
pngs(client.images.generate(model=model, prompt="lemons", size="320x192", n=2, extra_body=fast), 2, (320, 192), "n=2")
pngs(client.images.edit(model=model, image=("lemon.png", img, "image/png"), prompt="a blue lemon",
                        size="256x256", extra_body=fast), 1, (256, 256), "edit")
pngs(client.images.create_variation(model=model, image=("lemon.png", img, "image/png"), extra_body=fast),
     1, (256, 256), "variation")


def refused(what, call, needle):
    try:
        call()
        check(False, f"{what} was accepted")
    except openai.BadRequestError as e:
        check(needle in str(e), f"{what}: {e}")


refused("an LLM", lambda: client.images.generate(model=llm, prompt="x"), "needs an image model")
refused("size 100x100", lambda: client.images.generate(model=model, prompt="x", size="100x100"), "Unsupported size '100x100'")
refused("url answers", lambda: client.images.generate(model=model, prompt="x", response_format="url"), "b64_json only")
refused("an empty prompt", lambda: client.images.generate(model=model, prompt=" "), "'prompt' must not be empty")
refused("n=11", lambda: client.images.generate(model=model, prompt="x", n=11), "expected 1 to 10")
refused("a sampler", lambda: client.images.generate(model=model, prompt="x", extra_body={"sampler": "magic"}), "Unknown sampler 'magic'")
refused("a text file", lambda: client.images.edit(model=model, image=("a.txt", b"not an image", "text/plain"), prompt="x"),
        "'a.txt' is not an image")
print("every check held")
