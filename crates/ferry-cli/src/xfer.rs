//! `ferry serve`, `ferry cp`, `ferry ls`, `ferry sum`: the file-transfer face; and
//! `ferry services`, which asks a server what it hosts.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use ferry_xfer::client::{self, Options, Progress};
use ferry_xfer::config::{RootConfig, ServerConfig};
use ferry_xfer::url::{self, Location};
use ferry_xfer::{Kind, XferError};

/// Exit codes, as `--help` shows them.
pub const EXIT_CODES: &str = "\
Exit codes (serve, cp, ls, sum, services):
  0  success
  1  usage: bad arguments, or an unsupported combination
  2  authentication refused: check --token / FERRY_TOKEN
  3  not found: no such root, file or directory (services: no such service)
  4  integrity failure: a checksum kept failing; nothing was written
  5  I/O error or disk full (local or on the server)
  6  connection failed, broke, or the peer spoke nonsense
  7  permission denied, or the path leaves its root
 75  (serve) the libfabric provider is wedged (a peer died holding its lock): restart it";

/// `ferry serve`'s status when its libfabric provider wedged (EX_TEMPFAIL): a supervisor
/// should restart it (docs/fabric.md).
pub const WEDGED_EXIT: i32 = 75;

/// `ferry serve`'s wedge hook: the listener and every connection on the wedged domain are
/// dead and threads are stuck in the provider, so exit for a supervisor to restart us.
fn serve_wedged(msg: &str) {
    eprintln!("ferry serve: {msg}; exiting with status {WEDGED_EXIT} so a supervisor restarts it");
    ferry_fabric::exit_now(WEDGED_EXIT);
}

/// `ferry cp`'s wedge hook: a thread of this attempt may be stuck in the provider, and no
/// later attempt in this process can use it: fail as a broken connection, at once.
fn cp_wedged(msg: &str) {
    let code = Kind::Connection.exit_code();
    if CP_JSON.load(Ordering::SeqCst) {
        let error = format!("connection failed: {msg}");
        report_once(
            || serde_json::json!({"ok": false, "op": "cp", "exit_code": code, "error": error}),
        );
    }
    eprintln!("ferry: connection failed: {msg}");
    ferry_fabric::exit_now(code);
}

/// `ferry cp --json` is running (for [`cp_wedged`]).
static CP_JSON: AtomicBool = AtomicBool::new(false);
/// `ferry cp --json` printed its error line (the wedge hook and the failing attempt may
/// both want to; the lock is held while printing, so the hook's exit waits for the line).
static CP_REPORTED: std::sync::Mutex<bool> = std::sync::Mutex::new(false);

/// Prints `ferry cp --json`'s error line unless one was printed.
fn report_once(line: impl FnOnce() -> serde_json::Value) {
    let mut done = CP_REPORTED.lock().unwrap_or_else(|p| p.into_inner());
    if !*done {
        *done = true;
        println!("{}", line());
        let _ = std::io::stdout().flush();
    }
}

#[derive(Args)]
pub struct ServeArgs {
    /// TOML configuration (listen (one address or a list), block_size, ring, mem, direct, keep_special_bits, third_party, [auth] tokens/anonymous, [limits], [[root]] name/path; docs/xfer.md).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Export a directory as NAME (repeatable; adds to the config's roots).
    #[arg(long = "root", value_name = "NAME=PATH")]
    roots: Vec<String>,
    /// Address to listen on [default: tcp://0.0.0.0:7370]; also ofi+tcp://HOST:PORT, ofi+shm://NAME.
    /// Repeatable: every address is served alike (replaces the config's `listen`).
    #[arg(long = "listen", value_name = "URL")]
    listen: Vec<String>,
    /// Accept clients without a token (trusted networks only).
    #[arg(long)]
    anonymous: bool,
    /// Memory mode: also export the virtual root `mem` (read mem/zero/SIZE, write mem/null)
    /// so copies can skip the disk on this side.
    #[arg(long)]
    mem: bool,
    /// Read and write file data with direct I/O (O_DIRECT), bypassing the page cache
    /// (also `direct = true` in the config).
    #[arg(long)]
    direct: bool,
    /// Accept this token (repeatable; adds to the config's [auth] tokens).
    #[arg(long = "token", value_name = "TOKEN")]
    tokens: Vec<String>,
    /// Let clients have this server send third-party copies to ADDR (a fabric address such as tcp://HOST:7370, or * for any; repeatable).
    #[arg(long = "allow-third-party", value_name = "ADDR")]
    third_party: Vec<String>,
    /// On SIGTERM/SIGINT: stop accepting, let transfers in flight finish for this long, then
    /// journal the rest (clients resume them) and exit 0. A second signal exits at once.
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0)]
    drain_timeout: f64,
    /// Authenticated connections at once; more are refused as unavailable
    /// [default: 256; config `[limits] max_connections`].
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
    /// Connections at once from one client address (IP)
    /// [default: 32; config `[limits] max_per_address`].
    #[arg(long, value_name = "N")]
    max_per_address: Option<usize>,
    /// Close a session that sends no request for this long
    /// [default: 120; config `[limits] idle_timeout`].
    #[arg(long, value_name = "SECONDS")]
    idle_timeout: Option<f64>,
    /// Staging memory all connections together may hold, in bytes (suffixes K, M, G)
    /// [default: a quarter of physical memory; config `[limits] memory_budget`].
    #[arg(long, value_name = "BYTES", value_parser = parse_budget)]
    memory_budget: Option<u64>,
}

fn parse_budget(s: &str) -> Result<u64, String> {
    ferry_xfer::mem::parse_size(s).ok_or_else(|| format!("{s}: give bytes, e.g. 4G or 512M"))
}

#[derive(Args)]
pub struct Remote {
    /// Token for the server [default: $FERRY_TOKEN].
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
    /// Driver for ferry:// and host:path forms: tcp, ofi+tcp or ofi+shm.
    #[arg(long, default_value = "tcp")]
    driver: String,
}

impl Remote {
    fn options(&self) -> Options {
        Options {
            token: self
                .token
                .clone()
                .or_else(|| std::env::var("FERRY_TOKEN").ok())
                .unwrap_or_default(),
            ..Options::default()
        }
    }
}

#[derive(Args)]
pub struct CpArgs {
    /// Copy directories recursively.
    #[arg(short = 'r', long)]
    recursive: bool,
    /// No progress bar, no summary.
    #[arg(short, long)]
    quiet: bool,
    /// Print one JSON summary line on stdout (and nothing else there).
    #[arg(long)]
    json: bool,
    /// Token for the destination server of a server-to-server copy [default: $FERRY_DEST_TOKEN, else the same token].
    #[arg(long, value_name = "TOKEN")]
    dest_token: Option<String>,
    /// Staging block size in bytes (the server may lower it).
    #[arg(long, value_name = "BYTES", default_value_t = ferry_xfer::DEFAULT_BLOCK)]
    block_size: u32,
    /// Continue an interrupted copy: partial files resume after their journaled, verified
    /// part; with -r, files already at the destination (same size and mtime) are skipped.
    #[arg(long)]
    resume: bool,
    /// After a connection failure, reconnect and resume up to N times (pausing 0.2 s,
    /// doubling up to 5 s).
    #[arg(long, value_name = "N", default_value_t = 0)]
    retries: u32,
    /// Treat the connection as broken when the server sends nothing for this long (with
    /// --retries a new connection then resumes).
    #[arg(long, value_name = "SECONDS", default_value_t = 120.0)]
    idle_timeout: f64,
    /// Parallel streams: copy over N connections at once (1 to 16); large files are split
    /// into chunks the streams share, trees spread their files over them. Needs a server
    /// speaking protocol 1.2 (an older one gets one stream). In a server-to-server copy the
    /// source server opens the N streams to the destination (protocol 1.4).
    #[arg(short = 'p', long = "streams", value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=16))]
    streams: u16,
    /// With -p N > 1: the chunk of a large file handed to one stream, in bytes (rounded up
    /// to the block size; a server-to-server copy uses the default).
    #[arg(long, value_name = "BYTES", default_value_t = ferry_xfer::parallel::DEFAULT_CHUNK)]
    chunk_size: u64,
    /// Read and write local files with direct I/O (O_DIRECT), bypassing the page cache
    /// (the server's side follows its config's `direct`).
    #[arg(long)]
    direct: bool,
    /// Replace read-only files at the destination (without it, an upload onto a read-only
    /// file is refused, exit 7).
    #[arg(short = 'f', long)]
    force: bool,
    #[command(flatten)]
    remote: Remote,
    /// Source: a local path, HOST:ROOT/PATH, or ferry://HOST[:PORT]/ROOT/PATH (also tcp://, ofi+tcp://, ofi+shm://NAME/...), or zero:SIZE (memory mode: SIZE zero bytes, e.g. zero:4G). With both SRC and DST remote, the source server sends straight to the destination (third-party copy).
    src: String,
    /// Destination, in the same forms, or null: (or /dev/null): check and discard.
    dst: String,
}

#[derive(Args)]
pub struct LsArgs {
    #[command(flatten)]
    remote: Remote,
    /// What to list: HOST:ROOT/PATH or ferry://HOST[:PORT]/ROOT/PATH (HOST: alone lists the roots).
    target: String,
}

#[derive(Args)]
pub struct ServicesArgs {
    /// Driver for ferry:// and HOST: forms: tcp, ofi+tcp or ofi+shm.
    #[arg(long, default_value = "tcp")]
    driver: String,
    /// Seconds to wait for the server.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    timeout: f64,
    /// The server: HOST:, ferry://HOST[:PORT], tcp://HOST:PORT, ofi+tcp://HOST:PORT or ofi+shm://NAME.
    target: String,
    /// A service to ask for (e.g. xfer): exit 0 if the server runs it, else print the
    /// refusal naming those it runs and exit 3. Without it: list the services.
    service: Option<String>,
}

#[derive(Args)]
pub struct SumArgs {
    #[command(flatten)]
    remote: Remote,
    /// A local file, or a remote one (the server computes the hash).
    target: String,
}

fn remote_of(target: &str, driver: &str) -> Result<ferry_xfer::url::Remote, XferError> {
    match url::parse(target, driver)? {
        Location::Remote(r) => Ok(r),
        _ => Err(XferError::new(
            Kind::Usage,
            format!("{target}: not a remote path; write HOST:ROOT/PATH or ferry://HOST/ROOT/PATH"),
        )),
    }
}

pub fn serve(a: ServeArgs) -> Result<(), XferError> {
    let mut cfg = match &a.config {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| XferError::io(p.display(), &e))?;
            ServerConfig::from_toml(&text)?
        }
        None => ServerConfig::default(),
    };
    for r in &a.roots {
        let (name, path) = r
            .split_once('=')
            .ok_or_else(|| XferError::new(Kind::Usage, format!("--root {r}: write NAME=PATH")))?;
        cfg.roots.push(RootConfig {
            name: name.into(),
            path: path.into(),
        });
    }
    if !a.listen.is_empty() {
        cfg.listen = a.listen;
    }
    cfg.auth.anonymous |= a.anonymous;
    cfg.mem |= a.mem;
    cfg.direct |= a.direct;
    cfg.auth.tokens.extend(a.tokens);
    cfg.third_party.extend(a.third_party);
    let limits = &mut cfg.limits;
    limits.max_connections = a.max_connections.unwrap_or(limits.max_connections);
    limits.max_per_address = a.max_per_address.unwrap_or(limits.max_per_address);
    limits.idle_timeout = a.idle_timeout.unwrap_or(limits.idle_timeout);
    limits.memory_budget = a.memory_budget.or(limits.memory_budget);
    let grace = std::time::Duration::try_from_secs_f64(a.drain_timeout).map_err(|_| {
        XferError::new(
            Kind::Usage,
            format!("--drain-timeout {}: give seconds >= 0", a.drain_timeout),
        )
    })?;
    ferry_fabric::on_unrecoverable(serve_wedged);
    let server = ferry_xfer::server::Server::new(cfg)?;
    // The first SIGTERM/SIGINT starts a drain; a second one exits at once (status 1).
    let quit = Arc::new(AtomicBool::new(false));
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])
    .map_err(|e| XferError::io("install signal handlers", &e))?;
    let flag = quit.clone();
    let watched = server.clone();
    std::thread::Builder::new()
        .name("ferry-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                watched.begin_drain();
                if flag.swap(true, Ordering::SeqCst) {
                    eprintln!("ferry serve: second signal {sig}; exiting without draining");
                    std::process::exit(1);
                }
            }
        })
        .map_err(|e| XferError::io("start the signal thread", &e))?;
    let listeners = server.bind()?;
    for l in &listeners {
        println!("listening on {}", l.local_addr());
    }
    let _ = std::io::stdout().flush();
    server.serve_until(&listeners, &quit)?;
    drop(listeners);
    eprintln!(
        "ferry serve: signal received; not accepting connections; draining transfers in flight (up to {:.0} s)",
        grace.as_secs_f64()
    );
    let r = server.drain(grace);
    eprintln!(
        "ferry serve: stopped: {} transfer(s) in flight at the signal, {} finished, {} journaled and stopped, {} abandoned at their last checkpoint",
        r.in_flight,
        r.in_flight.saturating_sub(r.interrupted + r.abandoned),
        r.interrupted,
        r.abandoned
    );
    Ok(())
}

struct Bar(Option<indicatif::ProgressBar>);

impl Progress for Bar {
    fn total(&self, bytes: u64) {
        if let Some(b) = &self.0 {
            b.set_length(bytes);
        }
    }
    fn add(&self, bytes: u64) {
        if let Some(b) = &self.0 {
            b.inc(bytes);
        }
    }
    fn restart(&self) {
        if let Some(b) = &self.0 {
            b.set_position(0);
        }
    }
}

pub fn cp(a: CpArgs) -> Result<(), XferError> {
    CP_JSON.store(a.json, Ordering::SeqCst);
    ferry_fabric::on_unrecoverable(cp_wedged);
    let src = url::parse(&a.src, &a.remote.driver)?;
    let dst = url::parse(&a.dst, &a.remote.driver)?;
    let idle_timeout = std::time::Duration::try_from_secs_f64(a.idle_timeout)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            XferError::new(
                Kind::Usage,
                format!("--idle-timeout {}: give seconds > 0", a.idle_timeout),
            )
        })?;
    let opts = Options {
        block_size: a.block_size,
        dest_token: a
            .dest_token
            .or_else(|| std::env::var("FERRY_DEST_TOKEN").ok()),
        resume: a.resume,
        retries: a.retries,
        idle_timeout,
        streams: a.streams,
        chunk: a.chunk_size,
        direct: a.direct,
        force: a.force,
        ..a.remote.options()
    };
    let bar = (!a.quiet && !a.json && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(0);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
        ) {
            b.set_style(style);
        }
        b
    });
    let bar = Bar(bar);
    let start = Instant::now();
    let res = client::copy(&src, &dst, a.recursive, &opts, &bar);
    if let Some(b) = &bar.0 {
        b.finish_and_clear();
    }
    let secs = start.elapsed().as_secs_f64();
    match res {
        Ok(s) => {
            // The rate of what crossed the network (a resume moves less than the files hold).
            let gbps = s.wire_bytes as f64 / secs.max(1e-9) / 1e9;
            if a.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "ok": true,
                        "op": "cp",
                        "files": s.files,
                        "bytes": s.bytes,
                        "seconds": secs,
                        "gbps": gbps,
                        "blocks_resent": s.blocks_resent,
                        "wire_bytes": s.wire_bytes,
                        "resumed_bytes": s.resumed_bytes,
                        "files_skipped": s.files_skipped,
                        "retries": s.retries,
                    })
                );
            } else if !a.quiet {
                let mut notes = String::new();
                if s.blocks_resent > 0 {
                    notes += &format!(", {} block(s) resent after CRC mismatch", s.blocks_resent);
                }
                if s.resumed_bytes > 0 || s.files_skipped > 0 {
                    notes += &format!(
                        ", resumed: {} bytes already there, {} file(s) skipped",
                        s.resumed_bytes, s.files_skipped
                    );
                }
                if s.retries > 0 {
                    notes += &format!(", {} reconnection(s)", s.retries);
                }
                eprintln!(
                    "{} file(s), {} bytes in {secs:.2} s ({gbps:.3} GB/s){notes}",
                    s.files, s.bytes,
                );
            }
            Ok(())
        }
        Err(e) => {
            if a.json {
                report_once(|| {
                    serde_json::json!({
                        "ok": false,
                        "op": "cp",
                        "exit_code": e.kind.exit_code(),
                        "error": e.msg,
                    })
                });
            }
            Err(e)
        }
    }
}

pub fn ls(a: LsArgs) -> Result<(), XferError> {
    let r = remote_of(&a.target, &a.remote.driver)?;
    let mut c = client::Client::connect(&r.addr, &a.remote.options())?;
    let entry = if r.path.is_empty() {
        None
    } else {
        Some(c.stat(&r.path)?)
    };
    let entries = match entry {
        Some(e) if e.kind != ferry_xfer::proto::EntryKind::Dir => vec![e],
        _ => c.list(&r.path)?,
    };
    let mut out = std::io::stdout().lock();
    for e in entries {
        let kind = match e.kind {
            ferry_xfer::proto::EntryKind::File => '-',
            ferry_xfer::proto::EntryKind::Dir => 'd',
            ferry_xfer::proto::EntryKind::Symlink => 'l',
            ferry_xfer::proto::EntryKind::Other => '?',
        };
        let suffix = if e.kind == ferry_xfer::proto::EntryKind::Dir {
            "/"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "{kind}{:04o} {:>14} {}{suffix}",
            e.mode,
            e.size,
            printable(&e.name)
        );
    }
    c.bye();
    Ok(())
}

/// A name as `ls` shows it: control characters (legal in file names, and a server chooses
/// what it lists) escaped, so a name cannot move the cursor or recolour the terminal.
fn printable(name: &str) -> std::borrow::Cow<'_, str> {
    if !name.chars().any(char::is_control) {
        return name.into();
    }
    name.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

/// `ferry services`: which services a `ferry serve` runs (protocol 1.6 service selection).
pub fn services(a: ServicesArgs) -> Result<(), XferError> {
    use ferry_service::registry::{not_hosted, probe, Answer};
    let r = remote_of(&a.target, &a.driver)?;
    let timeout = std::time::Duration::try_from_secs_f64(a.timeout)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            XferError::new(
                Kind::Usage,
                format!("--timeout {}: give seconds > 0", a.timeout),
            )
        })?;
    let asked = a.service.as_deref().unwrap_or("");
    match probe(&r.addr, asked, timeout)? {
        Answer::Selected => println!("{asked}"),
        Answer::Hosted(hosted) if asked.is_empty() => {
            for s in hosted {
                println!("{s}");
            }
        }
        Answer::Hosted(hosted) => return Err(not_hosted(&r.addr, asked, &hosted)),
    }
    Ok(())
}

pub fn sum(a: SumArgs) -> Result<(), XferError> {
    let (hash, shown) = match url::parse(&a.target, &a.remote.driver)? {
        Location::Local(p) => (client::sum_local(&p)?.1, p.display().to_string()),
        Location::Remote(r) => {
            let mut c = client::Client::connect(&r.addr, &a.remote.options())?;
            let (_, h) = c.sum(&r.path)?;
            c.bye();
            (h, a.target.clone())
        }
        Location::Zero(n) => (ferry_xfer::mem::zero_hash(n), a.target.clone()),
        Location::Null => {
            return Err(XferError::new(
                Kind::Usage,
                "null: is a sink: nothing to hash",
            ))
        }
    };
    println!("{}  {shown}", client::hex(&hash));
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn ls_escapes_control_characters_only() {
        assert_eq!(super::printable("plain é name"), "plain é name");
        assert_eq!(super::printable("a\nb\u{1b}[2J"), "a\\nb\\u{1b}[2J");
    }
}
