//! `ferry cp`, `ferry ls`, `ferry sum`: the file-transfer face's clients; and
//! `ferry services`, which asks a server what it hosts (`ferry serve` is in `serve.rs`).

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use clap::Args;
use ferry_xfer::client::{self, Filter, Options, Progress, Skip, Stats};
use ferry_xfer::url::{self, Location};
use ferry_xfer::{Kind, XferError};

use crate::units::human_size;

/// Exit codes, as `--help` shows them.
pub const EXIT_CODES: &str = "\
Exit codes (serve, cp, ls, sum, services):
  0  success
  1  usage: bad arguments, or an unsupported combination
  2  authentication refused: check --token / FERRY_TOKEN / --identity (or the server's identity was refused)
  3  not found: no such root, file or directory (services: no such service)
  4  integrity failure: a checksum kept failing; nothing was written
  5  I/O error or disk full (local or on the server)
  6  connection failed, broke, or the peer spoke nonsense
  7  permission denied, or the path leaves its root
 75  (serve) the libfabric provider is wedged (a peer died holding its lock): restart it";

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

/// On Ctrl-C (or SIGTERM), says how to continue before exiting 130: what was verified is in
/// the part file's journal (here for downloads, on the server for uploads), and the same
/// command with `--resume` (and without `--no-resume`) picks it up.
fn hint_on_interrupt(resuming: bool) {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else {
        return;
    };
    let mut again: Vec<String> = std::env::args()
        .filter(|a| a != "--no-resume")
        .map(|a| shell_word(&a))
        .collect();
    if !resuming {
        let at = again
            .iter()
            .position(|a| a == "cp")
            .map_or(again.len(), |i| i + 1);
        again.insert(at, "--resume".into());
    }
    let again = again.join(" ");
    let spawned = std::thread::Builder::new()
        .name("ferry-interrupt".into())
        .spawn(move || {
            if signals.forever().next().is_some() {
                if CP_JSON.load(Ordering::SeqCst) {
                    report_once(|| {
                        serde_json::json!({"ok": false, "op": "cp", "exit_code": 130,
                            "error": "interrupted", "continue_with": again.clone()})
                    });
                }
                eprintln!(
                    "\nferry: interrupted; what was verified is kept. To continue:\n  {again}"
                );
                ferry_fabric::exit_now(130);
            }
        });
    if let Err(e) = spawned {
        tracing::debug!("no interrupt hint: {e}");
    }
}

/// `arg` as a POSIX shell reads it back: bare when it is plainly safe, else single-quoted.
fn shell_word(arg: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:=,+@%".contains(c);
    if !arg.is_empty() && arg.chars().all(plain) {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', "'\\''"))
    }
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
pub struct Remote {
    /// Token for the server [default: $FERRY_TOKEN].
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
    /// Private key to prove to the server instead of a token (made by `ferry keygen`; its
    /// .pub line goes into the server's authorized_keys); `none` for no key
    /// [default: ~/.config/ferry/id_ed25519 if it exists and no token is given].
    #[arg(long, short = 'i', value_name = "PATH")]
    identity: Option<std::path::PathBuf>,
    /// Driver for ferry:// and host:path forms: tcp, ofi+tcp or ofi+shm.
    #[arg(long, default_value = "tcp")]
    pub driver: String,
    #[command(flatten)]
    pub trust: Trust,
}

impl Remote {
    /// The client options these flags give (the token from $FERRY_TOKEN if not given; the
    /// key from --identity, else the default key file when there is no token).
    pub fn options(&self) -> Result<Options, XferError> {
        let token = self
            .token
            .clone()
            .or_else(|| std::env::var("FERRY_TOKEN").ok())
            .unwrap_or_default();
        let key_file = match &self.identity {
            Some(p) if p.as_os_str() == "none" => None,
            Some(p) => Some(p.clone()),
            None => Some(ferry_service::keys::default_identity())
                .filter(|p| token.is_empty() && p.exists()),
        };
        let key = match key_file {
            Some(p) => Some(std::sync::Arc::new(ferry_service::keys::ClientKey::load(
                &p,
            )?)),
            None => None,
        };
        Ok(Options {
            token,
            key,
            security: self.trust.security(),
            ..Options::default()
        })
    }
}

/// How a client secures its connection and knows the server (docs/security.md).
#[derive(Args, Clone)]
pub struct Trust {
    /// Connect without TLS: the token, file names and every request in clear. Only where
    /// the server allows it too (ferry serve --allow-clear); trusted networks only.
    #[arg(long)]
    insecure_clear: bool,
    /// Accept only a server whose identity has this fingerprint (SHA256:HEX, printed by
    /// `ferry serve --fingerprint` there); the known-hosts file is then not used.
    #[arg(long, value_name = "SHA256:HEX")]
    server_fingerprint: Option<String>,
    /// Refuse a server not in the known-hosts file instead of pinning it on first use.
    #[arg(long)]
    strict_host_keys: bool,
    /// The known-hosts file (HOST:PORT FINGERPRINT lines) [default: $FERRY_KNOWN_HOSTS,
    /// else ~/.config/ferry/known_hosts].
    #[arg(long, value_name = "FILE")]
    known_hosts: Option<std::path::PathBuf>,
    /// Verify the server's certificate chain against the CAs in FILE (PEM), for the host
    /// name or address in the URL, instead of pinning (sites with a PKI; docs/security.md).
    #[arg(long, value_name = "FILE", conflicts_with = "server_fingerprint")]
    ca_file: Option<std::path::PathBuf>,
    /// The data protection this copy requires, exactly, or it fails: integrity (each block
    /// authenticated under a session key), private (each block encrypted too, AES-256-GCM,
    /// where the server allows it), clear (a CRC-32C, only where the server allows it)
    /// [default: integrity over TLS, clear with --insecure-clear; docs/security.md].
    #[arg(long, value_name = "LEVEL", value_parser = parse_level)]
    protect: Option<ferry_service::secure::Level>,
}

/// A data protection level's name (`clear`, `integrity`, `private`).
pub fn parse_level(s: &str) -> Result<ferry_service::secure::Level, String> {
    s.parse().map_err(|e: ferry_service::Error| e.msg)
}

impl Trust {
    /// The client security these flags ask for.
    pub fn security(&self) -> ferry_service::secure::ClientSecurity {
        let mut sec = ferry_service::secure::ClientSecurity {
            clear: self.insecure_clear,
            fingerprint: self.server_fingerprint.clone(),
            strict: self.strict_host_keys,
            ca_file: self.ca_file.clone(),
            protection: self.protect,
            ..Default::default()
        };
        if let Some(f) = &self.known_hosts {
            sec.known_hosts = f.clone();
        }
        sec
    }
}

#[derive(Args)]
pub struct CpArgs {
    /// Copy directories recursively.
    #[arg(short = 'r', long)]
    recursive: bool,
    /// Print one JSON summary line on stdout (and nothing else there).
    #[arg(long)]
    json: bool,
    /// Token for the destination server of a server-to-server copy [default: $FERRY_DEST_TOKEN, else the same token].
    #[arg(long, value_name = "TOKEN")]
    dest_token: Option<String>,
    /// For a server-to-server copy with a server too old for grants (protocol 1.9): send
    /// the source server the destination token (inside its TLS channel). Without it such a
    /// copy is refused; with grants the token never leaves this host.
    #[arg(long)]
    forward_token: bool,
    /// Staging block size in bytes (the server may lower it).
    #[arg(long, value_name = "BYTES", default_value_t = ferry_xfer::DEFAULT_BLOCK)]
    block_size: u32,
    /// Continue an interrupted copy: besides partial files (resumed by default), skip files
    /// already at the destination with the source's size and mtime.
    #[arg(long)]
    resume: bool,
    /// Never replace a file at the destination: files already there are skipped (and
    /// counted).
    #[arg(short = 'n', long, conflicts_with = "resume")]
    no_clobber: bool,
    /// In a tree, copy only files matching PATTERN (a glob; without '/' it matches a name
    /// at any depth, with '/' the path below the tree's top; '**' spans directories).
    /// Repeatable.
    #[arg(long, value_name = "PATTERN")]
    include: Vec<String>,
    /// In a tree, leave out what matches PATTERN (an excluded directory with everything
    /// in it); wins over --include. Repeatable.
    #[arg(long, value_name = "PATTERN")]
    exclude: Vec<String>,
    /// Start over: ignore the journals of partial files (by default a partial file
    /// continues after its journaled, verified part).
    #[arg(long, conflicts_with = "resume")]
    no_resume: bool,
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
    /// source server opens the N streams to the destination (protocol 1.4). Without -p: on
    /// a short path (round trip up to 2 ms) a tree download opens one per core (up to 4),
    /// anything else one; on a longer path the copy starts with one and adds streams while
    /// the rate grows (up to 8; -v and --json say how many).
    #[arg(short = 'p', long = "streams", value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=16))]
    streams: Option<u16>,
    /// Staging (file buffer) per connection, e.g. 64M: the blocks kept in flight. Default:
    /// from the round trip measured at connect (twice the bandwidth-delay product at
    /// 10 Gbit/s, 32 to 128 MiB); the server's own ring and memory budget still bound what
    /// it sends and takes.
    #[arg(long, value_name = "SIZE", value_parser = parse_buffer)]
    buffer: Option<u64>,
    /// With -p N > 1: the chunk of a large file handed to one stream, in bytes (rounded up
    /// to the block size; a server-to-server copy uses the default).
    #[arg(long, value_name = "BYTES", default_value_t = ferry_xfer::parallel::DEFAULT_CHUNK)]
    chunk_size: u64,
    /// Read and write local files with direct I/O (O_DIRECT), bypassing the page cache
    /// (the server's side follows its config's `direct`). Without it, files of 64 MiB or
    /// more on a disk filesystem are written so anyway, and read so where not cached.
    #[arg(long)]
    direct: bool,
    /// Copy what symlinks in a tree point to (a server follows only links that stay inside
    /// their root); without it symlinks are skipped, warned about and counted.
    #[arg(short = 'L', long)]
    follow_links: bool,
    /// Replace read-only files at the destination (without it, an upload onto a read-only
    /// file is refused, exit 7).
    #[arg(short = 'f', long)]
    force: bool,
    #[command(flatten)]
    remote: Remote,
    /// Sources, then the destination. A source is a local path, HOST:ROOT/PATH,
    /// ferry://HOST[:PORT]/ROOT/PATH (also tcp://, ofi+tcp://, ofi+shm://NAME/...), or
    /// zero:SIZE (memory mode: SIZE zero bytes, e.g. zero:4G). With both ends remote, the
    /// source server sends straight to the destination (third-party copy). The destination
    /// takes the same forms, or null: (or /dev/null): check and discard. With several
    /// sources the destination is a directory (created if missing).
    #[arg(value_name = "SRC... DST", num_args = 2.., required = true)]
    paths: Vec<String>,
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
    #[command(flatten)]
    trust: Trust,
}

#[derive(Args)]
pub struct SumArgs {
    #[command(flatten)]
    remote: Remote,
    /// A local file, or a remote one (the server computes the hash).
    target: String,
}

/// `target` as a remote path, or a usage error.
pub fn remote_of(target: &str, driver: &str) -> Result<ferry_xfer::url::Remote, XferError> {
    match url::parse(target, driver)? {
        Location::Remote(r) => Ok(r),
        _ => Err(XferError::new(
            Kind::Usage,
            format!("{target}: not a remote path; write HOST:ROOT/PATH or ferry://HOST/ROOT/PATH"),
        )),
    }
}

/// `ferry cp`'s progress: a bar on a terminal (bytes, and files for tree copies), and the
/// file counts either way (for `--json`). Several sources are copied one after the other:
/// each reports its own totals, which add to those of the sources before it.
struct Bar {
    bar: Option<indicatif::ProgressBar>,
    /// Show the file count (a tree copy, or several sources).
    tree: bool,
    count: std::sync::Mutex<Count>,
}

/// What [`Bar`] counted.
#[derive(Debug, Default, Clone, Copy)]
struct Count {
    /// Files complete (copied or found there), over all sources.
    done: u64,
    /// Files listed, over the sources listed so far.
    total: u64,
    /// Sources not yet listed: the total is then a lower bound.
    more: bool,
    /// The sources before the current one: bytes, files listed, files done.
    before: (u64, u64, u64),
}

/// `done/total files` as the bar shows it; `≥total` while sources remain to be listed.
fn files_label(done: u64, total: u64, more: bool) -> String {
    let at_least = if more { "≥" } else { "" };
    format!("{done}/{at_least}{total} files")
}

impl Bar {
    fn new(bar: Option<indicatif::ProgressBar>, tree: bool) -> Bar {
        Bar {
            bar,
            tree,
            count: Default::default(),
        }
    }

    fn count(&self) -> std::sync::MutexGuard<'_, Count> {
        self.count.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Redraws the file count.
    fn show_files(&self, c: &Count) {
        if let (Some(b), true) = (&self.bar, self.tree) {
            b.set_message(files_label(c.done, c.total, c.more));
        }
    }

    /// The next source starts (`more`: others follow it); what the last one reported
    /// stays counted.
    fn next_source(&self, more: bool) {
        let mut c = self.count();
        let bytes = self.bar.as_ref().map_or(0, |b| b.position());
        c.before = (bytes, c.total, c.done);
        c.more = more;
        self.show_files(&c);
    }

    /// Files complete and listed.
    #[cfg(test)]
    fn files_counted(&self) -> (u64, u64) {
        let c = self.count();
        (c.done, c.total)
    }
}

impl Progress for Bar {
    fn total(&self, bytes: u64) {
        if let Some(b) = &self.bar {
            b.set_length(self.count().before.0 + bytes);
        }
    }
    fn add(&self, bytes: u64) {
        if let Some(b) = &self.bar {
            b.inc(bytes);
        }
    }
    fn already_there(&self, bytes: u64) {
        if let Some(b) = &self.bar {
            // Counted, then the rate estimate starts afresh: a resumed gigabyte is not a
            // gigabyte a second. The tick makes the estimator take the jump now (an `inc`
            // records only when the bar's update budget allows), so the reset drops it.
            b.inc(bytes);
            b.tick();
            b.reset_eta();
        }
    }
    fn restart(&self) {
        let mut c = self.count();
        if let Some(b) = &self.bar {
            // Back to where this source began, and a rate that starts afresh (the next
            // attempt reports what is already there again).
            b.set_position(c.before.0);
            b.tick();
            b.reset_eta();
        }
        (c.total, c.done) = (c.before.1, c.before.2);
        self.show_files(&c);
    }
    fn files(&self, files: u64) {
        let mut c = self.count();
        c.total = c.before.1 + files;
        self.show_files(&c);
    }
    fn file_done(&self) {
        let mut c = self.count();
        c.done += 1;
        self.show_files(&c);
    }
}

/// The sources with every remote glob (`HOST:data/*.h5`) replaced by what it matches on
/// its server.
fn expand_globs(srcs: Vec<Location>, opts: &Options) -> Result<Vec<Location>, XferError> {
    let mut out = Vec::new();
    for s in srcs {
        match s {
            Location::Remote(r) if client::is_glob(&r.path) => out.extend(
                client::expand_remote(&r, opts)?
                    .into_iter()
                    .map(Location::Remote),
            ),
            s => out.push(s),
        }
    }
    Ok(out)
}

/// Copies each source to `dst` in turn, summing what they did; the first failure ends it.
fn copy_each(
    srcs: &[Location],
    dst: &Location,
    recursive: bool,
    opts: &Options,
    progress: &Bar,
) -> Result<Stats, XferError> {
    let mut total = Stats::default();
    for (i, src) in srcs.iter().enumerate() {
        progress.next_source(i + 1 < srcs.len());
        total.add(&client::copy(src, dst, recursive, opts, progress)?);
    }
    Ok(total)
}

/// `--buffer SIZE`: a size (`64M`, `1G`, bytes) of at least 64 KiB.
fn parse_buffer(s: &str) -> Result<u64, String> {
    let n = ferry_service::config::parse_size(s)?;
    if n < 64 << 10 {
        return Err(format!("{s}: give at least 64K"));
    }
    Ok(n)
}

/// What the copy chose from its path, as `-v` prints it.
fn describe_tuning(t: &client::Tuning) -> String {
    format!(
        "path: round trip {:.1} ms{}; staging {} × {} = {} per stream; {} GETs in flight; {} stream(s){}",
        t.rtt_us as f64 / 1000.0,
        match t.tcp_rtt_us {
            0 => String::new(),
            us => format!(" (TCP's least {:.1} ms)", us as f64 / 1000.0),
        },
        t.ring,
        human_size(u64::from(t.block)),
        human_size(t.buffer()),
        t.get_window,
        t.streams,
        if t.streams_auto { " (chosen)" } else { " (-p)" }
    )
}

/// `ferry cp --json`'s `path` object: what the copy chose from its path.
fn tuning_json(t: &client::Tuning) -> serde_json::Value {
    serde_json::json!({
        "rtt_ms": t.rtt_us as f64 / 1000.0,
        "tcp_rtt_ms": (t.tcp_rtt_us > 0).then(|| t.tcp_rtt_us as f64 / 1000.0),
        "block_size": t.block,
        "ring": t.ring,
        "buffer": t.buffer(),
        "get_window": t.get_window,
        "streams": t.streams,
        "streams_auto": t.streams_auto,
    })
}

/// `ferry cp`; `quiet` (the global `-q`) prints no progress bar and no summary, `verbose`
/// (`-v`) adds what the copy chose from its path.
pub fn cp(a: CpArgs, quiet: bool, verbose: bool) -> Result<(), XferError> {
    CP_JSON.store(a.json, Ordering::SeqCst);
    ferry_fabric::on_unrecoverable(cp_wedged);
    hint_on_interrupt(a.resume);
    let (dst, srcs) = a
        .paths
        .split_last()
        .ok_or_else(|| XferError::new(Kind::Usage, "give SRC... DST"))?;
    let srcs = srcs
        .iter()
        .map(|s| url::parse(s, &a.remote.driver))
        .collect::<Result<Vec<_>, _>>()?;
    let globbed = srcs
        .iter()
        .any(|s| matches!(s, Location::Remote(r) if client::is_glob(&r.path)));
    let dst = if (srcs.len() > 1 || globbed) && !dst.ends_with('/') && dst != "null:" {
        // Several sources (or a pattern) land in one directory: the destination names it.
        format!("{dst}/")
    } else {
        dst.clone()
    };
    let dst = url::parse(&dst, &a.remote.driver)?;
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
        forward_token: a.forward_token,
        resume: !a.no_resume,
        skip: if a.no_clobber {
            Skip::Existing
        } else if a.resume {
            Skip::Unchanged
        } else {
            Skip::Nothing
        },
        filter: Filter::new(&a.include, &a.exclude)?,
        retries: a.retries,
        idle_timeout,
        streams: a
            .streams
            .unwrap_or(ferry_xfer::client::tune::MAX_AUTO_STREAMS),
        auto_streams: a.streams.is_none(),
        buffer: a.buffer.map_or(client::Buffer::Path, client::Buffer::Bytes),
        chunk: a.chunk_size,
        direct: a.direct,
        force: a.force,
        follow_links: a.follow_links,
        ..a.remote.options()?
    };
    // A tree copy (or several sources, or a pattern) shows its file count too.
    let tree = a.recursive || srcs.len() > 1 || globbed;
    let bar = (!quiet && !a.json && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(0);
        let template = if tree {
            "{bar:40} {bytes}/{total_bytes} {msg} {binary_bytes_per_sec} ETA {eta}"
        } else {
            "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}"
        };
        if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
            b.set_style(style);
        }
        b
    });
    crate::log::show_bar(bar.as_ref());
    let bar = Bar::new(bar, tree);
    let start = Instant::now();
    let res =
        expand_globs(srcs, &opts).and_then(|srcs| copy_each(&srcs, &dst, a.recursive, &opts, &bar));
    crate::log::show_bar(None);
    if let Some(b) = &bar.bar {
        b.finish_and_clear();
    }
    let secs = start.elapsed().as_secs_f64();
    match res {
        Ok(s) => {
            if verbose && !quiet {
                eprintln!("ferry: {}", describe_tuning(&s.tuning));
            }
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
                        "entries_skipped": s.entries_skipped,
                        "retries": s.retries,
                        "path": tuning_json(&s.tuning),
                    })
                );
            } else if !quiet {
                let mut notes = String::new();
                if s.blocks_resent > 0 {
                    notes += &format!(", {} block(s) resent after CRC mismatch", s.blocks_resent);
                }
                if s.resumed_bytes > 0 || s.files_skipped > 0 {
                    notes += &format!(
                        ", resumed: {} already there, {} file(s) skipped",
                        human_size(s.resumed_bytes),
                        s.files_skipped
                    );
                }
                notes += &skipped_hint(s.entries_skipped, a.follow_links);
                if s.retries > 0 {
                    notes += &format!(", {} reconnection(s)", s.retries);
                }
                // The bar's units (KiB, MiB, ...), and the rate of what crossed the network.
                let rate = (s.wire_bytes as f64 / secs.max(1e-9)) as u64;
                eprintln!(
                    "{} file(s), {} in {secs:.2} s ({}/s){notes}",
                    s.files,
                    human_size(s.bytes),
                    human_size(rate)
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

/// `ferry services`: which services a `ferry serve` runs (protocol 1.6 service selection).
pub fn services(a: ServicesArgs) -> Result<(), XferError> {
    use ferry_service::channel::not_hosted;
    use ferry_service::registry::{probe_with, Answer};
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
    match probe_with(&r.addr, asked, timeout, &a.trust.security())? {
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
            let mut c = client::Client::connect(&r.addr, &a.remote.options()?)?;
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

/// The summary's note on `n` tree entries not copied ("" when none): without `-L` it says
/// `-L` follows links; with it, the links skipped are those it could not follow.
pub(crate) fn skipped_hint(n: u64, follow_links: bool) -> String {
    match n {
        0 => String::new(),
        n if follow_links => format!(
            ", {n} entr(y/ies) not copied (with -L: symlinks to nothing, in a loop or out of a server's root, and special files; see the warnings)"
        ),
        n => format!(", {n} entr(y/ies) not copied (symlinks: -L follows them; see the warnings)"),
    }
}

#[cfg(test)]
mod tests {
    use super::{files_label, shell_word, Bar};
    use ferry_xfer::client::Progress;

    fn hidden_bar(len: u64) -> indicatif::ProgressBar {
        indicatif::ProgressBar::with_draw_target(Some(len), indicatif::ProgressDrawTarget::hidden())
    }

    /// Many small reports in a row, as a copy of small files makes: the bar's update
    /// budget (ten in a burst, then one a millisecond) is spent, so the next `inc` is not
    /// recorded by the rate estimator at once.
    fn busy(bar: &Bar) {
        for _ in 0..50 {
            bar.add(1);
        }
    }

    /// 5 MiB in about 0.1 s after `bar` was credited bytes at once: the rate must be that
    /// of the 5 MiB (tens of MB/s), nowhere near the bytes credited.
    fn moves_5_mib_and_rates_them(bar: &Bar, pb: &indicatif::ProgressBar) {
        for _ in 0..5 {
            std::thread::sleep(std::time::Duration::from_millis(20));
            bar.add(1 << 20);
        }
        assert!(pb.per_sec() < 1e9, "rate {} B/s", pb.per_sec());
    }

    /// What a resume finds in place moves the bar but not its rate, also when it comes
    /// right after many small reports (the bar then records the jump late: it read
    /// "722 GiB/s" after a resume).
    #[test]
    fn bytes_already_there_stay_out_of_the_rate() {
        let pb = hidden_bar(4 << 30);
        let bar = Bar::new(Some(pb.clone()), false);
        std::thread::sleep(std::time::Duration::from_millis(20));
        busy(&bar);
        bar.already_there(2 << 30);
        moves_5_mib_and_rates_them(&bar, &pb);
        assert_eq!(pb.position(), 50 + (2 << 30) + (5 << 20));
    }

    /// A retry starts the bar over where its source began and its rate afresh; what the
    /// next attempt finds in place stays out of the rate as on a first resume.
    #[test]
    fn a_retry_counts_again_without_a_false_rate() {
        let pb = hidden_bar(4 << 30);
        let bar = Bar::new(Some(pb.clone()), true);
        bar.files(2);
        std::thread::sleep(std::time::Duration::from_millis(20));
        bar.add(3 << 30);
        bar.file_done();
        busy(&bar);
        bar.restart();
        assert_eq!(pb.position(), 0);
        assert_eq!(bar.files_counted(), (0, 0));
        bar.total(4 << 30);
        bar.files(2);
        bar.already_there(3 << 30);
        bar.file_done();
        moves_5_mib_and_rates_them(&bar, &pb);
        assert_eq!(pb.position(), (3 << 30) + (5 << 20));
        assert_eq!(pb.message(), "1/2 files");
    }

    /// A tree's bar counts files beside bytes; with several sources the count adds up,
    /// marked as a lower bound while sources remain to be listed.
    #[test]
    fn tree_copies_count_files() {
        let pb = hidden_bar(0);
        let bar = Bar::new(Some(pb.clone()), true);
        bar.next_source(true);
        bar.total(300);
        bar.files(3);
        for _ in 0..3 {
            bar.add(100);
            bar.file_done();
        }
        assert_eq!(pb.message(), "3/≥3 files");
        bar.next_source(false);
        bar.total(50);
        bar.files(2);
        assert_eq!(pb.length(), Some(350));
        assert_eq!(pb.message(), "3/5 files");
        bar.already_there(50);
        bar.file_done();
        bar.file_done();
        assert_eq!(pb.message(), "5/5 files");
        assert_eq!(bar.files_counted(), (5, 5));
        // A single file's bar shows no count (and a copy without a bar still counts).
        let plain = Bar::new(Some(hidden_bar(0)), false);
        plain.files(1);
        plain.file_done();
        assert_eq!(plain.bar.as_ref().map(|b| b.message()), Some(String::new()));
        let none = Bar::new(None, true);
        none.files(4);
        none.file_done();
        assert_eq!(none.files_counted(), (1, 4));
    }

    #[test]
    fn file_counts_read_as_done_of_total() {
        assert_eq!(files_label(412, 1000, false), "412/1000 files");
        assert_eq!(files_label(412, 1000, true), "412/≥1000 files");
        assert_eq!(files_label(0, 0, false), "0/0 files");
    }

    #[test]
    fn words_come_back_as_the_shell_reads_them() {
        assert_eq!(shell_word("host:data/a.bin"), "host:data/a.bin");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's"), "'it'\\''s'");
        assert_eq!(shell_word(""), "''");
    }
}
