//! `ferry block attach`: a remote block export, reached over the fabric's RMA path, served
//! to local NBD clients (fio, nbdcopy, qemu-img, nbdfuse) on a Unix socket or TCP address.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use ferry_block::config::ExportConfig;
use ferry_block::deleg::attach::{split_url, RemoteBackend, DEFAULT_SESSIONS};
use ferry_block::deleg::client::Options;
use ferry_block::deleg::proto::{ReadMode, Scheme};
use ferry_block::{BlockServer, Export};
use ferry_xfer::{Kind, XferError};

use crate::xfer::Trust;

#[derive(Subcommand)]
pub enum BlockCmd {
    /// Serve a remote export (ADDRESS/EXPORT, e.g. ofi+shm://ferry/disk) to local NBD
    /// clients over ferry's RMA path: `nbd+unix:///EXPORT?socket=PATH` or
    /// `nbd://HOST:PORT/EXPORT`. Stops on SIGTERM/SIGINT.
    Attach(AttachArgs),
}

#[derive(Args)]
pub struct AttachArgs {
    /// The export: a fabric address and its name (tcp://HOST:PORT/NAME,
    /// ofi+tcp://HOST:PORT/NAME, ofi+shm://NAME/EXPORT).
    url: String,
    /// Where local NBD clients connect: unix:PATH or HOST:PORT.
    #[arg(long, value_name = "ADDR")]
    nbd: String,
    /// Token for the server [default: $FERRY_TOKEN].
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
    /// How data moves: delegated (zero-copy RMA into chunks the server delegates) or copy
    /// (data inside messages).
    #[arg(long, default_value = "delegated", value_parser = ["delegated", "copy"])]
    scheme: String,
    /// How reads move under delegation: write (the server RMA-writes into this side's
    /// memory, RTRS) or fill (the server fills a chunk this side RMA-reads).
    #[arg(long, default_value = "write", value_parser = ["write", "fill"])]
    read: String,
    /// Ask the server to rotate a chunk's key after each I/O on it.
    #[arg(long)]
    always_invalidate: bool,
    /// Send every write as a request of its own, instead of merging writes that follow
    /// one another on the export into one request (block aggregation).
    #[arg(long)]
    no_merge: bool,
    /// Sessions with the export (concurrent requests on the fabric).
    #[arg(long, default_value_t = DEFAULT_SESSIONS)]
    sessions: usize,
    #[command(flatten)]
    trust: Trust,
}

/// Runs a `ferry block` command.
pub fn run(cmd: BlockCmd) -> Result<(), XferError> {
    match cmd {
        BlockCmd::Attach(a) => attach(a),
    }
}

fn attach(a: AttachArgs) -> Result<(), XferError> {
    let (addr, export) = split_url(&a.url).ok_or_else(|| {
        XferError::new(
            Kind::Usage,
            format!("{}: write ADDRESS/EXPORT, e.g. ofi+shm://ferry/disk", a.url),
        )
    })?;
    let opts = Options {
        token: a
            .token
            .clone()
            .or_else(|| std::env::var("FERRY_TOKEN").ok())
            .unwrap_or_default(),
        scheme: if a.scheme == "copy" {
            Scheme::Copy
        } else {
            Scheme::Delegated
        },
        read: if a.read == "fill" {
            ReadMode::ServerFill
        } else {
            ReadMode::ServerWrite
        },
        always_invalidate: a.always_invalidate,
        merge: !a.no_merge,
        security: a.trust.security(),
        ..Options::new(export)
    };
    let remote = RemoteBackend::connect(addr, &opts, a.sessions)?;
    let cfg = ExportConfig {
        name: export.to_string(),
        path: None,
        memory: None,
        readonly: remote.readonly(),
        direct: false,
        description: format!("{} over ferry's RMA path", a.url),
        tls: Default::default(),
    };
    let nbd = BlockServer::with_exports(
        std::slice::from_ref(&a.nbd),
        vec![Export::new(&cfg, Arc::new(remote))],
    )?;
    let quit = Arc::new(AtomicBool::new(false));
    for s in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(s, quit.clone())
            .map_err(|e| XferError::io("install a signal handler", &e))?;
    }
    for uri in nbd.local_addrs() {
        println!("listening on {uri}");
    }
    let _ = std::io::Write::flush(&mut std::io::stdout());
    nbd.serve_until(&quit);
    nbd.drain(Duration::from_secs(5));
    Ok(())
}
