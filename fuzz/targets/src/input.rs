//! Decoding helpers over [`arbitrary::Unstructured`].
//!
//! Every choice is biased so that running out of bytes picks the ordinary,
//! well-formed answer: an empty input is a valid plugin (or a short, sane
//! sequence of calls), and each byte the fuzzer adds can only make one
//! thing unusual. Random inputs of the bounded run therefore reach the deep
//! paths (a plugin that loads; an allocation that succeeds) instead of
//! failing at the first check.

use arbitrary::{Result, Unstructured};

/// True about once in `n` decisions; false when the input is exhausted.
pub fn rare(u: &mut Unstructured<'_>, n: u32) -> Result<bool> {
    debug_assert!(n >= 2);
    // `ratio(k, n)` is true when the input is exhausted, so ask for the
    // common case and negate.
    Ok(!u.ratio(n - 1, n)?)
}

/// One of `values`, or (rarely) any `u64`.
pub fn interesting_u64(u: &mut Unstructured<'_>, values: &[u64]) -> Result<u64> {
    if rare(u, 8)? {
        return u.arbitrary();
    }
    Ok(*u.choose(values)?)
}

/// Up to `max` bytes.
pub fn bytes(u: &mut Unstructured<'_>, max: usize) -> Result<Vec<u8>> {
    let n = u.int_in_range(0..=max)?;
    Ok(u.bytes(n.min(u.len()))?.to_vec())
}

/// A status a plugin returns: usually `MEMPLUG_STATUS_OK`, rarely any known
/// code or an unknown one.
pub fn status(u: &mut Unstructured<'_>, n: u32) -> Result<u32> {
    if !rare(u, n)? {
        return Ok(memplug_sdk::abi::MEMPLUG_STATUS_OK);
    }
    if rare(u, 4)? {
        u.arbitrary()
    } else {
        u.int_in_range(1..=14)
    }
}

/// A deterministic byte source for the bounded run: SplitMix64.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// `len` pseudo-random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(len + 8);
        while v.len() < len {
            v.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        v.truncate(len);
        v
    }
}
