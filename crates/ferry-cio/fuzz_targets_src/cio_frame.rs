//! Fuzz target body for the collective I/O frame decoder (`ferry_cio::proto`).
//!
//! Wired into the cargo-fuzz project as
//! `fuzz_target!(|data: &[u8]| cio_frame::cio_frame(data));`
//! (`tests/proto_props.rs` compiles and runs it in the normal test suite).

use ferry_cio::proto::{self, Msg};

/// Checks one input: the decoder never panics; whatever it accepts is no longer than the
/// largest frame a peer may send, carries a payload only if its type does (DATA and the
/// inline frames, exactly their `len` bytes), and re-encodes to exactly the same bytes (it
/// accepts only canonical frames).
pub fn cio_frame(data: &[u8]) {
    let Ok((msg, payload)) = proto::decode(data) else {
        return;
    };
    let longest = (proto::HEADER_LEN + proto::MAX_CHUNK as usize).max(proto::MAX_SET_VIEW);
    assert!(data.len() <= longest, "a frame of {} bytes", data.len());
    let mut again = Vec::new();
    proto::encode(&msg, &mut again).expect("a decoded frame encodes");
    match &msg {
        Msg::Data { len }
        | Msg::WriteAtAllInline { len, .. }
        | Msg::WriteAtInline { len, .. }
        | Msg::DataDone { len } => {
            assert_eq!(payload.len(), *len as usize);
            if !matches!(msg, Msg::Data { .. }) {
                assert!(payload.len() <= proto::MAX_INLINE);
            }
            again.extend_from_slice(payload);
        }
        _ => assert!(payload.is_empty()),
    }
    assert_eq!(again, data, "decoder accepted a non-canonical frame");
}
