//! Big-endian field reading and writing shared by the option and request codecs: a reader
//! that returns `None` instead of panicking when the bytes run out, and a writer that
//! appends fields to a `Vec`.

use super::consts::MAX_STRING;

/// Reads big-endian fields from a byte slice, front to back; every read past the end is
/// `None`, so a decoder built on it cannot index out of bounds.
#[derive(Debug, Clone, Copy)]
pub struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    /// A reader over `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Fields { rest: bytes }
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.rest.len() < n {
            return None;
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Some(head)
    }

    /// The next `N` bytes as an array.
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.bytes(N).and_then(|b| b.try_into().ok())
    }

    /// A big-endian u16.
    pub fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_be_bytes)
    }

    /// A big-endian u32.
    pub fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_be_bytes)
    }

    /// A big-endian u64.
    pub fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_be_bytes)
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.rest.len()
    }

    /// A string of `n` bytes: UTF-8, no NUL, at most [`MAX_STRING`] bytes (the
    /// specification's rules for every string).
    pub fn string(&mut self, n: usize) -> Result<String, &'static str> {
        if n > MAX_STRING {
            return Err("a string longer than 4096 bytes");
        }
        let b = self.bytes(n).ok_or("a string longer than its option")?;
        valid_string(b).map(str::to_owned)
    }
}

/// `b` as a protocol string: UTF-8 without NUL.
pub fn valid_string(b: &[u8]) -> Result<&str, &'static str> {
    let s = std::str::from_utf8(b).map_err(|_| "a string that is not UTF-8")?;
    if s.contains('\0') {
        return Err("a string with a NUL byte");
    }
    Ok(s)
}

/// Appends big-endian fields to a buffer.
pub trait PutBe {
    /// Appends a u16.
    fn put_u16(&mut self, v: u16);
    /// Appends a u32.
    fn put_u32(&mut self, v: u32);
    /// Appends a u64.
    fn put_u64(&mut self, v: u64);
}

impl PutBe for Vec<u8> {
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_be_bytes());
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_be_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_be_bytes());
    }
}

/// A length that went on the wire as 32 bits: the caller bounded it (strings to
/// [`MAX_STRING`], payloads to the option or chunk limits), so saturation never happens in
/// practice; it keeps the encoder free of panics all the same.
pub fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
