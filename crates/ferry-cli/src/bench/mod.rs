//! `ferry bench`: measurements that run their peers and the machine's limits in the same run
//! and report ratios (see bench/results/README.md).

mod addr;
mod child;
mod cpu;
mod fabric;
mod fabric_report;
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
    /// Internal: the peer process `bench fabric` spawns for each driver.
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
    }
}
