//! Fuzz target body for the NBD transmission decoder: request headers and their checks
//! against a session, and the read and block-status planning fed arbitrary extents.
//!
//! Wired into the cargo-fuzz project as
//! `fuzz_target!(|data: &[u8]| nbd_request::nbd_request(data));`
//! (`tests/nbd_props.rs` compiles and runs it in the normal test suite).

use ferry_block::nbd::consts::{MAX_PAYLOAD, REQUEST_LEN};
use ferry_block::nbd::reply::{plan_read, status_descriptors, Extent};
use ferry_block::nbd::request::{decode_request, encode_request, Command, Session};

/// Sessions a request is checked against: plain and structured, writable and read-only,
/// byte-addressed and 4096-aligned, small and huge.
fn sessions() -> [Session; 4] {
    let s = Session {
        size: 1 << 20,
        readonly: false,
        min_block: 1,
        structured: false,
        base_allocation: None,
    };
    [
        s,
        Session {
            structured: true,
            base_allocation: Some(1),
            ..s
        },
        Session {
            readonly: true,
            min_block: 4096,
            ..s
        },
        Session {
            size: u64::MAX,
            structured: true,
            ..s
        },
    ]
}

/// Checks one input: decoding never panics and is canonical; whatever a session accepts
/// lies inside the export and on its alignment; the planners tile their ranges.
pub fn nbd_request(data: &[u8]) {
    if let Some(head) = data.get(..REQUEST_LEN) {
        let mut b = [0u8; REQUEST_LEN];
        b.copy_from_slice(head);
        if let Ok(h) = decode_request(&b) {
            assert_eq!(
                encode_request(&h),
                b,
                "decoder accepted a non-canonical header"
            );
            for s in sessions() {
                if let Ok(n) = s.payload_len(&h) {
                    assert!(n <= MAX_PAYLOAD);
                }
                if let Ok(cmd) = s.check(&h) {
                    check_accepted(&s, &cmd);
                }
            }
        }
    }
    plan_from(data);
}

fn check_accepted(s: &Session, cmd: &Command) {
    let range = match *cmd {
        Command::Read { offset, len, .. }
        | Command::Write { offset, len, .. }
        | Command::Trim { offset, len, .. }
        | Command::Cache { offset, len }
        | Command::WriteZeroes { offset, len, .. }
        | Command::BlockStatus { offset, len, .. } => Some((offset, len)),
        Command::Disconnect | Command::Flush => None,
    };
    if let Some((offset, len)) = range {
        assert!(offset
            .checked_add(u64::from(len))
            .is_some_and(|e| e <= s.size));
        assert_eq!(offset % u64::from(s.min_block), 0);
        assert_eq!(u64::from(len) % u64::from(s.min_block), 0);
    }
    let writes = matches!(
        cmd,
        Command::Write { .. } | Command::Trim { .. } | Command::WriteZeroes { .. }
    );
    assert!(
        !(writes && s.readonly),
        "a read-only session accepted a write"
    );
    if let Command::BlockStatus { .. } = cmd {
        assert!(s.base_allocation.is_some());
    }
}

/// Extents and a range taken from the input bytes, through both planners.
fn plan_from(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let len = u32::from(first) * 97 + rest.len() as u32;
    let extents: Vec<Extent> = rest
        .chunks(3)
        .map(|c| Extent {
            len: u64::from(c[0]) * 13,
            hole: c.get(1).is_some_and(|b| b & 1 == 1),
            zero: c.get(2).is_some_and(|b| b & 1 == 1),
        })
        .collect();
    let offset = 4096;
    for df in [false, true] {
        let pieces = plan_read(offset, len, &extents, df);
        let mut at = offset;
        for p in &pieces {
            assert_eq!(p.offset, at, "pieces leave a gap or overlap");
            assert!(p.len > 0);
            at += u64::from(p.len);
        }
        assert_eq!(at, offset + u64::from(len), "pieces do not cover the read");
    }
    for req_one in [false, true] {
        let d = status_descriptors(len, &extents, req_one);
        let total: u64 = d.iter().map(|&(l, _)| u64::from(l)).sum();
        assert!(total <= u64::from(len));
        assert!(d.iter().all(|&(l, _)| l > 0));
        assert_eq!(d.is_empty(), len == 0);
        if req_one {
            assert!(d.len() <= 1);
        }
    }
}
