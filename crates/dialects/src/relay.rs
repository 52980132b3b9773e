//! A backend's streamed answer on its way to the client, sans-IO: the server's byte pipe feeds
//! each chunk to [`Relay::chunk`] and sends what comes back. The chunk passes as it is (no
//! copy), with a remote model's id echoed as the client asked for it ([`EchoLines`]), or
//! translated into another dialect one SSE event at a time ([`StreamTranslator`]). The end
//! ([`Relay::ended`]) adds `[DONE]` where the backend left it out; a failure part way
//! ([`Relay::failed`]) is the dialect's error frame. The stream's last bytes are kept
//! ([`Relay::tail`]) to read its usage from.

use bytes::{Bytes, BytesMut};
use serde_json::Value;

use crate::echo::EchoLines;
use crate::{SseDecoder, StreamTranslator};

/// Bytes of a stream kept to find the last usage/timings chunk and the `[DONE]` marker.
const TAIL_KEEP: usize = 16 * 1024;
const DONE: &[u8] = b"data: [DONE]";

pub struct Relay {
    /// A remote model's stream: its model id echoed as the client asked for it.
    echo: Option<EchoLines>,
    /// Another dialect's translator, and the decoder that feeds it events.
    translate: Option<(Box<dyn StreamTranslator>, SseDecoder)>,
    tail: BytesMut,
}

impl Relay {
    pub fn new(translate: Option<Box<dyn StreamTranslator>>, echo: Option<EchoLines>) -> Relay {
        Relay { echo, translate: translate.map(|t| (t, SseDecoder::default())), tail: BytesMut::new() }
    }

    /// The answer's `Content-Type`: SSE, or the translation's.
    pub fn content_type(&self) -> &'static str {
        self.translate.as_ref().map_or("text/event-stream", |(t, _)| t.content_type())
    }

    /// What to send for `chunk`: the chunk itself, or its translation (None: nothing yet, as
    /// for part of an event, which is not sent empty).
    pub fn chunk(&mut self, chunk: Bytes) -> Option<Bytes> {
        self.keep_tail(&chunk);
        let chunk = match &mut self.echo {
            Some(e) => Bytes::from(e.push(&chunk)),
            None => chunk,
        };
        if chunk.is_empty() {
            return None;
        }
        let Some((t, sse)) = &mut self.translate else { return Some(chunk) };
        let mut out = Vec::new();
        for data in sse.push(&chunk) {
            translate_event(t.as_mut(), &data, &mut out);
        }
        (!out.is_empty()).then(|| Bytes::from(out))
    }

    /// What keeps the connection alive while the backend has sent nothing yet, saying `words`
    /// (`prefill 3 s`): an SSE comment, or the translation's own (Ollama's empty chunk).
    pub fn keepalive(&mut self, words: &str) -> Bytes {
        match &mut self.translate {
            Some((t, _)) => Bytes::from(t.keepalive(words)),
            None => Bytes::from(format!(": {words}\n\n")),
        }
    }

    /// The frame that ends a stream the backend broke off.
    pub fn failed(&mut self, msg: &str) -> Bytes {
        match &mut self.translate {
            Some((t, _)) => Bytes::from(t.error(msg)),
            None => error_frame(msg),
        }
    }

    /// What to send once the backend's stream has ended: a translation's end, or `[DONE]`
    /// when the backend left it out.
    pub fn ended(&mut self) -> Option<Bytes> {
        let rest = Bytes::from(self.echo.as_mut().map(EchoLines::rest).unwrap_or_default());
        if let Some((t, sse)) = &mut self.translate {
            let mut out = Vec::new();
            for data in sse.push(&rest) {
                translate_event(t.as_mut(), &data, &mut out);
            }
            if let Some(data) = sse.finish() {
                translate_event(t.as_mut(), &data, &mut out);
            }
            out.extend(t.end());
            return Some(Bytes::from(out));
        }
        let done = self.tail.windows(DONE.len()).any(|w| w == DONE);
        let mut out = BytesMut::from(&rest[..]);
        if !done {
            out.extend_from_slice(b"data: [DONE]\n\n");
        }
        (!out.is_empty()).then(|| out.freeze())
    }

    /// The stream's last bytes as the backend sent them (at least 16 KiB, when it sent that).
    pub fn tail(&self) -> &[u8] {
        &self.tail
    }

    fn keep_tail(&mut self, chunk: &[u8]) {
        self.tail.extend_from_slice(chunk);
        if self.tail.len() > 2 * TAIL_KEEP {
            let cut = self.tail.len() - TAIL_KEEP;
            let _ = self.tail.split_to(cut);
        }
    }
}

/// One upstream event's payload through `t`: a chunk, or the backend's own error frame as
/// the dialect's error (`[DONE]`, not JSON, adds nothing).
fn translate_event(t: &mut dyn StreamTranslator, data: &str, out: &mut Vec<u8>) {
    match serde_json::from_str::<Value>(data) {
        Ok(v) if v.get("error").is_some() => {
            let e = &v["error"];
            out.extend(t.error(e["message"].as_str().or(e.as_str()).unwrap_or("the backend failed")));
        }
        Ok(v) => out.extend(t.chunk(&v)),
        Err(_) => {}
    }
}

/// An SSE frame carrying an error, as Lemonade writes them (`type: streaming_error`).
pub fn error_frame(message: &str) -> Bytes {
    let v = serde_json::json!({"error": {"message": message, "type": "streaming_error"}});
    Bytes::from(format!("data: {v}\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ollama::NdjsonStream;

    fn text(b: &[Bytes]) -> String {
        b.iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect()
    }

    #[test]
    fn a_passed_chunk_is_the_same_bytes_and_done_is_added_only_when_missing() {
        let mut r = Relay::new(None, None);
        let chunk = Bytes::from_static(b"data: {\"choices\":[]}\n\n");
        let out = r.chunk(chunk.clone()).unwrap();
        assert_eq!(out.as_ptr(), chunk.as_ptr(), "passed through without a copy");
        assert_eq!(r.ended().unwrap(), Bytes::from_static(b"data: [DONE]\n\n"));
        let mut r = Relay::new(None, None);
        r.chunk(Bytes::from_static(b"data: {}\n\ndata: [DONE]\n\n"));
        assert_eq!(r.ended(), None, "the backend's own [DONE] is not doubled");
        assert_eq!(r.content_type(), "text/event-stream");
    }

    #[test]
    fn a_remote_id_split_across_chunks_is_echoed_and_the_rest_is_sent_at_the_end() {
        let mut r = Relay::new(None, Some(EchoLines::new("gpt-x", "up.gpt-x")));
        assert_eq!(r.chunk(Bytes::from_static(b"data: {\"model\":\"gp")), None, "half a line waits");
        let a = r.chunk(Bytes::from_static(b"t-x\"}\n\ndata: {\"model\":\"gpt-x\"}")).unwrap();
        let b = r.ended().unwrap();
        let all = text(&[a, b]);
        assert_eq!(all.matches("\"model\":\"up.gpt-x\"").count(), 2, "{all}");
        assert!(all.ends_with("data: [DONE]\n\n"), "{all}");
    }

    #[test]
    fn a_translated_stream_waits_for_whole_events_and_ends_in_its_dialect() {
        let mut r = Relay::new(Some(Box::new(NdjsonStream::chat("m", "t"))), None);
        assert_eq!(r.content_type(), "application/x-ndjson");
        assert_eq!(r.chunk(Bytes::from_static(b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi")), None);
        let a = r.chunk(Bytes::from_static(b"\"}}]}\n\n")).unwrap();
        assert!(String::from_utf8_lossy(&a).contains("\"content\":\"Hi\""), "{a:?}");
        let end = String::from_utf8_lossy(&r.ended().unwrap()).into_owned();
        assert!(end.contains("\"done\":true"), "{end}");
        // The backend's own error frame becomes the dialect's error.
        let mut r = Relay::new(Some(Box::new(NdjsonStream::chat("m", "t"))), None);
        let e = r.chunk(Bytes::from_static(b"data: {\"error\":{\"message\":\"boom\"}}\n\n")).unwrap();
        assert!(String::from_utf8_lossy(&e).contains("boom"), "{e:?}");
        assert!(String::from_utf8_lossy(&r.failed("cut")).contains("cut"));
    }

    #[test]
    fn a_failure_is_a_streaming_error_frame_and_the_tail_keeps_the_last_bytes() {
        let mut r = Relay::new(None, None);
        let f = r.failed("boom \"quoted\"\nline");
        let s = std::str::from_utf8(&f).unwrap();
        assert!(s.starts_with("data: ") && s.ends_with("\n\n"));
        let v: Value = serde_json::from_str(s.trim_start_matches("data: ").trim()).unwrap();
        assert_eq!(v["error"]["type"], "streaming_error");
        assert_eq!(v["error"]["message"], "boom \"quoted\"\nline");
        for _ in 0..100 {
            r.chunk(Bytes::from(vec![b'x'; 1024]));
        }
        r.chunk(Bytes::from_static(b"data: {\"usage\":{}}\n\n"));
        assert!(r.tail().len() <= 2 * TAIL_KEEP && r.tail().len() >= TAIL_KEEP, "{}", r.tail().len());
        assert!(r.tail().ends_with(b"data: {\"usage\":{}}\n\n"));
    }
}
