//! Fuzz target body for the floor's service-selection decoder (SELECT, SELECTED, SERVICES).
//!
//! Wired into the cargo-fuzz project as
//! `fuzz_target!(|data: &[u8]| service_select::service_select(data));`
//! (`tests/select_props.rs` compiles and runs it in the normal test suite).

use ferry_service::select::{self, Floor};

/// Checks one input: the decoder never panics; whatever it accepts is a floor frame
/// ([`select::is_floor`]), at most [`select::MAX_FRAME`] bytes, with well-formed names, and
/// re-encodes to exactly the same bytes (it accepts only canonical frames).
pub fn service_select(data: &[u8]) {
    if let Ok(f) = select::decode(data) {
        assert!(select::is_floor(data));
        assert!(data.len() <= select::MAX_FRAME);
        if let Floor::Select { service, .. }
        | Floor::Services {
            requested: service, ..
        } = &f
        {
            assert!(select::valid_name(service));
        }
        let again = select::encode(&f).expect("a decoded frame encodes");
        assert_eq!(again, data, "decoder accepted a non-canonical frame");
    }
}
