//! The `ferry` command line.

mod bench;

use anyhow::Result;
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// ferry moves data between machines as fast as the wire allows: over RDMA fabrics
/// (libfabric: InfiniBand, RoCE, EFA, shm, tcp) and plain TCP, between memory buffers, files
/// and block devices. Today the command measures the fabric layer; cp, serve and block follow.
#[derive(Parser)]
#[command(name = "ferry", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Measure ferry against its peers and the machine's limits (bandwidth, latency, CPU).
    Bench {
        #[command(subcommand)]
        which: bench::BenchCmd,
    },
}

fn main() -> Result<()> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().cmd {
        Cmd::Bench { which } => bench::run(which),
    }
}
