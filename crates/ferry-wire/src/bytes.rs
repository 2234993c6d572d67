//! The bounds-checked little-endian [`Reader`] and [`Writer`] every codec reads and writes
//! with, and their errors.

/// Why bytes could not be read. Each codec maps these onto its own error type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// Fewer bytes than the field needs.
    #[error("truncated")]
    Short,
    /// A length or count over the protocol's limit.
    #[error("length {len} over the limit {max}")]
    TooLong {
        /// What the bytes said.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A string that is not UTF-8.
    #[error("string is not UTF-8")]
    NotUtf8,
    /// Bytes left over where the protocol requires the frame to end.
    #[error("{0} bytes after the end")]
    Trailing(usize),
    /// A type code no frame of the protocol has.
    #[error("unknown frame type")]
    UnknownType,
    /// A field holds a value the protocol does not allow (the codec says which).
    #[error("{0}")]
    Invalid(&'static str),
}

/// Why a value could not be written: a field over its limit, named by the codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0} too long")]
pub struct TooLong(pub &'static str);

/// A bounds-checked little-endian reader over a byte slice. Every method either consumes
/// exactly what it returns or fails without consuming anything.
#[derive(Debug, Clone, Copy)]
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Reads `buf` from its start.
    #[inline]
    pub const fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    /// Bytes not yet read.
    #[inline]
    pub const fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// True once every byte has been read.
    #[inline]
    pub const fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The unread bytes, without consuming them.
    #[inline]
    pub const fn peek_rest(&self) -> &'a [u8] {
        self.buf
    }

    /// Consumes and returns every unread byte (a payload that runs to the end of a frame).
    #[inline]
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }

    /// The next `n` bytes.
    #[inline]
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], ReadError> {
        if self.buf.len() < n {
            return Err(ReadError::Short);
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    /// The next `N` bytes as an array.
    #[inline]
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], ReadError> {
        let (head, tail) = self.buf.split_first_chunk::<N>().ok_or(ReadError::Short)?;
        self.buf = tail;
        Ok(*head)
    }

    /// One byte.
    #[inline]
    pub fn u8(&mut self) -> Result<u8, ReadError> {
        Ok(self.array::<1>()?[0])
    }

    /// A little-endian `u16`.
    #[inline]
    pub fn u16(&mut self) -> Result<u16, ReadError> {
        self.array().map(u16::from_le_bytes)
    }

    /// A little-endian `u32`.
    #[inline]
    pub fn u32(&mut self) -> Result<u32, ReadError> {
        self.array().map(u32::from_le_bytes)
    }

    /// A little-endian `u64`.
    #[inline]
    pub fn u64(&mut self) -> Result<u64, ReadError> {
        self.array().map(u64::from_le_bytes)
    }

    /// A little-endian two's-complement `i64` (times travel this way).
    #[inline]
    pub fn i64(&mut self) -> Result<i64, ReadError> {
        self.array().map(i64::from_le_bytes)
    }

    /// `n` bytes that must all be zero (reserved fields): `Ok(false)` if one is not.
    #[inline]
    pub fn zeros(&mut self, n: usize) -> Result<bool, ReadError> {
        Ok(self.take(n)?.iter().all(|&b| b == 0))
    }

    /// A `len u16` and that many bytes; a length over `max` is [`ReadError::TooLong`]
    /// (checked before the bytes, so an over-long length is reported as such even when the
    /// bytes are missing).
    #[inline]
    pub fn bytes_u16(&mut self, max: usize) -> Result<&'a [u8], ReadError> {
        let mut r = *self;
        let len = usize::from(r.u16()?);
        if len > max {
            return Err(ReadError::TooLong { len, max });
        }
        let b = r.take(len)?;
        *self = r;
        Ok(b)
    }

    /// A `len u16` and that many bytes of UTF-8, at most `max` bytes.
    #[inline]
    pub fn str_u16(&mut self, max: usize) -> Result<&'a str, ReadError> {
        let mut r = *self;
        let s = std::str::from_utf8(r.bytes_u16(max)?).map_err(|_| ReadError::NotUtf8)?;
        *self = r;
        Ok(s)
    }

    /// Ends a frame that must have no bytes left.
    #[inline]
    pub fn finish(self) -> Result<(), ReadError> {
        match self.buf.len() {
            0 => Ok(()),
            n => Err(ReadError::Trailing(n)),
        }
    }
}

/// A little-endian writer appending to a vector. Writes cannot fail, except the
/// length-prefixed ones whose content is over its limit.
#[derive(Debug)]
pub struct Writer<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
}

impl<'a> Writer<'a> {
    /// Appends to `out` (what it already holds is kept).
    #[inline]
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        let start = out.len();
        Writer { out, start }
    }

    /// Bytes written through this writer.
    #[inline]
    pub fn len(&self) -> usize {
        self.out.len() - self.start
    }

    /// True if nothing was written yet.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes everything written through this writer (an encoder that failed half-way).
    #[inline]
    pub fn undo(&mut self) {
        self.out.truncate(self.start);
    }

    /// Overwrites bytes already written, `at` bytes from this writer's start (a header
    /// known only at the end). Bytes not yet written are left alone: the offset is the
    /// encoder's own, so that would be its bug, and it must not panic.
    #[inline]
    pub fn patch(&mut self, at: usize, b: &[u8]) {
        let Some(at) = self.start.checked_add(at) else {
            return;
        };
        if let Some(dst) = at
            .checked_add(b.len())
            .and_then(|end| self.out.get_mut(at..end))
        {
            dst.copy_from_slice(b);
        }
    }

    /// Overwrites the `u32` at `at` (see [`patch`](Self::patch)).
    #[inline]
    pub fn patch_u32(&mut self, at: usize, v: u32) {
        self.patch(at, &v.to_le_bytes());
    }

    /// Raw bytes.
    #[inline]
    pub fn bytes(&mut self, b: &[u8]) {
        self.out.extend_from_slice(b);
    }

    /// `n` zero bytes (reserved fields).
    #[inline]
    pub fn zeros(&mut self, n: usize) {
        self.out.resize(self.out.len() + n, 0);
    }

    /// One byte.
    #[inline]
    pub fn u8(&mut self, v: u8) {
        self.out.push(v);
    }

    /// A little-endian `u16`.
    #[inline]
    pub fn u16(&mut self, v: u16) {
        self.bytes(&v.to_le_bytes());
    }

    /// A little-endian `u32`.
    #[inline]
    pub fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }

    /// A little-endian `u64`.
    #[inline]
    pub fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }

    /// A little-endian two's-complement `i64`.
    #[inline]
    pub fn i64(&mut self, v: i64) {
        self.bytes(&v.to_le_bytes());
    }

    /// A `len u16` and the bytes; more than `max` (or `u16::MAX`) bytes is
    /// [`TooLong`]`(what)` and writes nothing.
    #[inline]
    pub fn bytes_u16(&mut self, b: &[u8], max: usize, what: &'static str) -> Result<(), TooLong> {
        let len = u16::try_from(b.len())
            .ok()
            .filter(|_| b.len() <= max)
            .ok_or(TooLong(what))?;
        self.u16(len);
        self.bytes(b);
        Ok(())
    }

    /// A `len u16` and the string's UTF-8, at most `max` bytes.
    #[inline]
    pub fn str_u16(&mut self, s: &str, max: usize, what: &'static str) -> Result<(), TooLong> {
        self.bytes_u16(s.as_bytes(), max, what)
    }
}
