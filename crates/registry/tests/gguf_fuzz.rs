//! The GGUF header reader against hostile headers, for a fixed budget in CI: truncations,
//! random byte flips of a real header, and counts, lengths and offsets near 2^63. It never
//! panics, never makes one allocation larger than the file, and finishes each read quickly
//! (the reader is the only part of lemonade that parses a model file).

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Cursor;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lemonade_registry::gguf::{build_header, read_from, MetaValue};

/// The largest single allocation since the last reset.
static LARGEST: AtomicUsize = AtomicUsize::new(0);

struct Counting;

// SAFETY: forwards to the system allocator; only records sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LARGEST.fetch_max(new, Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Mutations tried per run (the CI budget: about half a second here, debug build).
const MUTATIONS: usize = 200_000;

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Reads `bytes` as a header: no panic (the test would fail), bounded time, and no single
/// allocation past the file's size plus a fixed slack (the reader's own tables).
fn read(bytes: &[u8]) {
    LARGEST.store(0, Ordering::Relaxed);
    let t = Instant::now();
    let _ = read_from(Cursor::new(bytes));
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(
        largest <= bytes.len() * 2 + (64 << 10),
        "an allocation of {largest} bytes for a {}-byte file",
        bytes.len()
    );
    assert!(t.elapsed() < Duration::from_secs(2), "{:?} for {} bytes", t.elapsed(), bytes.len());
}

fn header() -> Vec<u8> {
    build_header(&[
        ("general.architecture", MetaValue::Str("llama".into())),
        ("llama.context_length", MetaValue::Int(4096)),
        ("tokenizer.chat_template", MetaValue::Str("{{ messages }}".into())),
    ])
}

#[test]
fn every_truncation_of_a_real_header_is_an_error_not_a_panic() {
    let h = header();
    for n in 0..h.len() {
        read(&h[..n]);
    }
    assert!(read_from(Cursor::new(&h)).is_ok());
}

#[test]
fn random_byte_flips_never_panic_or_allocate_past_the_file() {
    let h = header();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..MUTATIONS {
        let mut b = h.clone();
        for _ in 0..1 + xorshift(&mut seed) % 8 {
            let i = (xorshift(&mut seed) as usize) % b.len();
            b[i] = xorshift(&mut seed) as u8;
        }
        read(&b);
    }
}

#[test]
fn counts_lengths_and_offsets_near_two_to_the_63_are_refused() {
    let near = [u64::MAX, 1 << 63, (1 << 63) - 1, (1 << 62) + 1, u32::MAX as u64, (64 << 20) - 1];
    for n in near {
        // The metadata count.
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&n.to_le_bytes());
        read(&b);
        // A key's length.
        let mut k = b"GGUF".to_vec();
        k.extend_from_slice(&3u32.to_le_bytes());
        k.extend_from_slice(&0u64.to_le_bytes());
        k.extend_from_slice(&1u64.to_le_bytes());
        k.extend_from_slice(&n.to_le_bytes());
        k.extend_from_slice(b"abc");
        read(&k);
        // An array's element count, for fixed-size elements (a seek) and strings (a loop).
        for elem in [4u32, 8] {
            let mut a = b"GGUF".to_vec();
            a.extend_from_slice(&3u32.to_le_bytes());
            a.extend_from_slice(&n.to_le_bytes());
            a.extend_from_slice(&1u64.to_le_bytes());
            a.extend_from_slice(&1u64.to_le_bytes());
            a.extend_from_slice(b"a");
            a.extend_from_slice(&9u32.to_le_bytes());
            a.extend_from_slice(&elem.to_le_bytes());
            a.extend_from_slice(&n.to_le_bytes());
            read(&a);
        }
    }
}
