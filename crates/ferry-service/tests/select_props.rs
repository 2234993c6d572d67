//! Property tests of the service-selection codec: every floor frame round-trips, and the
//! decoder (the fuzz target body) never panics on arbitrary or mutated bytes.

#[path = "../fuzz_targets_src/service_select.rs"]
mod service_select;

use ferry_service::select::{self, Floor, MAX_MESSAGE, MAX_NAME, MAX_SERVICES};
use proptest::prelude::*;

/// A well-formed service name (possibly empty).
fn name() -> impl Strategy<Value = String> {
    proptest::string::string_regex(&format!("[a-z0-9._-]{{0,{MAX_NAME}}}")).unwrap()
}

fn floor() -> impl Strategy<Value = Floor> {
    prop_oneof![
        (
            name(),
            proptest::option::of(".{0,40}"),
            proptest::option::of(any::<([u8; 8], [u8; 32])>()),
            proptest::option::of(any::<([u8; 32], [u8; 32], [u8; 32])>())
        )
            .prop_map(|(service, token, proof, key)| Floor::Select {
                service,
                token,
                proof,
                key: key.map(|(k, a, b)| {
                    let mut sig = [0u8; 64];
                    sig[..32].copy_from_slice(&a);
                    sig[32..].copy_from_slice(&b);
                    (k, sig)
                }),
            }),
        Just(Floor::Selected),
        (name(), proptest::collection::vec(name(), 0..=MAX_SERVICES))
            .prop_map(|(requested, hosted)| Floor::Services { requested, hosted }),
        proptest::string::string_regex(&format!(".{{0,{}}}", MAX_MESSAGE / 4))
            .unwrap()
            .prop_map(|message| Floor::Refused { message }),
    ]
}

proptest! {
    #[test]
    fn frames_round_trip(f in floor()) {
        let b = select::encode(&f).unwrap();
        prop_assert!(b.len() <= select::MAX_FRAME);
        // What a server sends crosses before authentication: under the immediate size.
        if !matches!(f, Floor::Select { .. }) {
            prop_assert!(b.len() <= select::MAX_ANSWER);
        }
        prop_assert_eq!(select::decode(&b).unwrap(), f);
        service_select::service_select(&b);
    }

    #[test]
    fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..400)) {
        service_select::service_select(&b);
    }

    /// A valid frame with one byte changed: decoded canonically or refused.
    #[test]
    fn mutated_frames_never_panic(f in floor(), at in any::<usize>(), byte in any::<u8>()) {
        let mut b = select::encode(&f).unwrap();
        let i = at % b.len();
        b[i] = byte;
        service_select::service_select(&b);
    }
}

/// What the decoder refuses, each for its reason; and a face's frame is not the floor's.
#[test]
fn refusals() {
    let ok = select::encode(&Floor::Select {
        service: "xfer".into(),
        token: None,
        proof: None,
        key: None,
    })
    .unwrap();
    let mut flags = ok.clone();
    flags[5] = 2;
    // The token flag without a token behind the name.
    let mut no_token = ok.clone();
    no_token[5] = 1;
    let mut reserved = ok.clone();
    reserved[7] = 1;
    let mut upper = ok.clone();
    upper[10] = b'X';
    let mut longer = ok.clone();
    longer.push(0);
    longer[0] += 1;
    let mut face = ok.clone();
    face[4] = 1;
    for (what, b) in [
        ("flags", flags),
        ("token flag, no token", no_token),
        ("reserved", reserved),
        ("upper-case name", upper),
        ("trailing byte", longer),
        ("face type", face.clone()),
        ("truncated", ok[..ok.len() - 1].to_vec()),
    ] {
        assert!(select::decode(&b).is_err(), "{what} accepted");
    }
    assert!(!select::is_floor(&face));
    assert!(!select::is_floor(&ok[..4]));
    // Too many services, or an invalid name, do not encode.
    let many = Floor::Services {
        requested: String::new(),
        hosted: vec!["a".into(); MAX_SERVICES + 1],
    };
    assert!(select::encode(&many).is_err());
    assert!(select::encode(&Floor::Select {
        service: "a b".into(),
        token: None,
        proof: None,
        key: None,
    })
    .is_err());
}
