//! The remote-memory descriptor adverts carry.
//!
//! It is the wire twin of `ferry_fabric::RemoteSlice`: same fields, same 24-byte encoding,
//! so the runtime converts field for field. The core keeps its own copy so that it builds,
//! tests and fuzzes without the fabric layer (and its libfabric bindings) underneath, and
//! because its sub-ranging must never panic on values a peer chose.

/// A range of a peer's registered region: what one side advertises so the other can RMA it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct RemoteSlice {
    /// Virtual address or offset into the region, as the fabric driver uses them.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The region's remote key.
    pub key: u64,
}

impl RemoteSlice {
    /// Encoded size on the wire.
    pub const WIRE_LEN: usize = 24;

    /// The sub-range `offset..offset + len`, if it lies inside this slice and its address
    /// does not overflow.
    pub fn sub(&self, offset: u64, len: u64) -> Option<RemoteSlice> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then_some(())?;
        Some(RemoteSlice {
            addr: self.addr.checked_add(offset)?,
            len,
            key: self.key,
        })
    }

    /// Little-endian wire form: addr, len, key.
    pub fn encode(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.key.to_le_bytes());
        b
    }

    /// Decodes the wire form; `None` if `b` is too short.
    pub fn decode(b: &[u8]) -> Option<RemoteSlice> {
        let word = |i: usize| Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?));
        Some(RemoteSlice {
            addr: word(0)?,
            len: word(8)?,
            key: word(16)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_sub_ranges_are_checked() {
        let r = RemoteSlice {
            addr: 4096,
            len: 100,
            key: 0xdead_beef,
        };
        assert_eq!(RemoteSlice::decode(&r.encode()), Some(r));
        assert_eq!(RemoteSlice::decode(&[0; 23]), None);
        assert_eq!(r.sub(90, 10).unwrap().addr, 4186);
        assert_eq!(r.sub(100, 0).unwrap().len, 0);
        assert!(r.sub(91, 10).is_none());
        assert!(r.sub(u64::MAX, 2).is_none());
        let high = RemoteSlice {
            addr: u64::MAX,
            len: 10,
            key: 1,
        };
        assert!(
            high.sub(1, 1).is_none(),
            "address overflow is refused, not a panic"
        );
    }
}
