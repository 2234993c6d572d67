//! The `ferry` command line.

#![forbid(unsafe_code)]

mod bench;
mod block;
mod copies;
mod log;
mod ls;
mod manual;
mod serve;
mod sync;
mod token;
mod units;
mod xfer;

use anyhow::Result;
use clap::{CommandFactory, Parser, Subcommand};

/// ferry moves data between machines as fast as the wire allows: over RDMA fabrics
/// (libfabric: InfiniBand, RoCE, EFA, shm, tcp) and plain TCP, between memory buffers, files
/// and block devices. `serve` exports directories, `cp`/`ls`/`sum` reach them, `services`
/// asks a server what it runs; `bench` measures ferry against its peers. Every command has
/// a man page (`man ferry-cp`); the guides are installed in /usr/local/share/doc/ferry
/// (`docs/` of the source).
#[derive(Parser)]
#[command(name = "ferry", version, after_help = xfer::EXIT_CODES)]
struct Cli {
    /// Print more: -v adds debug messages, -vv trace messages with their source modules
    /// (without either, $FERRY_LOG or $RUST_LOG filters, e.g. `warn`).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Print errors only: no warnings, no progress bar, no summary.
    #[arg(short, long, global = true)]
    quiet: bool,
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
    /// Block exports over the fabric: `ferry block attach ADDRESS/EXPORT --nbd unix:PATH`
    /// serves a remote export to local NBD clients over the RMA path.
    Block {
        #[command(subcommand)]
        which: block::BlockCmd,
    },
    /// Export directories to `ferry cp` clients (token auth, sandboxed roots).
    #[command(after_help = xfer::EXIT_CODES)]
    Serve(serve::ServeArgs),
    /// Copy files or trees to or from a `ferry serve`, scp-like, with per-block CRC-32C
    /// and whole-file BLAKE3; files land by temp name + fsync + rename.
    #[command(after_help = xfer::EXIT_CODES)]
    Cp(xfer::CpArgs),
    /// Make a destination hold what a source holds, copying only what differs (size and
    /// mtime, or BLAKE3 with --checksum); --delete removes what the source does not have.
    /// Local to remote, remote to local, or server to server (the source server sends).
    #[command(after_help = xfer::EXIT_CODES)]
    Sync(sync::SyncArgs),
    /// List a directory (or the roots) on a `ferry serve`.
    #[command(after_help = xfer::EXIT_CODES)]
    Ls(ls::LsArgs),
    /// List the server-to-server copies a `ferry serve` is making for you (your credential),
    /// or stop one with --abort ID.
    #[command(after_help = xfer::EXIT_CODES)]
    Copies(copies::CopiesArgs),
    /// Print the BLAKE3 of a local or remote file (b3sum format).
    #[command(after_help = xfer::EXIT_CODES)]
    Sum(xfer::SumArgs),
    /// Make secrets: `ferry token new` prints a random token (or writes it to a private
    /// file) for `ferry serve --token-file` and clients' FERRY_TOKEN.
    Token {
        #[command(subcommand)]
        which: token::TokenCmd,
    },
    /// Make a client key pair (Ed25519) for servers' authorized_keys: the private key at
    /// ~/.config/ferry/id_ed25519 (or -f PATH), the public key line at PATH.pub.
    Keygen(token::KeygenArgs),
    /// List the services a `ferry serve` runs (file transfer: xfer), or check it runs one.
    #[command(after_help = xfer::EXIT_CODES)]
    Services(xfer::ServicesArgs),
    /// Print shell completions: `ferry completions bash > ~/.local/share/bash-completion/completions/ferry`
    /// (also zsh, fish, elvish, powershell; `make install` installs bash, zsh and fish).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write the man pages (ferry.1, ferry-cp.1, ...) into DIR (`make install` does).
    #[command(hide = true)]
    Manpages {
        /// Where to write them.
        dir: std::path::PathBuf,
    },
}

/// Ends through [`ferry_fabric::exit_now`] (standard streams flushed, shared-memory names
/// unlinked, then `_exit`), not through the C library's `exit`: threads that are not
/// joined (a session a server left running, a progress thread) may still be closing
/// libfabric objects, and libfabric's exit-time teardown running beside them is a crash
/// (one was seen in the shm provider's `smr_free`). Nothing of ferry's needs the exit
/// handlers: files are flushed and closed by their owners before `run` returns.
fn main() {
    let code = match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("Error: {e:?}");
            1
        }
    };
    ferry_fabric::exit_now(code)
}

fn run() -> Result<()> {
    ferry_fabric::timeline::mark("main.start", 0);
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // Help and version go to stdout with 0; usage errors exit 1 (documented).
            let _ = e.print();
            std::process::exit(if e.use_stderr() { 1 } else { 0 });
        }
    };
    log::init(cli.verbose, cli.quiet);
    let res = match cli.cmd {
        Cmd::Bench { which } => return bench::run(which),
        Cmd::Serve(a) => serve::serve(a),
        Cmd::Block { which } => block::run(which),
        Cmd::Cp(a) => {
            // A tree's window of GETs holds a part file open per GET.
            ferry_xfer::client::tune::raise_open_file_limit();
            xfer::cp(a, cli.quiet, cli.verbose > 0)
        }
        Cmd::Sync(a) => {
            ferry_xfer::client::tune::raise_open_file_limit();
            sync::sync(a, cli.quiet)
        }
        Cmd::Ls(a) => ls::ls(a),
        Cmd::Copies(a) => copies::copies(a),
        Cmd::Sum(a) => xfer::sum(a),
        Cmd::Services(a) => xfer::services(a),
        Cmd::Token { which } => token::run(which),
        Cmd::Keygen(a) => token::keygen(a),
        Cmd::Completions { shell } => {
            manual::completions(Cli::command(), shell);
            Ok(())
        }
        Cmd::Manpages { dir } => manual::manpages(Cli::command(), &dir),
    };
    // FERRY_TIMELINE=PREFIX: this run's marks (see `ferry_fabric::timeline`).
    ferry_fabric::timeline::mark("main.end", 0);
    ferry_fabric::timeline::flush();
    if let Err(e) = res {
        eprintln!("ferry: {e}");
        ferry_fabric::exit_now(e.kind.exit_code());
    }
    Ok(())
}
