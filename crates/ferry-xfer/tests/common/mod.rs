//! What this crate's tests that connect as a client share: a known-hosts file of their own,
//! so a test run never pins its servers into the user's (`~/.config/ferry/known_hosts`).
#![allow(dead_code)] // each test file uses what it needs

use std::time::Duration;

use ferry_service::secure::ClientSecurity;
use ferry_xfer::link::Link;

/// A client's security whose known-hosts file is this test process's own, in the
/// temporary directory (the scripts' `TMPDIR` in CI).
pub fn security() -> ClientSecurity {
    let file = format!("ferry-xfer-test-{}.known_hosts", std::process::id());
    ClientSecurity {
        known_hosts: std::env::temp_dir().join(file),
        ..ClientSecurity::default()
    }
}

/// [`Link::connect`] with [`security`].
pub fn connect(addr: &str, timeout: Duration) -> Link {
    Link::connect_with(addr, timeout, &security()).expect("connect")
}
