//! Fuzz target body for the file-transfer frame decoder.
//!
//! Wire it into the cargo-fuzz project as
//! `fuzz_target!(|data: &[u8]| xfer_frame::xfer_frame(data));`
//! (`tests/proto_props.rs` compiles and runs it in the normal test suite).

use ferry_xfer::proto::{self, Msg};

/// Checks one input: the decoder never panics, and whatever it accepts re-encodes to exactly
/// the same bytes (it accepts only canonical frames).
pub fn xfer_frame(data: &[u8]) {
    if let Ok((msg, payload)) = proto::decode(data) {
        let mut again = Vec::new();
        proto::encode(&msg, &mut again).expect("a decoded frame encodes");
        if let Msg::Block(h) = &msg {
            // A sealed block carries the seal trailer after its `len` ciphertext bytes.
            if data[5] & proto::BLOCK_SEALED != 0 {
                let header = proto::encode_sealed_block_header(h).expect("a decoded header");
                again = header.to_vec();
                assert_eq!(payload.len(), h.len as usize + proto::BLOCK_SEAL_TRAILER);
            } else {
                assert_eq!(payload.len(), h.len as usize);
            }
            again.extend_from_slice(payload);
        } else if let Msg::File { len, .. } | Msg::Pack { len, .. } | Msg::PutFile { len, .. } =
            &msg
        {
            assert_eq!(payload.len(), *len as usize);
            again.extend_from_slice(payload);
        } else {
            assert!(payload.is_empty());
        }
        assert_eq!(again, data, "decoder accepted a non-canonical frame");
        // A pack's frames: each one it accepts is a FILE frame, and they fill it exactly.
        if let Msg::Pack { count, .. } = msg {
            if let Ok(files) = proto::decode_pack(count, payload) {
                assert_eq!(files.len(), count as usize);
                let sum: usize = files
                    .iter()
                    .map(|(_, p)| p.len() + proto::FILE_HEADER_LEN)
                    .sum();
                assert_eq!(sum, payload.len());
                assert!(proto::pack_tag(&[1; 32], 0, count, payload).is_ok());
            }
            // Tagging what the decoder did not accept fails or tags, never panics.
            let _ = proto::pack_tag(&[1; 32], 0, count, payload);
            // An upload's pack (1.11): each frame it accepts is a whole PUT_FILE, and they
            // fill it exactly; never both kinds at once.
            if let Ok(puts) = proto::decode_put_pack(count, payload) {
                assert_eq!(puts.len(), count as usize);
                let sum: usize = puts
                    .iter()
                    .map(|(m, p)| match m {
                        Msg::PutFile { path, .. } => proto::put_file_header_len(path) + p.len(),
                        m => panic!("a PUT_FILE pack gave {m:?}"),
                    })
                    .sum();
                assert_eq!(sum, payload.len());
                assert!(count == 0 || proto::decode_pack(count, payload).is_err());
            }
        }
    }
}
