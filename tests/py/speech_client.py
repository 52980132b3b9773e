"""Text to speech through lemonade with the official openai SDK (run by crates/cli/tests/speech.rs):
Kokoro's WAV must decode and last a plausible time for its text, its PCM likewise, the stream
must arrive in pieces, and, speech to text closing the loop, Whisper must hear most of the
words back. Bad input must raise the SDK's 4xx errors. A failure exits non-zero naming what was
wrong."""

import io
import re
import struct
import sys
import time
import wave

import openai

base, tts, voice, stt, sentence, llm = sys.argv[1:7]
client = openai.OpenAI(base_url=f"{base}/api/v1", api_key="unused", max_retries=0, timeout=300)


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


def words(text):
    return re.findall(r"[a-z']+", text.lower())


def closed_wav(data):
    """The streamed WAV with its open-ended sizes (0xFFFFFFFF) written in, as a player would."""
    check(data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt ", f"not a WAV: {data[:16]!r}")
    check(data[36:40] == b"data", f"no data chunk at byte 36: {data[:44]!r}")
    n = len(data) - 44
    return data[:4] + struct.pack("<I", 36 + n) + data[8:40] + struct.pack("<I", n) + data[44:]


# Seconds a sentence of n words may plausibly take: 0.15 to 1.2 s a word.
def plausible(seconds, n):
    return 0.15 * n <= seconds <= 1.2 * n + 1.0


# 1. A whole WAV: it decodes, 24 kHz mono 16-bit, and lasts a plausible time.
audio = client.audio.speech.create(model=tts, voice=voice, input=sentence, response_format="wav").content
with wave.open(io.BytesIO(closed_wav(audio))) as w:
    check((w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2), f"WAV params {w.getparams()}")
    seconds = w.getnframes() / w.getframerate()
    frames = w.readframes(w.getnframes())
check(plausible(seconds, len(words(sentence))), f"{seconds:.2f} s of speech for {sentence!r}")
peak = max(abs(s) for s in struct.unpack(f"<{len(frames) // 2}h", frames))
check(peak > 1000, f"the speech is silent (peak {peak})")

# 2. Speech to text closes the loop: Whisper hears most of the words.
heard = client.audio.transcriptions.create(model=stt, file=("kokoro.wav", closed_wav(audio), "audio/wav")).text
hits = [w for w in words(sentence) if w in set(words(heard))]
check(len(hits) * 4 >= len(words(sentence)) * 3, f"Whisper heard {heard!r} for {sentence!r}")

# 3. Raw PCM, faster: shorter than the WAV's samples.
pcm = client.audio.speech.create(model=tts, voice=voice, input=sentence, response_format="pcm", speed=1.5).content
check(len(pcm) % 2 == 0 and 0 < len(pcm) < len(frames), f"{len(pcm)} PCM bytes at speed 1.5 against {len(frames)}")

# 4. Streamed: three sentences arrive in more than one piece, the first before the last is made.
text = " ".join([sentence] * 3)
asked = time.monotonic()
with client.audio.speech.with_streaming_response.create(model=tts, voice=voice, input=text, response_format="pcm") as r:
    check("content-length" not in r.headers, f"a streamed answer has no length: {dict(r.headers)}")
    arrivals = [(time.monotonic() - asked, len(c)) for c in r.iter_bytes() if c]
pieces = [n for _, n in arrivals]
check(len(pieces) >= 3 and sum(pieces) > len(pcm), f"stream pieces {pieces}")
# Streaming, not a whole answer cut in pieces: the first audio arrives while the rest is still
# being made (Kokoro makes one sentence at a time), well before the last piece, whatever the
# machine's speed (a ratio of two times of the same run, not a time limit).
first, last = arrivals[0][0], arrivals[-1][0]
check(first < 0.75 * last, f"the first piece came at {first:.2f} s and the last at {last:.2f} s: not streamed")


def refused(what, call, needle):
    try:
        call()
        check(False, f"{what} was accepted")
    except openai.BadRequestError as e:
        check(needle in str(e), f"{what}: {e}")


refused("an empty input", lambda: client.audio.speech.create(model=tts, voice=voice, input="  "), "'input' must not be empty")
refused("mp3", lambda: client.audio.speech.create(model=tts, voice=voice, input="Hi.", response_format="mp3"),
        "Unsupported response_format 'mp3'")
refused("speed 3", lambda: client.audio.speech.create(model=tts, voice=voice, input="Hi.", speed=3), "'speed'")
refused("an unknown voice", lambda: client.audio.speech.create(model=tts, voice="af_nobody", input="Hi."),
        "unknown voice 'af_nobody'")
refused("an LLM", lambda: client.audio.speech.create(model=llm, voice=voice, input="Hi."), "needs a tts model")
print("every check held")
