//! `ferry bench`: the command line of the benchmark harness (crate ferry-bench), which does
//! the measuring; see bench/results/README.md.

use anyhow::Result;
use clap::Subcommand;
use ferry_bench::{BlockArgs, CioArgs, CpArgs, ExsArgs, FabricArgs, NoncontigArgs, WanArgs};

/// The benchmarks.
#[derive(Subcommand)]
pub enum BenchCmd {
    /// Fabric bandwidth (send, RMA write, RMA read by size) and 8-byte latency per driver,
    /// against iperf3 over loopback and memcpy, with the CPU both sides spent.
    Fabric(FabricArgs),
    /// EXS per driver (the UNH-EXS paper's figures): throughput by payload in normal,
    /// immediate and persistent mode and by transfers in flight, latency, CPU of sender and
    /// receiver, against a plain TCP socket blast and the driver's raw fabric RMA read.
    Exs(ExsArgs),
    /// `ferry cp` against GridFTP (globus-url-copy -p 1/-p 4), xrdcp and iperf3 on loopback:
    /// a large file memory to memory and /dev/shm to /dev/null, disk to disk with the cache
    /// dropped, and 10,000 small files; throughput, files/s and CPU of both sides.
    Cp(CpArgs),
    /// ferry's NBD server against nbdkit (memory and file plugins) and qemu-nbd through
    /// fio's nbd engine: 1 MiB sequential write and read at QD 16, 4 KiB random write and
    /// read at QD 1 and 32 (GB/s, IOPS, mean and p99 latency), over TCP and a Unix socket.
    Block(BlockArgs),
    /// The ADTS paper's figures 7–10 on the WAN emulator (needs root): `ferry cp` memory to
    /// memory against round trip (0–100 ms) by file buffer, disk to disk without and with
    /// staging, the CCSM and visualization traces and 1,000 small files, with GridFTP
    /// (-p 1, -p 4, -tcp-bs) and iperf3 on the same path.
    Wan(WanArgs),
    /// Collective I/O (the ECIO paper's tables 1 to 4): the seed's pattern (MPI_INTs, block
    /// length 1, stride 2, 2 and 4 ranks, 4k to 1,024k ints) written and read through
    /// ferry's MPI-IO interposer (ecio on tcp and ofi+shm, independent) and through ROMIO
    /// (two-phase, collective buffering off) and OMPIO (vulcan, individual); time per
    /// collective call, bandwidth, CPU of ranks and server, bytes resent between ranks.
    Cio(CioArgs),
    /// Internal: the peer process `bench exs` spawns (the sending side).
    #[command(hide = true)]
    ExsPeer {
        /// The driver's address to listen on (port 0 or a unique shm name).
        #[arg(long)]
        listen: String,
    },
    /// Internal: the Rust twin of tests/c/latency.c that `bench exs` runs beside it.
    #[command(hide = true)]
    ExsPingpong {
        /// `server LISTEN_URL ADDR_FILE ROUNDS WARM SMALL_MAX POLL_FIRST` or
        /// `client ADDR ROUNDS WARM SMALL_MAX POLL_FIRST`.
        #[arg(num_args = 1.., allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Noncontiguous I/O per driver (the EXIO paper's figure 5): bandwidth by message size
    /// for messages in 16 segments 1 MiB apart, moved contiguously, by pack/unpack and by
    /// zero-copy RMA gather, with the CPU of both sides.
    Noncontig(NoncontigArgs),
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
        BenchCmd::Fabric(args) => ferry_bench::run_fabric(&args),
        BenchCmd::FabricPeer { listen } => ferry_bench::run_fabric_peer(&listen),
        BenchCmd::Noncontig(args) => ferry_bench::run_noncontig(&args),
        BenchCmd::Exs(args) => ferry_bench::run_exs(&args),
        BenchCmd::Cp(args) => ferry_bench::run_cp(&args),
        BenchCmd::Block(args) => ferry_bench::run_block(&args),
        BenchCmd::Wan(args) => ferry_bench::run_wan(&args),
        BenchCmd::Cio(args) => ferry_bench::run_cio(&args),
        BenchCmd::ExsPeer { listen } => ferry_bench::run_exs_peer(&listen),
        BenchCmd::ExsPingpong { args } => ferry_bench::run_exs_pingpong(&args),
    }
}
