"""Transcription through lemonade with the official openai SDK (run by crates/cli/tests/audio.rs):
speech that espeak-ng made from a known sentence must come back as most of its words, in every
response format, and bad input must raise the SDK's 4xx errors. A failure exits non-zero
naming what was wrong."""

import re
import sys
import wave

import openai

base, model, wav, sentence, llm = sys.argv[1:6]
client = openai.OpenAI(base_url=f"{base}/api/v1", api_key="unused", max_retries=0, timeout=120)


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


def words(text):
    return re.findall(r"[a-z']+", text.lower())


def heard(text, what):
    want = words(sentence)
    got = set(words(text))
    hits = [w for w in want if w in got]
    check(len(hits) * 4 >= len(want) * 3, f"{what}: heard {text!r}, expected most words of {sentence!r}")


def transcribe(fmt=None, **kw):
    with open(wav, "rb") as f:
        if fmt is None:
            return client.audio.transcriptions.create(model=model, file=f, **kw)
        return client.audio.transcriptions.create(model=model, file=f, response_format=fmt, **kw)


r = transcribe()
heard(r.text, "json")

text = transcribe("text")
check(isinstance(text, str), f"text format gave {type(text)}")
heard(text, "text")

srt = transcribe("srt")
check(" --> " in srt and re.search(r"^1\s*$", srt, re.M), f"srt: {srt!r}")
heard(srt, "srt")

vtt = transcribe("vtt")
check(vtt.startswith("WEBVTT") and " --> " in vtt, f"vtt: {vtt!r}")
heard(vtt, "vtt")

with wave.open(wav) as w:
    seconds = w.getnframes() / w.getframerate()
v = transcribe("verbose_json", language="en", temperature=0)
check(abs(float(v.duration) - seconds) < 0.5, f"verbose_json duration {v.duration} for {seconds:.2f} s of audio")
check(len(v.segments) >= 1 and v.segments[-1].end <= seconds + 1, f"verbose_json segments {v.segments}")
heard(v.text, "verbose_json")

with open(wav, "rb") as f:
    t = client.audio.translations.create(model=model, file=f)
heard(t.text, "translation (an English-only model transcribes)")

# Bad input: the SDK raises its typed 4xx errors with lemonade's messages.
try:
    with open(wav, "rb") as f:
        client.audio.transcriptions.create(model=llm, file=f)
    check(False, "an LLM transcribed")
except openai.BadRequestError as e:
    check("needs an audio model" in str(e), f"LLM on the audio endpoint: {e}")

try:
    client.audio.transcriptions.create(model=model, file=("notes.txt", b"these are not sounds", "text/plain"))
    check(False, "a text file was transcribed")
except openai.BadRequestError as e:
    check("'notes.txt' is not audio" in str(e), f"non-audio upload: {e}")

try:
    with open(wav, "rb") as f:
        client.audio.transcriptions.create(model=model, file=f, response_format="mp3")
    check(False, "response_format mp3 was accepted")
except openai.BadRequestError as e:
    check("Unsupported response_format 'mp3'" in str(e), f"bad response_format: {e}")

try:
    with open(wav, "rb") as f:
        client.audio.transcriptions.create(model="user.No-Such-Model", file=f)
    check(False, "an unknown model transcribed")
except openai.NotFoundError as e:
    check("No-Such-Model" in str(e), f"unknown model: {e}")

print("every check held")
