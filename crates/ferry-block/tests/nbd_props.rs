//! Property tests of the NBD core: option and request codecs round-trip, the decoders and
//! the handshake (the fuzz target bodies) never panic on arbitrary or mutated bytes, and
//! scripted handshakes get the replies the specification asks for.

#[path = "../fuzz_targets_src/nbd_option.rs"]
mod nbd_option;
#[path = "../fuzz_targets_src/nbd_request.rs"]
mod nbd_request;

use ferry_block::nbd::consts::*;
use ferry_block::nbd::handshake::{Handshake, Next, Step, BASE_ALLOCATION_ID};
use ferry_block::nbd::option::{
    decode_header, decode_option, encode_option, ClientOption, GoRequest, MetaRequest,
};
use ferry_block::nbd::request::{decode_request, encode_request, RequestHeader};
use proptest::prelude::*;

/// A protocol string: no NUL, short.
fn string() -> impl Strategy<Value = String> {
    proptest::string::string_regex("[^\\x00]{0,40}").unwrap()
}

fn go() -> impl Strategy<Value = GoRequest> {
    (string(), proptest::collection::vec(any::<u16>(), 0..6))
        .prop_map(|(name, info)| GoRequest { name, info })
}

fn meta() -> impl Strategy<Value = MetaRequest> {
    (string(), proptest::collection::vec(string(), 0..5))
        .prop_map(|(export, queries)| MetaRequest { export, queries })
}

fn option() -> impl Strategy<Value = ClientOption> {
    prop_oneof![
        string().prop_map(ClientOption::ExportName),
        Just(ClientOption::List),
        Just(ClientOption::StartTls),
        go().prop_map(ClientOption::Info),
        go().prop_map(ClientOption::Go),
        Just(ClientOption::StructuredReply),
        meta().prop_map(ClientOption::ListMetaContext),
        meta().prop_map(ClientOption::SetMetaContext),
        Just(ClientOption::ExtendedHeaders),
        (12u32..).prop_map(ClientOption::Unknown),
    ]
}

fn decode_whole(b: &[u8]) -> ClientOption {
    let mut h = [0u8; OPTION_HEADER_LEN];
    h.copy_from_slice(&b[..OPTION_HEADER_LEN]);
    let h = decode_header(&h).unwrap();
    assert_eq!(h.len as usize, b.len() - OPTION_HEADER_LEN);
    decode_option(h.option, &b[OPTION_HEADER_LEN..]).unwrap()
}

proptest! {
    #[test]
    fn options_round_trip(o in option()) {
        prop_assert_eq!(decode_whole(&encode_option(&o)), o);
    }

    #[test]
    fn requests_round_trip(flags: u16, kind: u16, cookie: u64, offset: u64, len: u32) {
        let h = RequestHeader { flags, kind, cookie, offset, len };
        prop_assert_eq!(decode_request(&encode_request(&h)).unwrap(), h);
    }

    #[test]
    fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..300)) {
        nbd_option::nbd_option(&b);
        nbd_request::nbd_request(&b);
    }

    /// A valid option with one byte changed: decoded or refused, never a panic.
    #[test]
    fn mutated_options_never_panic(o in option(), at in any::<usize>(), byte: u8) {
        let mut b = encode_option(&o);
        let i = at % b.len();
        b[i] = byte;
        nbd_option::nbd_option(&b[12..]);
        nbd_option::nbd_option(&b);
    }

    /// A request header with one field changed, checked against every session.
    #[test]
    fn mutated_requests_never_panic(kind in 0u16..10, flags in 0u16..64, offset: u64, len: u32, at in 0usize..28, byte: u8) {
        let h = RequestHeader { flags, kind, cookie: 7, offset, len };
        let mut b = encode_request(&h).to_vec();
        b[at] = byte;
        nbd_request::nbd_request(&b);
    }
}

/// One option reply: (option, type, data).
fn replies(mut b: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
    let mut out = Vec::new();
    while !b.is_empty() {
        assert_eq!(
            u64::from_be_bytes(b[..8].try_into().unwrap()),
            OPT_REPLY_MAGIC
        );
        let opt = u32::from_be_bytes(b[8..12].try_into().unwrap());
        let typ = u32::from_be_bytes(b[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(b[16..20].try_into().unwrap()) as usize;
        out.push((opt, typ, b[20..20 + len].to_vec()));
        b = &b[20 + len..];
    }
    out
}

/// Feeds a whole option (header, then data) to `hs`; the step after the data.
fn send(hs: &mut Handshake, o: &ClientOption) -> Step {
    let b = encode_option(o);
    let step = hs.feed(&b[..OPTION_HEADER_LEN]);
    if b.len() == OPTION_HEADER_LEN {
        return step;
    }
    assert_eq!(step.next, Next::Continue);
    assert!(step.send.is_empty());
    hs.feed(&b[OPTION_HEADER_LEN..])
}

fn started() -> Handshake {
    let mut hs = Handshake::new(nbd_option::exports());
    let g = hs.greeting();
    assert_eq!(&g[..8], &NBDMAGIC.to_be_bytes());
    assert_eq!(&g[8..16], &IHAVEOPT.to_be_bytes());
    assert_eq!(hs.wants(), 4);
    assert_eq!(hs.feed(&[0, 0, 0, 1]).next, Next::Continue);
    hs
}

#[test]
fn what_libnbd_sends_enters_transmission_with_base_allocation() {
    let mut hs = started();
    // Extended headers and TLS are refused and negotiation goes on.
    for o in [
        ClientOption::ExtendedHeaders,
        ClientOption::StartTls,
        ClientOption::Unknown(42),
    ] {
        let s = send(&mut hs, &o);
        assert_eq!(s.next, Next::Continue);
        assert_eq!(replies(&s.send)[0].1, REP_ERR_UNSUP);
    }
    let s = send(&mut hs, &ClientOption::StructuredReply);
    assert_eq!(
        replies(&s.send),
        vec![(OPT_STRUCTURED_REPLY, REP_ACK, vec![])]
    );
    let s = send(
        &mut hs,
        &ClientOption::SetMetaContext(MetaRequest {
            export: "disk".into(),
            queries: vec!["base:allocation".into(), "qemu:dirty-bitmap:x".into()],
        }),
    );
    let r = replies(&s.send);
    assert_eq!(r.len(), 2);
    assert_eq!(r[0].1, REP_META_CONTEXT);
    assert_eq!(&r[0].2[..4], &BASE_ALLOCATION_ID.to_be_bytes());
    assert_eq!(&r[0].2[4..], b"base:allocation");
    assert_eq!(r[1].1, REP_ACK);
    let s = send(
        &mut hs,
        &ClientOption::Go(GoRequest {
            name: "disk".into(),
            info: vec![INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE],
        }),
    );
    let Next::Transmit(n) = s.next else {
        panic!("GO did not enter transmission: {:?}", s.next)
    };
    assert_eq!(n.export, 0);
    assert!(n.structured);
    assert_eq!(n.base_allocation, Some(BASE_ALLOCATION_ID));
    let r = replies(&s.send);
    let infos: Vec<u16> = r
        .iter()
        .filter(|x| x.1 == REP_INFO)
        .map(|x| u16::from_be_bytes([x.2[0], x.2[1]]))
        .collect();
    assert_eq!(
        infos,
        vec![INFO_EXPORT, INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]
    );
    let export = &r[0].2;
    assert_eq!(
        u64::from_be_bytes(export[2..10].try_into().unwrap()),
        1 << 30
    );
    let flags = u16::from_be_bytes([export[10], export[11]]);
    assert_eq!(flags, n.flags);
    for f in [
        FLAG_HAS_FLAGS,
        FLAG_SEND_FLUSH,
        FLAG_SEND_FUA,
        FLAG_SEND_TRIM,
        FLAG_CAN_MULTI_CONN,
        FLAG_SEND_DF,
    ] {
        assert_ne!(flags & f, 0, "flag {f:#x} missing");
    }
    assert_eq!(r.last().unwrap().1, REP_ACK);
}

#[test]
fn list_info_and_unknown_exports() {
    let mut hs = started();
    let r = replies(&send(&mut hs, &ClientOption::List).send);
    assert_eq!(r.len(), 3);
    assert_eq!(&r[0].2[4..8], b"disk");
    assert_eq!(&r[0].2[8..], b"a disk");
    assert_eq!(r[2].1, REP_ACK);
    let unknown = GoRequest {
        name: "nope".into(),
        info: vec![],
    };
    let s = send(&mut hs, &ClientOption::Info(unknown.clone()));
    assert_eq!(replies(&s.send)[0].1, REP_ERR_UNKNOWN);
    let s = send(&mut hs, &ClientOption::Go(unknown));
    assert_eq!(
        s.next,
        Next::Continue,
        "a failed GO leaves negotiation open"
    );
    // Meta contexts need structured replies first.
    let s = send(
        &mut hs,
        &ClientOption::SetMetaContext(MetaRequest {
            export: "disk".into(),
            queries: vec!["base:allocation".into()],
        }),
    );
    assert_eq!(replies(&s.send)[0].1, REP_ERR_INVALID);
    // INFO on the read-only export: its flags, and a 4096-byte minimum block.
    let s = send(
        &mut hs,
        &ClientOption::Info(GoRequest {
            name: "ro".into(),
            info: vec![INFO_BLOCK_SIZE],
        }),
    );
    let r = replies(&s.send);
    let flags = u16::from_be_bytes([r[0].2[10], r[0].2[11]]);
    assert_ne!(flags & FLAG_READ_ONLY, 0);
    assert_eq!(flags & FLAG_SEND_TRIM, 0);
    let bs = r
        .iter()
        .find(|x| x.2[..2] == INFO_BLOCK_SIZE.to_be_bytes())
        .unwrap();
    assert_eq!(&bs.2[2..6], &4096u32.to_be_bytes());
    // The empty name is the default export; EXPORT_NAME enters transmission.
    let s = send(&mut hs, &ClientOption::ExportName(String::new()));
    assert_eq!(s.send.len(), 8 + 2 + 124);
    assert!(matches!(s.next, Next::Transmit(ref n) if n.export == 0 && !n.structured));
}

#[test]
fn bad_handshakes_close() {
    // Unknown client flags.
    let mut hs = Handshake::new(nbd_option::exports());
    assert!(matches!(hs.feed(&[0, 0, 0, 4]).next, Next::Close(_)));
    // EXPORT_NAME of an unknown export cannot be answered: the session ends.
    let mut hs = started();
    let s = send(&mut hs, &ClientOption::ExportName("nope".into()));
    assert!(matches!(s.next, Next::Close(_)));
    // A header without the magic.
    let mut hs = started();
    assert!(matches!(hs.feed(&[0u8; 16]).next, Next::Close(_)));
    // A data length beyond the limit is not read.
    let mut hs = started();
    let mut h = encode_option(&ClientOption::List);
    h[12..16].copy_from_slice(&(MAX_OPTION_LEN + 1).to_be_bytes());
    assert!(matches!(hs.feed(&h[..16]).next, Next::Close(_)));
    // ABORT is acknowledged, then the session ends.
    let mut hs = started();
    let s = send(&mut hs, &ClientOption::Abort);
    assert_eq!(replies(&s.send), vec![(OPT_ABORT, REP_ACK, vec![])]);
    assert!(matches!(s.next, Next::Close(_)));
}

#[test]
fn starttls_opens_tls_only_exports_and_resets_what_was_negotiated_in_clear() {
    let mut hs = Handshake::new(nbd_option::exports()).offer_tls(vec![false, true]);
    let _ = hs.greeting();
    assert_eq!(hs.feed(&[0, 0, 0, 1]).next, Next::Continue);
    let go = |name: &str| {
        ClientOption::Info(GoRequest {
            name: name.into(),
            info: vec![],
        })
    };
    let s = send(&mut hs, &ClientOption::StructuredReply);
    assert_eq!(replies(&s.send)[0].1, REP_ACK);
    // In clear: the TLS-only export is refused, the other one and the list answer.
    let s = send(&mut hs, &go("ro"));
    assert_eq!(s.next, Next::Continue);
    assert_eq!(replies(&s.send)[0].1, REP_ERR_TLS_REQD);
    assert_eq!(
        replies(&send(&mut hs, &go("disk")).send).last().unwrap().1,
        REP_ACK
    );
    assert_eq!(replies(&send(&mut hs, &ClientOption::List).send).len(), 3);
    let s = send(&mut hs, &ClientOption::StartTls);
    assert_eq!(s.next, Next::StartTls);
    assert_eq!(replies(&s.send), vec![(OPT_STARTTLS, REP_ACK, vec![])]);
    // Through TLS: a second STARTTLS is invalid, the export opens, and structured
    // replies must be asked for again.
    let s = send(&mut hs, &ClientOption::StartTls);
    assert_eq!(
        (s.next, replies(&s.send)[0].1),
        (Next::Continue, REP_ERR_INVALID)
    );
    let s = send(
        &mut hs,
        &ClientOption::Go(GoRequest {
            name: "ro".into(),
            info: vec![],
        }),
    );
    assert!(matches!(s.next, Next::Transmit(ref n) if n.export == 1 && !n.structured));
}

#[test]
fn starttls_is_unsupported_without_a_certificate_and_export_name_in_clear_closes() {
    let mut hs = started();
    let s = send(&mut hs, &ClientOption::StartTls);
    assert_eq!(
        (s.next, replies(&s.send)[0].1),
        (Next::Continue, REP_ERR_UNSUP)
    );
    let mut hs = Handshake::new(nbd_option::exports()).offer_tls(vec![false, true]);
    let _ = hs.greeting();
    hs.feed(&[0, 0, 0, 1]);
    let s = send(&mut hs, &ClientOption::ExportName("ro".into()));
    assert!(matches!(s.next, Next::Close(_)));
}
