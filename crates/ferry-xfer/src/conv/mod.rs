//! The file-transfer conversations as sans-I/O state machines: each side's protocol logic
//! (which requests go out, what an answer means, when a file is whole and verified) as
//! plain values that take messages and local events in and hand actions out. They read no
//! clock, touch no file or socket and start no thread; the client and server modules are
//! their runtimes, and `tests/sim_download.rs` and `tests/sim_upload.rs` drive both sides
//! of one against each other through a faulty in-memory wire.

pub mod download;
pub mod serve;
pub mod upload;
