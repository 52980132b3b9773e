//! A field added to an answer's JSON as it passes (the route a router collection took, as
//! `x_lemonade_route`): into a whole JSON body, or into the first event of an SSE or NDJSON
//! stream, as bytes come (sans-IO: the caller feeds chunks and sends what comes back).

use serde_json::Value;

/// `body` with `key: value` added when it is a JSON object (None: it is not).
pub fn with_field(body: &[u8], key: &str, value: &Value) -> Option<Vec<u8>> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(mut o)) => {
            o.insert(key.into(), value.clone());
            serde_json::to_vec(&o).ok()
        }
        _ => None,
    }
}

/// A stream's first event with data, held until it ends and then given `key: value`;
/// comments before it (`: queued 2` while the request waits) pass as they are, and everything
/// after it passes untouched.
pub struct FirstEvent {
    key: String,
    /// The field, until the first event went out.
    value: Option<Value>,
    buf: Vec<u8>,
    /// How an event ends: `\n\n` (SSE) or `\n` (NDJSON).
    end: &'static [u8],
}

impl FirstEvent {
    pub fn new(key: &str, value: Value, ndjson: bool) -> FirstEvent {
        let end: &'static [u8] = if ndjson { b"\n" } else { b"\n\n" };
        FirstEvent { key: key.into(), value: Some(value), buf: Vec::new(), end }
    }

    /// What of the stream can go out once `chunk` came.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        let Some(value) = &self.value else { return chunk.to_vec() };
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(at) = self.buf.windows(self.end.len()).position(|w| w == self.end) {
            if self.buf.starts_with(b":") {
                out.extend(self.buf.drain(..at + self.end.len()));
                continue;
            }
            let (event, rest) = self.buf.split_at(at);
            out.extend(inject(event, &self.key, value));
            out.extend_from_slice(rest);
            self.buf.clear();
            self.value = None;
            break;
        }
        out
    }

    /// What was held back, when the stream ends before its first event did (as it came).
    pub fn rest(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

/// One SSE event with `key: value` in its `data:` JSON, or one NDJSON line with it in its JSON
/// (unchanged if it has none).
fn inject(event: &[u8], key: &str, value: &Value) -> Vec<u8> {
    if let Some(v) = with_field(event, key, value) {
        return v;
    }
    let text = String::from_utf8_lossy(event);
    let lines: Vec<String> = text
        .lines()
        .map(|l| match l.strip_prefix("data: ").map(serde_json::from_str::<Value>) {
            Some(Ok(Value::Object(mut o))) => {
                o.insert(key.into(), value.clone());
                format!("data: {}", Value::Object(o))
            }
            _ => l.to_string(),
        })
        .collect();
    lines.join("\n").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_first_sse_event_gets_the_field_across_chunks_and_comments_pass() {
        let mut f = FirstEvent::new("r", json!(1), false);
        let mut out = f.push(b": queued 1\n\ndata: {\"a\"");
        assert_eq!(out, b": queued 1\n\n");
        out.extend(f.push(b":0}\n\ndata: {\"b\":0}\n\n"));
        out.extend(f.push(b"data: {\"c\":0}\n\n"));
        out.extend(f.rest());
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text, ": queued 1\n\ndata: {\"a\":0,\"r\":1}\n\ndata: {\"b\":0}\n\ndata: {\"c\":0}\n\n");
    }

    #[test]
    fn an_ndjson_line_gets_it_and_a_cut_stream_keeps_what_came() {
        let mut f = FirstEvent::new("r", json!("x"), true);
        assert_eq!(f.push(b"{\"a\":0}\n{\"b\":0}\n"), b"{\"a\":0,\"r\":\"x\"}\n{\"b\":0}\n");
        let mut cut = FirstEvent::new("r", json!(1), false);
        assert!(cut.push(b"data: {\"a\"").is_empty());
        assert_eq!(cut.rest(), b"data: {\"a\"");
        assert_eq!(with_field(b"[1]", "r", &json!(1)), None);
    }

    #[test]
    fn the_decision_goes_into_the_first_event_only() {
        let v = json!({"route_to": "A"});
        let out = inject(b"data: {\"id\":\"1\"}", "x_lemonade_route", &v);
        assert_eq!(String::from_utf8(out).unwrap(), r#"data: {"id":"1","x_lemonade_route":{"route_to":"A"}}"#);
        assert_eq!(inject(b"data: [DONE]", "x_lemonade_route", &v), b"data: [DONE]");
        let mut f = FirstEvent::new("x_lemonade_route", v.clone(), false);
        let out = f.push(b": queued 1\n\n: loading 0 s\n\ndata: {}\n\ndata: [DONE]\n\n");
        assert!(f.value.is_none(), "done");
        let want =
            ": queued 1\n\n: loading 0 s\n\ndata: {\"x_lemonade_route\":{\"route_to\":\"A\"}}\n\ndata: [DONE]\n\n";
        assert_eq!(String::from_utf8(out).unwrap(), want, "comments pass, the first data event gets it");
        let line = inject(br#"{"model":"A","done":false}"#, "x_lemonade_route", &v);
        assert_eq!(
            String::from_utf8(line).unwrap(),
            r#"{"done":false,"model":"A","x_lemonade_route":{"route_to":"A"}}"#
        );
    }
}
