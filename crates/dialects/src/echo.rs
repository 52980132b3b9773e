//! A remote model's answers with the id the client asked for: an upstream names its model
//! `gpt-x`, the client asked for `provider.gpt-x`, and reads back what it asked for, in a
//! whole answer ([`echo_model`]) or a stream ([`EchoLines`]).

/// `json` (an upstream's whole answer, or one line of its stream) with every
/// `"model": "<upstream>"` naming `requested` instead, so a client reads back the id it asked
/// for (`<provider>.<id>`), as local models answer with theirs. The bytes are edited where that
/// exact key and value stand, nothing else changes (a JSON string cannot hold the pattern
/// unescaped, so text inside a message is never touched). `user.<upstream>` counts as the
/// upstream's id too: a lemonade upstream lists a registered model by its bare name and its
/// answers name it `user.X`. None: nothing names `upstream`.
pub fn echo_model(json: &[u8], upstream: &str, requested: &str) -> Option<Vec<u8>> {
    let wants = [serde_json::to_string(upstream).ok()?, serde_json::to_string(&format!("user.{upstream}")).ok()?];
    let with = serde_json::to_string(requested).ok()?;
    const KEY: &[u8] = b"\"model\"";
    let skip_ws = |mut j: usize| {
        while json.get(j).is_some_and(|b| b.is_ascii_whitespace()) {
            j += 1;
        }
        j
    };
    let (mut out, mut copied, mut from) = (Vec::new(), 0, 0);
    while let Some(at) = json[from..].windows(KEY.len()).position(|w| w == KEY) {
        let colon = skip_ws(from + at + KEY.len());
        from = from + at + KEY.len();
        if json.get(colon) != Some(&b':') {
            continue;
        }
        let value = skip_ws(colon + 1);
        if let Some(want) = wants.iter().find(|w| json[value..].starts_with(w.as_bytes())) {
            out.extend_from_slice(&json[copied..value]);
            out.extend_from_slice(with.as_bytes());
            copied = value + want.len();
            from = copied;
        }
    }
    (copied > 0).then(|| {
        out.extend_from_slice(&json[copied..]);
        out
    })
}

/// A remote stream's lines with the requested id in place of the upstream's (see
/// [`echo_model`]): whole lines are passed on as they complete; a line split across chunks
/// waits for its end (one event, at most), so no id is missed at a chunk boundary.
pub struct EchoLines {
    upstream: String,
    requested: String,
    partial: Vec<u8>,
}

impl EchoLines {
    pub fn new(upstream: &str, requested: &str) -> EchoLines {
        EchoLines { upstream: upstream.into(), requested: requested.into(), partial: Vec::new() }
    }

    /// The complete lines `chunk` finishes, echoed; the rest waits.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.partial.extend_from_slice(chunk);
        let Some(end) = self.partial.iter().rposition(|b| *b == b'\n') else { return Vec::new() };
        let rest = self.partial.split_off(end + 1);
        let lines = std::mem::replace(&mut self.partial, rest);
        self.echo(lines)
    }

    /// What is left at the end of the stream.
    pub fn rest(&mut self) -> Vec<u8> {
        let rest = std::mem::take(&mut self.partial);
        self.echo(rest)
    }

    fn echo(&self, lines: Vec<u8>) -> Vec<u8> {
        echo_model(&lines, &self.upstream, &self.requested).unwrap_or(lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_echo_the_requested_id_and_nothing_else_changes() {
        let whole =
            br#"{"id":"c1","model":"up-model","choices":[{"message":{"content":"the \"model\":\"up-model\" said"}}]}"#;
        let echoed = echo_model(whole, "up-model", "up.up-model").unwrap();
        assert_eq!(
            String::from_utf8(echoed).unwrap(),
            r#"{"id":"c1","model":"up.up-model","choices":[{"message":{"content":"the \"model\":\"up-model\" said"}}]}"#
        );
        let line = b"data: {\"model\" : \"a/b\\\"c\", \"x\":1}";
        assert_eq!(echo_model(line, "a/b\"c", "p.a/b\"c").unwrap(), b"data: {\"model\" : \"p.a/b\\\"c\", \"x\":1}");
        assert_eq!(echo_model(br#"{"model":"other"}"#, "up-model", "up.up-model"), None);
        assert_eq!(
            echo_model(br#"{"model":"up-model-2"}"#, "up-model", "up.up-model"),
            None,
            "a longer id is another id"
        );
        assert_eq!(echo_model(b"data: [DONE]", "up-model", "up.up-model"), None);
        // A lemonade upstream's own name for a model it lists bare.
        assert_eq!(echo_model(br#"{"model":"user.Smol"}"#, "Smol", "peer.Smol").unwrap(), br#"{"model":"peer.Smol"}"#);
    }

    #[test]
    fn echo_lines_rewrites_an_id_split_across_chunks() {
        let mut e = EchoLines::new("gpt-x", "up.gpt-x");
        let mut out = e.push(b"data: {\"model\":\"gp");
        assert!(out.is_empty(), "half a line waits");
        out.extend(e.push(b"t-x\",\"n\":1}\n\ndata: {\"model\":\"gpt-x\"}"));
        out.extend(e.rest());
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches("\"model\":\"up.gpt-x\"").count(), 2, "{text}");
        assert!(!text.contains("\"gpt-x\""), "{text}");
    }
}
