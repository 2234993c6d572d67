//! Fuzz target body for the NBD handshake: option data decoded, and a whole server
//! handshake driven by arbitrary client bytes.
//!
//! Wired into the cargo-fuzz project as
//! `fuzz_target!(|data: &[u8]| nbd_option::nbd_option(data));`
//! (`tests/nbd_props.rs` compiles and runs it in the normal test suite).

use ferry_block::nbd::consts::OPT_EXPORT_NAME;
use ferry_block::nbd::handshake::{ExportInfo, Handshake, Next};
use ferry_block::nbd::option::{decode_option, encode_option, ClientOption};

/// Two exports the handshake offers.
pub fn exports() -> Vec<ExportInfo> {
    let disk = ExportInfo {
        name: "disk".into(),
        description: "a disk".into(),
        size: 1 << 30,
        readonly: false,
        min_block: 1,
        preferred_block: 4096,
        multi_conn: true,
    };
    let ro = ExportInfo {
        name: "ro".into(),
        readonly: true,
        min_block: 4096,
        ..disk.clone()
    };
    vec![disk, ro]
}

/// Checks one input: the first 4 bytes pick an option whose data is the rest; decoding
/// never panics and what it accepts re-encodes to the same data; then the whole input,
/// fed to a handshake in the sizes it asks for, never panics and ends or goes on.
pub fn nbd_option(data: &[u8]) {
    if let Some((head, rest)) = data.split_first_chunk::<4>() {
        let opt = u32::from_be_bytes(*head);
        if let Ok(o) = decode_option(opt, rest) {
            let known = !matches!(o, ClientOption::Unknown(_) | ClientOption::Abort);
            if known {
                let again = encode_option(&o);
                assert_eq!(&again[16..], rest, "option data is not canonical");
            }
            if opt == OPT_EXPORT_NAME {
                assert!(matches!(o, ClientOption::ExportName(_)));
            }
        }
    }
    drive(data);
}

/// Feeds `data` to a handshake, after a well-formed client-flags word.
fn drive(data: &[u8]) {
    // TLS offered, the read-only export TLS-only: STARTTLS and the refusals are reached.
    let mut hs = Handshake::new(exports()).offer_tls(vec![false, true]);
    let _ = hs.greeting();
    let input = [&[0u8, 0, 0, 3][..], data].concat();
    let mut rest = &input[..];
    loop {
        let want = hs.wants();
        if want > rest.len() {
            return;
        }
        let (now, later) = rest.split_at(want);
        let step = hs.feed(now);
        match step.next {
            Next::Continue | Next::StartTls => {}
            Next::Transmit(n) => {
                assert!(n.export < 2);
                return;
            }
            Next::Close(_) => return,
        }
        if want == 0 {
            // Nothing consumed and nothing ended would loop forever.
            return;
        }
        rest = later;
    }
}
