//! Splits an SSE byte stream into its `data:` payloads, however the bytes are cut.

/// Feed it bytes as they come; it returns the complete `data:` payloads (an event's data
/// lines joined with `\n`), and keeps a partial line for the next call.
#[derive(Debug, Default)]
pub struct SseDecoder {
    line: Vec<u8>,
    data: Option<String>,
}

impl SseDecoder {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        for &b in bytes {
            if b != b'\n' {
                self.line.push(b);
                continue;
            }
            let line = std::mem::take(&mut self.line);
            let line = line.strip_suffix(b"\r").unwrap_or(&line);
            if line.is_empty() {
                out.extend(self.data.take());
            } else if let Some(d) = line.strip_prefix(b"data:") {
                let d = String::from_utf8_lossy(d.strip_prefix(b" ").unwrap_or(d)).into_owned();
                match &mut self.data {
                    Some(acc) => {
                        acc.push('\n');
                        acc.push_str(&d);
                    }
                    None => self.data = Some(d),
                }
            }
        }
        out
    }

    /// The payload of an event the stream ended without a blank line after.
    pub fn finish(&mut self) -> Option<String> {
        let rest = self.push(b"\n\n");
        rest.into_iter().next()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_cut_anywhere_come_out_whole() {
        let stream = b"data: {\"a\":1}\n\ndata: {\"b\":\r\ndata: 2}\n\n: comment\nevent: x\ndata: [DONE]\n\n";
        for cut in 0..stream.len() {
            let mut d = SseDecoder::default();
            let mut got = d.push(&stream[..cut]);
            got.extend(d.push(&stream[cut..]));
            assert_eq!(got, vec!["{\"a\":1}", "{\"b\":\n2}", "[DONE]"], "cut at {cut}");
        }
        let mut d = SseDecoder::default();
        assert!(d.push(b"data: tail").is_empty());
        assert_eq!(d.finish().as_deref(), Some("tail"));
    }
}
