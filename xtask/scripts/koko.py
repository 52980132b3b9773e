#!/usr/bin/env python3
"""lemonade's Kokoro backend: an OpenAI-compatible text-to-speech server over ONNX Runtime and
the kokoro-onnx library, with the command line of Kokoros' `koko` that Lemonade runs:

    koko (--index INDEX.json | -m MODEL.onnx -d VOICES.bin) openai [--ip 127.0.0.1] [--port 3000]

INDEX.json names the model and voices files relative to itself: {"model": …, "voices": …}.
`cargo xtask setup` installs this file with a pinned virtualenv as the `kokoro:cpu` backend
(Kokoros itself is Rust on the `ort` crate, whose build downloads ONNX Runtime from the network;
see docs/ARCHITECTURE.md).

Routes:
  GET  /, /health           200 {"status": "ok"} once the model is loaded
  GET  /v1/audio/voices     {"voices": [...]}
  POST /v1/audio/speech     {"input", "voice", "response_format": "wav"|"pcm", "speed", "model"}
      The audio is streamed as it is made, one sentence at a time (HTTP chunked encoding): a WAV
      header with open-ended sizes (as OpenAI's streamed WAV), then 16-bit mono PCM at 24 kHz.
Errors are {"error": {"message", "type"}} with a 4xx status.
"""
import argparse
import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
from kokoro_onnx import Kokoro

SAMPLE_RATE = 24000
FORMATS = {"wav": "audio/wav", "pcm": "audio/pcm"}


def wav_header() -> bytes:
    """A 44-byte PCM WAV header whose sizes say 'unknown' (0xFFFFFFFF), for a stream."""
    rate, bits, ch = SAMPLE_RATE, 16, 1
    return (b"RIFF" + (0xFFFFFFFF).to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little")
            + (1).to_bytes(2, "little") + ch.to_bytes(2, "little") + rate.to_bytes(4, "little")
            + (rate * ch * bits // 8).to_bytes(4, "little") + (ch * bits // 8).to_bytes(2, "little")
            + bits.to_bytes(2, "little") + b"data" + (0xFFFFFFFF).to_bytes(4, "little"))


def sentences(text: str):
    """The text in pieces of whole sentences, so the first audio comes after the first one."""
    parts = [p.strip() for p in re.split(r"(?<=[.!?;:])\s+|\n+", text)]
    return [p for p in parts if p]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    kokoro: Kokoro = None
    voices: list = []
    lock = threading.Lock()

    def log_message(self, fmt, *args):
        sys.stderr.write("koko: " + (fmt % args) + "\n")

    def send_json(self, status, value):
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def error(self, status, message):
        self.send_json(status, {"error": {"message": message, "type": "invalid_request_error"}})

    def do_GET(self):
        if self.path in ("/", "/health"):
            self.send_json(200, {"status": "ok"})
        elif self.path == "/v1/audio/voices":
            self.send_json(200, {"voices": self.voices})
        else:
            self.error(404, f"no route {self.path}")

    def do_POST(self):
        if self.path != "/v1/audio/speech":
            return self.error(404, f"no route {self.path}")
        try:
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        except ValueError as e:
            return self.error(400, f"invalid JSON: {e}")
        text = req.get("input")
        voice = req.get("voice") or self.voices[0]
        fmt = req.get("response_format") or "wav"
        speed = req.get("speed", 1.0)
        if not isinstance(text, str) or not text.strip():
            return self.error(400, "'input' must be non-empty text")
        if voice not in self.voices:
            return self.error(400, f"unknown voice '{voice}': this model has {', '.join(self.voices)}")
        if fmt not in FORMATS:
            return self.error(400, f"unsupported response_format '{fmt}': this backend writes {', '.join(FORMATS)}")
        if not isinstance(speed, (int, float)) or not 0.5 <= speed <= 2.0:
            return self.error(400, f"speed must be a number from 0.5 to 2.0, got {speed!r}")
        self.send_response(200)
        self.send_header("Content-Type", FORMATS[fmt])
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(data: bytes):
            self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        if fmt == "wav":
            chunk(wav_header())
        for piece in sentences(text):
            with self.lock:  # one ONNX Runtime session, one synthesis at a time
                samples, _ = self.kokoro.create(piece, voice=voice, speed=float(speed), lang="en-us")
            chunk((np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes())
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def main():
    p = argparse.ArgumentParser(prog="koko")
    p.add_argument("--index")
    p.add_argument("-m", "--model")
    p.add_argument("-d", "--voices")
    p.add_argument("mode", choices=["openai"])
    p.add_argument("--ip", default="127.0.0.1")
    p.add_argument("--port", type=int, default=3000)
    a = p.parse_args()
    if a.index:
        index = Path(a.index)
        spec = json.loads(index.read_text())
        a.model, a.voices = str(index.parent / spec["model"]), str(index.parent / spec["voices"])
    if not (a.model and a.voices):
        p.error("give --index, or -m and -d")
    Handler.kokoro = Kokoro(a.model, a.voices)
    Handler.voices = sorted(Handler.kokoro.get_voices())
    server = ThreadingHTTPServer((a.ip, a.port), Handler)
    print(f"koko: listening on http://{a.ip}:{a.port} with voices {', '.join(Handler.voices)}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
