//! `ferry bench`: measurements that run their peers and the machine's limits in the same run
//! and report ratios (see bench/results/README.md).

mod addr;
mod child;
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

use anyhow::Result;
use clap::Subcommand;

/// The benchmarks.
#[derive(Subcommand)]
pub enum BenchCmd {
    /// Fabric bandwidth (send, RMA write, RMA read by size) and 8-byte latency per driver,
    /// against iperf3 over loopback and memcpy, with the CPU both sides spent.
    Fabric(fabric::FabricArgs),
    /// EXS per driver (the UNH-EXS paper's figures): throughput by payload in normal,
    /// immediate and persistent mode and by transfers in flight, latency, CPU of sender and
    /// receiver, against a plain TCP socket blast and the driver's raw fabric RMA read.
    Exs(exs::ExsArgs),
    /// `ferry cp` against GridFTP (globus-url-copy -p 1/-p 4), xrdcp and iperf3 on loopback:
    /// a large file memory to memory and /dev/shm to /dev/null, disk to disk with the cache
    /// dropped, and 10,000 small files; throughput, files/s and CPU of both sides.
    Cp(cp::CpArgs),
    /// Internal: the peer process `bench exs` spawns (the sending side).
    #[command(hide = true)]
    ExsPeer {
        /// The driver's address to listen on (port 0 or a unique shm name).
        #[arg(long)]
        listen: String,
    },
    /// Noncontiguous I/O per driver (the EXIO paper's figure 5): bandwidth by message size
    /// for messages in 16 segments 1 MiB apart, moved contiguously, by pack/unpack and by
    /// zero-copy RMA gather, with the CPU of both sides.
    Noncontig(noncontig::NoncontigArgs),
    /// Internal: the peer process `bench fabric` and `bench noncontig` spawn per driver.
    #[command(hide = true)]
    FabricPeer {
        /// Address to listen on (port 0 or a unique shm name); the bound one goes to stdout.
        #[arg(long)]
        listen: String,
    },
}

/// Runs one benchmark.
pub fn run(cmd: BenchCmd) -> Result<()> {
    match cmd {
        BenchCmd::Fabric(args) => fabric::run(&args),
        BenchCmd::FabricPeer { listen } => peer::run(&listen),
        BenchCmd::Noncontig(args) => noncontig::run(&args),
        BenchCmd::Exs(args) => exs::run(&args),
        BenchCmd::Cp(args) => cp::run(&args),
        BenchCmd::ExsPeer { listen } => exs::run_peer(&listen),
    }
}
