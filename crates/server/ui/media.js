// Audio & images: transcribe an uploaded file or a recording (recorded in the page and turned
// into a 16 kHz 16-bit WAV, since browsers record WebM and whisper-server reads WAV), generate
// an image, and speak a text.

import { api, form, raw, ApiError } from "./api.js";
import { h, fill, field, toast } from "./dom.js";

export function mount(main) {
  const pick = (id) => h("select", { id }, h("option", { value: "" }, "Loading…"));
  const sttModel = pick("stt-model");
  const imgModel = pick("img-model");
  const ttsModel = pick("tts-model");

  // Transcription
  const audioFile = h("input", { id: "stt-file", type: "file", accept: "audio/*,.wav,.mp3,.flac,.ogg" });
  const sttOut = h("pre", { id: "stt-out", class: "card", "aria-live": "polite" });
  const recordBtn = h("button", { type: "button", class: "secondary", id: "stt-record" }, "Record");
  let recording = null;
  let recorded = null;
  recordBtn.addEventListener("click", async () => {
    if (recording) { recording.stop(); return; }
    try {
      const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
      const rec = new MediaRecorder(stream);
      const chunks = [];
      rec.ondataavailable = (e) => chunks.push(e.data);
      rec.onstop = async () => {
        stream.getTracks().forEach((t) => t.stop());
        recording = null;
        recordBtn.textContent = "Record";
        recorded = await toWav(new Blob(chunks, { type: rec.mimeType }));
        sttOut.textContent = `Recorded ${(recorded.size / 32000).toFixed(1)} s. Press Transcribe.`;
      };
      rec.start();
      recording = rec;
      recordBtn.textContent = "Stop recording";
    } catch (e) {
      toast(`Cannot record: ${e.message}`, "bad");
    }
  });
  audioFile.addEventListener("change", () => { recorded = null; });
  const transcribe = async (ev) => {
    ev.preventDefault();
    const file = recorded || audioFile.files[0];
    if (!file) { toast("Choose an audio file or record one first.", "bad"); return; }
    const fd = new FormData();
    fd.append("file", file, recorded ? "recording.wav" : file.name);
    fd.append("model", sttModel.value);
    sttOut.textContent = "Transcribing…";
    try {
      const r = await (await form("/api/v1/audio/transcriptions", fd)).json();
      sttOut.textContent = r.text.trim();
      sttOut.dataset.done = "true";
    } catch (e) {
      sttOut.textContent = `Error: ${e.message}`;
    }
  };

  // Images
  const prompt = h("textarea", { id: "img-prompt", rows: 2, placeholder: "a lemon on a wooden table" });
  const size = h("select", { id: "img-size" }, ["256x256", "512x512", "768x768", "1024x1024"].map((s) => h("option", { value: s }, s)));
  const steps = h("input", { id: "img-steps", type: "number", min: 1, max: 150, value: 1 });
  const imgOut = h("div", { id: "img-out", "aria-live": "polite" });
  const generate = async (ev) => {
    ev.preventDefault();
    fill(imgOut, h("p", { class: "muted" }, "Generating…"));
    try {
      const r = await api("/api/v1/images/generations", { model: imgModel.value, prompt: prompt.value, size: size.value, steps: Number(steps.value), response_format: "b64_json" });
      fill(imgOut, r.data.map((d) => h("img", { class: "generated", src: `data:image/png;base64,${d.b64_json}`, alt: `Generated: ${prompt.value}` })));
    } catch (e) {
      fill(imgOut, h("p", {}, `Error: ${e.message}`));
    }
  };

  // Speech
  const text = h("textarea", { id: "tts-text", rows: 2 }, "Hello from lemonade.");
  const voice = h("input", { id: "tts-voice", type: "text", placeholder: "the model's first voice" });
  const speed = h("input", { id: "tts-speed", type: "number", min: 0.5, max: 2, step: 0.1, value: 1 });
  const ttsOut = h("div", { id: "tts-out", "aria-live": "polite" });
  const speak = async (ev) => {
    ev.preventDefault();
    fill(ttsOut, h("p", { class: "muted" }, "Speaking…"));
    try {
      const body = { model: ttsModel.value, input: text.value, speed: Number(speed.value), response_format: "wav" };
      if (voice.value.trim()) body.voice = voice.value.trim();
      const res = await raw("/api/v1/audio/speech", { method: "POST", body: JSON.stringify(body) });
      if (!res.ok) throw new ApiError(res.status, await res.json().catch(() => null));
      const url = URL.createObjectURL(await res.blob());
      fill(ttsOut, h("audio", { controls: true, src: url, id: "tts-audio" }));
    } catch (e) {
      fill(ttsOut, h("p", {}, `Error: ${e.message}`));
    }
  };

  main.append(h("h1", {}, "Audio & images"),
    h("div", { class: "grid2" },
      h("section", { class: "card", "aria-labelledby": "h-stt" }, h("h2", { id: "h-stt" }, "Speech to text"),
        h("form", { onsubmit: transcribe }, field("Model", sttModel), field("Audio file", audioFile),
          h("div", { class: "row" }, recordBtn, h("button", { type: "submit", id: "stt-go" }, "Transcribe"))),
        sttOut),
      h("section", { class: "card", "aria-labelledby": "h-img" }, h("h2", { id: "h-img" }, "Image generation"),
        h("form", { onsubmit: generate }, field("Model", imgModel), field("Prompt", prompt),
          h("div", { class: "row" }, field("Size", size), field("Steps", steps)),
          h("button", { type: "submit", id: "img-go" }, "Generate")),
        imgOut),
      h("section", { class: "card", "aria-labelledby": "h-tts" }, h("h2", { id: "h-tts" }, "Text to speech"),
        h("form", { onsubmit: speak }, field("Model", ttsModel), field("Text", text),
          h("div", { class: "row" }, field("Voice", voice), field("Speed", speed)),
          h("button", { type: "submit", id: "tts-go" }, "Speak")),
        ttsOut)));

  api("/api/v1/models").then((r) => {
    for (const [sel, type] of [[sttModel, "audio"], [imgModel, "image"], [ttsModel, "tts"]]) {
      const ms = (r.data || []).filter((m) => m.type === type);
      fill(sel, ms.length ? ms.map((m) => h("option", { value: m.id }, m.id)) : h("option", { value: "" }, `No ${type} model downloaded`));
    }
  }).catch((e) => toast(`Cannot list models: ${e.message}`, "bad"));
  return () => { if (recording) recording.stop(); };
}

/** A recording (any container the browser decodes) → 16 kHz mono 16-bit WAV. */
async function toWav(blob) {
  const ctx = new AudioContext();
  const decoded = await ctx.decodeAudioData(await blob.arrayBuffer());
  ctx.close();
  const rate = 16000;
  const off = new OfflineAudioContext(1, Math.max(1, Math.ceil(decoded.duration * rate)), rate);
  const src = off.createBufferSource();
  src.buffer = decoded;
  src.connect(off.destination);
  src.start();
  const pcm = (await off.startRendering()).getChannelData(0);
  const buf = new DataView(new ArrayBuffer(44 + pcm.length * 2));
  const str = (o, s) => [...s].forEach((c, i) => buf.setUint8(o + i, c.charCodeAt(0)));
  str(0, "RIFF"); buf.setUint32(4, 36 + pcm.length * 2, true); str(8, "WAVE"); str(12, "fmt ");
  buf.setUint32(16, 16, true); buf.setUint16(20, 1, true); buf.setUint16(22, 1, true);
  buf.setUint32(24, rate, true); buf.setUint32(28, rate * 2, true); buf.setUint16(32, 2, true); buf.setUint16(34, 16, true);
  str(36, "data"); buf.setUint32(40, pcm.length * 2, true);
  pcm.forEach((v, i) => buf.setInt16(44 + i * 2, Math.max(-1, Math.min(1, v)) * 0x7fff, true));
  return new Blob([buf], { type: "audio/wav" });
}
