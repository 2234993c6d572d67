//! ferry's benchmark harness, behind `ferry bench`: measurements that run their peers and
//! the machine's limits in the same run and report ratios (see bench/results/README.md).
//!
//! The `ferry` command owns the command line (its `bench` subcommands take the `*Args`
//! types here and call the matching `run_*`); this crate owns the measurements, their peer
//! processes (which it spawns as `ferry bench fabric-peer` / `exs-peer` from the running
//! binary), the reports and the files they write.

#![forbid(unsafe_code)]

mod addr;
mod block;
mod child;
mod cio;
mod cp;
mod cpu;
mod exs;
mod fabric;
mod fabric_report;
mod noncontig;
mod peer;
mod plot;
mod proto;
mod refs;
mod report;
mod session;
mod wan;

use anyhow::Result;

pub use block::BlockArgs;
pub use cio::CioArgs;
pub use cp::CpArgs;
pub use exs::ExsArgs;
pub use fabric::FabricArgs;
pub use noncontig::NoncontigArgs;
pub use wan::WanArgs;

/// `ferry bench fabric`: fabric bandwidth and latency per driver against iperf3 and memcpy.
pub fn run_fabric(args: &FabricArgs) -> Result<()> {
    fabric::run(args)
}

/// `ferry bench noncontig`: noncontiguous I/O per driver (contiguous, pack, RMA gather).
pub fn run_noncontig(args: &NoncontigArgs) -> Result<()> {
    noncontig::run(args)
}

/// `ferry bench exs`: EXS per driver against a TCP socket blast and the raw fabric.
pub fn run_exs(args: &ExsArgs) -> Result<()> {
    with_own_identity(|| exs::run(args))
}

/// `ferry bench cp`: `ferry cp` against GridFTP, xrdcp and iperf3 on loopback.
pub fn run_cp(args: &CpArgs) -> Result<()> {
    with_own_identity(|| cp::run(args))
}

/// `ferry bench block`: ferry's NBD server against nbdkit and qemu-nbd through fio.
pub fn run_block(args: &BlockArgs) -> Result<()> {
    with_own_identity(|| block::run(args))
}

/// `ferry bench wan`: the seed's figures 7–10 on the WAN emulator, with GridFTP and
/// iperf3 on the same path.
pub fn run_wan(args: &WanArgs) -> Result<()> {
    with_own_identity(|| wan::run(args))
}

/// `ferry bench cio`: the ECIO seed's pattern through ferry's MPI-IO interposer against
/// ROMIO and OMPIO.
pub fn run_cio(args: &CioArgs) -> Result<()> {
    with_own_identity(|| cio::run(args))
}

/// Runs a bench whose `ferry serve` and `ferry cp` children keep their server identity and
/// pinned keys in a directory of the run's own (`FERRY_STATE_DIR`, `FERRY_KNOWN_HOSTS`,
/// each unless the caller set it), removed afterwards: a bench starts dozens of loopback
/// servers on fresh ports, which would otherwise each be pinned in the user's
/// `~/.config/ferry/known_hosts` (and a port reused later by another server identity
/// refused there as a changed key).
fn with_own_identity<T>(run: impl FnOnce() -> Result<T>) -> Result<T> {
    let dir = std::env::temp_dir().join(format!("ferry-bench-identity-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    for (var, path) in [
        ("FERRY_STATE_DIR", dir.join("state")),
        ("FERRY_KNOWN_HOSTS", dir.join("known_hosts")),
    ] {
        if std::env::var_os(var).is_none() {
            // Before the bench starts any thread that could read the environment.
            std::env::set_var(var, path);
        }
    }
    let res = run();
    let _ = std::fs::remove_dir_all(&dir);
    res
}

/// The peer process `bench fabric` and `bench noncontig` spawn per driver: listens on
/// `listen`, prints the bound address on stdout and serves one bench client.
pub fn run_fabric_peer(listen: &str) -> Result<()> {
    peer::run(listen)
}

/// The peer process `bench exs` spawns (the sending side), listening on `listen`.
pub fn run_exs_peer(listen: &str) -> Result<()> {
    exs::run_peer(listen)
}

/// The Rust twin of `tests/c/latency.c` that `bench exs` pairs the C-API rows with: `args`
/// are its role and arguments (`server LISTEN_URL ADDR_FILE ...` or `client ADDR ...`).
pub fn run_exs_pingpong(args: &[String]) -> Result<()> {
    exs::run_pingpong(args)
}
