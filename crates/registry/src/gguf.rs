//! Just enough of the GGUF format to read a model's metadata: its architecture, its pooling
//! type (which tells embedding and reranking models apart from LLMs) and whether it carries a
//! chat template. Tensor data is never read.

use std::collections::HashMap;
use std::io::{self, Read, Seek, SeekFrom};

use api_types::ModelType;

pub const MAGIC: &[u8; 4] = b"GGUF";

/// A metadata value we keep (numbers and strings); arrays are skipped, only their length kept.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(u64),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct GgufMeta {
    pub version: u32,
    pub tensor_count: u64,
    pub kv: HashMap<String, MetaValue>,
}

impl GgufMeta {
    pub fn architecture(&self) -> Option<&str> {
        match self.kv.get("general.architecture") {
            Some(MetaValue::Str(s)) => Some(s),
            _ => None,
        }
    }

    /// `<arch>.pooling_type`: 0 none, 1 mean, 2 cls, 3 last, 4 rank.
    pub fn pooling_type(&self) -> Option<i64> {
        let key = format!("{}.pooling_type", self.architecture()?);
        match self.kv.get(&key) {
            Some(MetaValue::Int(v)) => Some(*v),
            _ => None,
        }
    }

    pub fn has_chat_template(&self) -> bool {
        matches!(self.kv.get("tokenizer.chat_template"), Some(MetaValue::Str(s)) if !s.is_empty())
    }

    /// The model type the metadata implies: rank pooling → reranking; any other pooling, or
    /// a non-causal encoder architecture → embedding; otherwise None (an LLM, or unknown).
    pub fn model_type(&self) -> Option<ModelType> {
        match self.pooling_type() {
            Some(4) => return Some(ModelType::Reranking),
            Some(1..=3) => return Some(ModelType::Embedding),
            _ => {}
        }
        let arch = self.architecture()?;
        let causal_key = format!("{arch}.attention.causal");
        if matches!(self.kv.get(&causal_key), Some(MetaValue::Bool(false))) || arch.contains("bert") {
            return Some(ModelType::Embedding);
        }
        None
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("not a GGUF file (bad magic)")]
    BadMagic,
    #[error("unsupported GGUF version {0}")]
    Version(u32),
    #[error("corrupt GGUF metadata: {0}")]
    Corrupt(&'static str),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Upper bounds that reject garbage before it allocates.
const MAX_KV: u64 = 1 << 20;
const MAX_STR: u64 = 64 << 20;

pub fn read_from<R: Read + Seek>(mut r: R) -> Result<GgufMeta, GgufError> {
    let mut magic = [0u8; 4];
    r.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(GgufError::BadMagic);
    }
    let version = u32(&mut r)?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::Version(version));
    }
    let tensor_count = u64(&mut r)?;
    let kv_count = u64(&mut r)?;
    if kv_count > MAX_KV {
        return Err(GgufError::Corrupt("too many metadata entries"));
    }
    let mut kv = HashMap::new();
    for _ in 0..kv_count {
        let key = string(&mut r)?;
        let ty = u32(&mut r)?;
        let value = value(&mut r, ty)?;
        kv.insert(key, value);
    }
    Ok(GgufMeta { version, tensor_count, kv })
}

fn value<R: Read + Seek>(r: &mut R, ty: u32) -> Result<MetaValue, GgufError> {
    Ok(match ty {
        0 => MetaValue::Int(read_n::<1, _>(r)?[0] as i64),
        1 => MetaValue::Int(read_n::<1, _>(r)?[0] as i8 as i64),
        2 => MetaValue::Int(u16::from_le_bytes(read_n(r)?) as i64),
        3 => MetaValue::Int(i16::from_le_bytes(read_n(r)?) as i64),
        4 => MetaValue::Int(u32(r)? as i64),
        5 => MetaValue::Int(i32::from_le_bytes(read_n(r)?) as i64),
        6 => MetaValue::Float(f32::from_le_bytes(read_n(r)?) as f64),
        7 => MetaValue::Bool(read_n::<1, _>(r)?[0] != 0),
        8 => MetaValue::Str(string(r)?),
        9 => {
            let elem = u32(r)?;
            let n = u64(r)?;
            match fixed_size(elem) {
                Some(sz) => {
                    let skip = n.checked_mul(sz).ok_or(GgufError::Corrupt("array too large"))?;
                    let skip = i64::try_from(skip).map_err(|_| GgufError::Corrupt("array too large"))?;
                    r.seek(SeekFrom::Current(skip))?;
                }
                None if elem == 8 => {
                    // Skipped through the reader's buffer: a seek per string would discard a
                    // BufReader's buffer each time (a vocabulary has tens of thousands).
                    for _ in 0..n {
                        let len = u64(r)?;
                        if len > MAX_STR {
                            return Err(GgufError::Corrupt("string too long"));
                        }
                        let skipped = io::copy(&mut r.by_ref().take(len), &mut io::sink())?;
                        if skipped != len {
                            return Err(GgufError::Corrupt("truncated string"));
                        }
                    }
                }
                None => return Err(GgufError::Corrupt("unsupported array element type")),
            }
            MetaValue::Array(n)
        }
        10 => MetaValue::Int(u64(r)? as i64),
        11 => MetaValue::Int(i64::from_le_bytes(read_n(r)?)),
        12 => MetaValue::Float(f64::from_le_bytes(read_n(r)?)),
        _ => return Err(GgufError::Corrupt("unknown value type")),
    })
}

fn fixed_size(ty: u32) -> Option<u64> {
    match ty {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

fn read_n<const N: usize, R: Read>(r: &mut R) -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    r.read_exact(&mut b)?;
    Ok(b)
}

fn u32<R: Read>(r: &mut R) -> io::Result<u32> {
    Ok(u32::from_le_bytes(read_n(r)?))
}

fn u64<R: Read>(r: &mut R) -> io::Result<u64> {
    Ok(u64::from_le_bytes(read_n(r)?))
}

fn string<R: Read>(r: &mut R) -> Result<String, GgufError> {
    let len = u64(r)?;
    if len > MAX_STR {
        return Err(GgufError::Corrupt("string too long"));
    }
    // Read as it comes, not allocated up front: a length the file cannot hold allocates no
    // more than the file has.
    let mut buf = Vec::new();
    r.by_ref().take(len).read_to_end(&mut buf)?;
    if buf.len() as u64 != len {
        return Err(GgufError::Corrupt("truncated string"));
    }
    String::from_utf8(buf).map_err(|_| GgufError::Corrupt("string is not UTF-8"))
}

/// Builds a small GGUF header with the given string / u32 / bool entries and a string array
/// (for tests of the code that reads headers).
pub fn build_header(entries: &[(&str, MetaValue)]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&(entries.len() as u64 + 1).to_le_bytes());
    let s = |b: &mut Vec<u8>, s: &str| {
        b.extend_from_slice(&(s.len() as u64).to_le_bytes());
        b.extend_from_slice(s.as_bytes());
    };
    for (k, v) in entries {
        s(&mut b, k);
        match v {
            MetaValue::Str(v) => {
                b.extend_from_slice(&8u32.to_le_bytes());
                s(&mut b, v);
            }
            MetaValue::Int(i) => {
                b.extend_from_slice(&4u32.to_le_bytes());
                b.extend_from_slice(&(*i as u32).to_le_bytes());
            }
            MetaValue::Bool(x) => {
                b.extend_from_slice(&7u32.to_le_bytes());
                b.push(*x as u8);
            }
            _ => {}
        }
    }
    s(&mut b, "tokenizer.ggml.tokens");
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&8u32.to_le_bytes());
    b.extend_from_slice(&2u64.to_le_bytes());
    s(&mut b, "[CLS]");
    s(&mut b, "hello");
    b
}

#[cfg(test)]
pub(crate) mod tests {
    pub use super::build_header as build;
    use super::*;
    use std::io::Cursor;

    #[test]
    fn reads_arch_pooling_and_skips_arrays() {
        let bytes =
            build(&[("general.architecture", MetaValue::Str("bert".into())), ("bert.pooling_type", MetaValue::Int(4))]);
        let m = read_from(Cursor::new(bytes)).unwrap();
        assert_eq!(m.architecture(), Some("bert"));
        assert_eq!(m.pooling_type(), Some(4));
        assert_eq!(m.kv.get("tokenizer.ggml.tokens"), Some(&MetaValue::Array(2)));
        assert_eq!(m.model_type(), Some(ModelType::Reranking));
    }

    #[test]
    fn model_type_rules() {
        let t = |e: &[(&str, MetaValue)]| read_from(Cursor::new(build(e))).unwrap().model_type();
        let arch = |a: &str| ("general.architecture", MetaValue::Str(a.into()));
        assert_eq!(t(&[arch("bert"), ("bert.pooling_type", MetaValue::Int(1))]), Some(ModelType::Embedding));
        assert_eq!(t(&[arch("bert")]), Some(ModelType::Embedding));
        assert_eq!(t(&[arch("qwen3"), ("qwen3.pooling_type", MetaValue::Int(3))]), Some(ModelType::Embedding));
        assert_eq!(t(&[arch("xlm"), ("xlm.attention.causal", MetaValue::Bool(false))]), Some(ModelType::Embedding));
        assert_eq!(t(&[arch("llama")]), None);
        assert_eq!(t(&[arch("gemma3"), ("gemma3.pooling_type", MetaValue::Int(0))]), None);
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        assert!(matches!(read_from(Cursor::new(b"NOPE....".to_vec())), Err(GgufError::BadMagic)));
        let mut b = build(&[]);
        b.truncate(30);
        let err = read_from(Cursor::new(b)).unwrap_err();
        assert!(matches!(&err, GgufError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof), "{err:?}");
        let mut v1 = build(&[]);
        v1[4] = 1;
        assert!(matches!(read_from(Cursor::new(v1)), Err(GgufError::Version(1))));
    }
}
