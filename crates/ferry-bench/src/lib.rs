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
    exs::run(args)
}

/// `ferry bench cp`: `ferry cp` against GridFTP, xrdcp and iperf3 on loopback.
pub fn run_cp(args: &CpArgs) -> Result<()> {
    cp::run(args)
}

/// `ferry bench block`: ferry's NBD server against nbdkit and qemu-nbd through fio.
pub fn run_block(args: &BlockArgs) -> Result<()> {
    block::run(args)
}

/// `ferry bench wan`: the seed's figures 7–10 on the WAN emulator, with GridFTP and
/// iperf3 on the same path.
pub fn run_wan(args: &WanArgs) -> Result<()> {
    wan::run(args)
}

/// `ferry bench cio`: the ECIO seed's pattern through ferry's MPI-IO interposer against
/// ROMIO and OMPIO.
pub fn run_cio(args: &CioArgs) -> Result<()> {
    cio::run(args)
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
