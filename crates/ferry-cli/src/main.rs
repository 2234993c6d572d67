//! The `ferry` command line.

#![forbid(unsafe_code)]

mod bench;
mod xfer;

use anyhow::Result;
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// ferry moves data between machines as fast as the wire allows: over RDMA fabrics
/// (libfabric: InfiniBand, RoCE, EFA, shm, tcp) and plain TCP, between memory buffers, files
/// and block devices. `serve` exports directories, `cp`/`ls`/`sum` reach them (see
/// docs/xfer.md), `services` asks a server what it runs; `bench` measures ferry against its
/// peers.
#[derive(Parser)]
#[command(name = "ferry", version, after_help = xfer::EXIT_CODES)]
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
    /// Export directories to `ferry cp` clients (token auth, sandboxed roots).
    #[command(after_help = xfer::EXIT_CODES)]
    Serve(xfer::ServeArgs),
    /// Copy files or trees to or from a `ferry serve`, scp-like, with per-block CRC-32C
    /// and whole-file BLAKE3; files land by temp name + fsync + rename.
    #[command(after_help = xfer::EXIT_CODES)]
    Cp(xfer::CpArgs),
    /// List a directory (or the roots) on a `ferry serve`.
    #[command(after_help = xfer::EXIT_CODES)]
    Ls(xfer::LsArgs),
    /// Print the BLAKE3 of a local or remote file (b3sum format).
    #[command(after_help = xfer::EXIT_CODES)]
    Sum(xfer::SumArgs),
    /// List the services a `ferry serve` runs (file transfer: xfer), or check it runs one.
    #[command(after_help = xfer::EXIT_CODES)]
    Services(xfer::ServicesArgs),
}

fn main() -> Result<()> {
    ferry_fabric::timeline::mark("main.start", 0);
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // Help and version go to stdout with 0; usage errors exit 1 (documented).
            let _ = e.print();
            std::process::exit(if e.use_stderr() { 1 } else { 0 });
        }
    };
    let res = match cli.cmd {
        Cmd::Bench { which } => return bench::run(which),
        Cmd::Serve(a) => xfer::serve(a),
        Cmd::Cp(a) => xfer::cp(a),
        Cmd::Ls(a) => xfer::ls(a),
        Cmd::Sum(a) => xfer::sum(a),
        Cmd::Services(a) => xfer::services(a),
    };
    // FERRY_TIMELINE=PREFIX: this run's marks (see `ferry_fabric::timeline`).
    ferry_fabric::timeline::mark("main.end", 0);
    ferry_fabric::timeline::flush();
    if let Err(e) = res {
        eprintln!("ferry: {e}");
        std::process::exit(e.kind.exit_code());
    }
    Ok(())
}
