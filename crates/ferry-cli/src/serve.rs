//! `ferry serve`: one daemon hosting ferry's faces (file transfer, collective I/O, the block
//! service) behind one configuration file, one authentication and one admission. This is the
//! composition root: each face is built from its part of the configuration and added to the
//! service floor's [`Daemon`], which owns the process's life (signals, drain, the wedge exit).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use ferry_block::config::{BlockConfig, ExportConfig};
use ferry_service::admit::Admission;
use ferry_service::daemon::Daemon;
use ferry_xfer::config::{RootConfig, ServerConfig};
use ferry_xfer::{Kind, XferError};

#[derive(Args)]
pub struct ServeArgs {
    /// TOML configuration (listen (one address or a list), block_size, ring, mem, direct, checksum_cache, keep_special_bits, third_party, audit_log, [auth] tokens/token_files/anonymous/anonymous_write/authorized_keys, [limits], [[root]] name/path, [security] state_dir/allow_clear/protection; docs/xfer.md, docs/security.md; [cio] collective I/O, docs/cio.md).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Export a directory as NAME (repeatable; adds to the config's roots).
    #[arg(long = "root", value_name = "NAME=PATH")]
    roots: Vec<String>,
    /// Export a directory as NAME for reading only: uploads and new directories there are
    /// refused (repeatable; `read_only = true` in a config's [[root]]).
    #[arg(long = "read-only-root", value_name = "NAME=PATH")]
    read_only_roots: Vec<String>,
    /// Address to listen on [default: tcp://0.0.0.0:7370]; also ofi+tcp://HOST:PORT, ofi+shm://NAME.
    /// Repeatable: every address is served alike (replaces the config's `listen`).
    #[arg(long = "listen", value_name = "URL")]
    listen: Vec<String>,
    /// Accept clients without a token (trusted networks only), for reading only unless
    /// --anonymous-write.
    #[arg(long)]
    anonymous: bool,
    /// Let anonymous clients write too: upload, remove, make directories
    /// (`[auth] anonymous_write = true`).
    #[arg(long, requires = "anonymous")]
    anonymous_write: bool,
    /// Append one JSON line per client request to FILE (time, peer, credential, face,
    /// operation, path, bytes, duration, result, error; `audit_log` in the config); without
    /// it, a line per transfer goes to the server's log.
    #[arg(long, value_name = "FILE")]
    audit_log: Option<PathBuf>,
    /// Accept the client keys in FILE (`ferry keygen` .pub lines, one per line, each
    /// optionally after `roots=NAME,...` and `ro`; `[auth] authorized_keys`; docs/security.md).
    #[arg(long, value_name = "FILE")]
    authorized_keys: Option<PathBuf>,
    /// Memory mode: also export the virtual root `mem` (read mem/zero/SIZE, write mem/null)
    /// so copies can skip the disk on this side.
    #[arg(long)]
    mem: bool,
    /// Read and write file data with direct I/O (O_DIRECT), bypassing the page cache
    /// (also `direct = true` in the config). Without it, files of 64 MiB or more on a disk
    /// filesystem are written so anyway, and read so where they are not cached.
    #[arg(long)]
    direct: bool,
    /// Keep no checksum cache: hash every file sent, and write no user.ferry.blake3
    /// attribute (also `checksum_cache = false` in the config).
    #[arg(long)]
    no_checksum_cache: bool,
    /// Accept this token (repeatable; adds to the config's [auth] tokens). Every user of
    /// this machine can read it in `ps`: prefer --token-file or $FERRY_TOKEN.
    #[arg(long = "token", value_name = "TOKEN")]
    tokens: Vec<String>,
    /// Accept the tokens in FILE, one per line (repeatable; `#` starts a comment line).
    /// Keep it private (chmod 600); `ferry token new` makes a token. $FERRY_TOKEN, when
    /// set, is accepted too.
    #[arg(long = "token-file", value_name = "FILE")]
    token_files: Vec<PathBuf>,
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
    /// Export a file or block device to NBD clients as NAME (repeatable; adds to the
    /// config's [[block.export]]; docs/block.md): nbdinfo nbd://127.0.0.1/NAME.
    #[arg(long = "nbd-export", value_name = "NAME=PATH")]
    nbd_exports: Vec<String>,
    /// Where NBD clients connect: HOST:PORT or unix:PATH [default: 127.0.0.1:10809].
    /// Repeatable (replaces the config's [block] listen).
    #[arg(long = "nbd-listen", value_name = "ADDR")]
    nbd_listen: Vec<String>,
    /// Where the server keeps its identity (key pair and certificate, made at first start,
    /// mode 0600) [default: $FERRY_STATE_DIR, else /var/lib/ferry as root, else
    /// $XDG_STATE_HOME/ferry; config `[security] state_dir`].
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Also let in clients that ask for a clear connection (ferry cp --insecure-clear):
    /// no TLS, tokens and file names in clear. Trusted networks only
    /// [config `[security] allow_clear`].
    #[arg(long)]
    allow_clear: bool,
    /// After binding its addresses and opening its state directory, roots and key files,
    /// become this user for good (a name in /etc/passwd, or UID:GID); needs starting as root.
    #[arg(long, value_name = "NAME")]
    user: Option<String>,
    /// The data protection levels TLS clients may ask for (ferry cp --protect), comma
    /// separated: clear, integrity, private [default: integrity; config `[security]
    /// protection`]. `clear` lets blocks cross with a CRC-32C only; `private` encrypts them
    /// (AES-256-GCM, docs/security.md).
    #[arg(long, value_name = "LEVELS", value_delimiter = ',', value_parser = crate::xfer::parse_level)]
    protection: Vec<ferry_service::secure::Level>,
    /// Print the server's identity fingerprint (what clients pin: ferry cp
    /// --server-fingerprint, known_hosts), making the identity if there is none, and exit.
    #[arg(long)]
    fingerprint: bool,
}

fn parse_budget(s: &str) -> Result<u64, String> {
    ferry_service::config::parse_size(s).map_err(|e| format!("{e}: give bytes, e.g. 4G or 512M"))
}

/// Runs `ferry serve` until a signal, then drains.
pub fn serve(mut a: ServeArgs) -> Result<(), XferError> {
    let mut table = match &a.config {
        Some(p) => read_config(p)?,
        None => toml::Table::new(),
    };
    let cio_cfg = cio_config(&mut table)?;
    let grace = std::time::Duration::try_from_secs_f64(a.drain_timeout).map_err(|_| {
        XferError::new(
            Kind::Usage,
            format!("--drain-timeout {}: give seconds >= 0", a.drain_timeout),
        )
    })?;
    let config_file = a.config.clone();
    let block = block_config(
        table.remove("block"),
        std::mem::take(&mut a.nbd_exports),
        std::mem::take(&mut a.nbd_listen),
    )?;
    let print_fingerprint = a.fingerprint;
    let user = a
        .user
        .as_deref()
        .map(ferry_service::privs::lookup)
        .transpose()?;
    let mut cfg = xfer_config(table, a)?;
    if print_fingerprint {
        let security = cfg.security.load()?;
        println!("{}", security.fingerprint().unwrap_or("none"));
        return Ok(());
    }
    secrets(&mut cfg, config_file.as_deref())?;
    let roots = cfg.roots.clone();
    let daemon = faces(cfg, cio_cfg, &roots, block.as_ref())?;
    let mut running = daemon.start()?;
    if let Some(ids) = user {
        ferry_service::privs::drop_to(ids)?;
        tracing::info!("running as uid {} gid {}", ids.uid, ids.gid);
    }
    let addresses = running.addresses();
    for addr in &addresses {
        println!("listening on {addr}");
    }
    let _ = std::io::stdout().flush();
    greet(&roots, &addresses);
    running.serve_until_signal();
    eprintln!(
        "ferry serve: signal received; not accepting connections; letting those open finish (up to {:.0} s)",
        grace.as_secs_f64()
    );
    let r = running.drain(grace);
    eprintln!(
        "ferry serve: stopped: {} connection(s) open at the signal, {} finished, {} stopped (uploads journaled), {} abandoned at their last checkpoint",
        r.in_flight,
        r.in_flight.saturating_sub(r.interrupted + r.abandoned),
        r.interrupted,
        r.abandoned
    );
    Ok(())
}

/// The block service's configuration: the file's `[block]` table with the command line's
/// exports and addresses on top; `None` when neither asks for one.
fn block_config(
    table: Option<toml::Value>,
    exports: Vec<String>,
    listen: Vec<String>,
) -> Result<Option<BlockConfig>, XferError> {
    let usage = |m: String| XferError::new(Kind::Usage, m);
    let mut cfg = match table {
        None if exports.is_empty() && listen.is_empty() => return Ok(None),
        None => BlockConfig::default(),
        Some(toml::Value::Table(t)) => BlockConfig::parse_table(t)?,
        Some(_) => {
            return Err(usage(
                "block in the configuration must be a table ([block])".into(),
            ))
        }
    };
    for e in exports {
        let (name, path) = e
            .split_once('=')
            .ok_or_else(|| usage(format!("--nbd-export {e}: write NAME=PATH")))?;
        cfg.exports.push(ExportConfig::file(name, path));
    }
    if !listen.is_empty() {
        cfg.listen = listen;
    }
    cfg.validate()?;
    Ok(Some(cfg))
}

/// The daemon with every face the configuration asks for. One configured for block exports
/// only hosts no file transfer (which would ask for roots and tokens it has no use for),
/// nor collective I/O (which works in roots).
fn faces(
    cfg: ServerConfig,
    cio_cfg: ferry_cio::CioConfig,
    roots: &[RootConfig],
    block: Option<&BlockConfig>,
) -> Result<Daemon, XferError> {
    let mut nbd = block.map(ferry_block::BlockServer::new).transpose()?;
    let mut daemon = if block.is_some() && cfg.roots.is_empty() && !cfg.mem {
        if let Some(nbd) = &mut nbd {
            let audit = ferry_service::audit::Audit::open(cfg.audit_log.as_deref())?;
            nbd.set_audit(Arc::new(audit));
        }
        let admission = Admission::new(&cfg.limits, |_, _| 0);
        // No EXS listener: TLS is never offered, no identity is made.
        let security = ferry_service::secure::ServerSecurity::none();
        Daemon::new(Vec::new(), cfg.auth.clone(), admission, security)
    } else {
        let xfer = ferry_xfer::server::Server::new(cfg)?;
        let (auth, admission) = (xfer.auth().clone(), xfer.admission().clone());
        // One audit log for every face.
        let audit = xfer.audit().clone();
        if let Some(nbd) = &mut nbd {
            nbd.set_audit(audit.clone());
        }
        let security = xfer.security().clone();
        if let Some(fp) = security.fingerprint() {
            tracing::info!("identity {fp} (clients pin it; `ferry serve --fingerprint` prints it)");
        }
        let mut daemon = Daemon::new(
            xfer.listen().to_vec(),
            auth.clone(),
            admission.clone(),
            security,
        );
        daemon.add_service(ferry_xfer::server::SERVICE, xfer)?;
        // Collective I/O over the same roots, behind the same tokens and admission; it
        // opens files for writing, so it is given the writable roots only.
        let writable: Vec<(String, PathBuf)> = (roots.iter().filter(|r| !r.read_only))
            .map(|r| (r.name.clone(), r.path.clone()))
            .collect();
        let cio = ferry_cio::server::Server::new(
            cio_cfg,
            &writable,
            (auth.clone(), admission.clone()),
            audit.clone(),
        )
        .map_err(cio_err)?;
        daemon.add_service(ferry_cio::server::SERVICE, cio)?;
        // The block exports' RMA path on the fabric port, over the NBD server's storage.
        if let Some(nbd) = &nbd {
            let exports = nbd
                .exports()
                .iter()
                .map(|e| ferry_block::Export {
                    info: e.info.clone(),
                    backend: e.backend.clone(),
                    tls_required: e.tls_required,
                })
                .collect();
            let face = ferry_block::deleg::server::FabricService::new(
                exports,
                auth,
                admission,
                block.map_or_else(Default::default, ferry_block::deleg::server::PoolConfig::of),
            );
            daemon.add_service(ferry_block::deleg::SERVICE, Arc::new(face))?;
        }
        daemon
    };
    if let Some(nbd) = nbd {
        for e in nbd.exports() {
            tracing::info!(
                "exporting block device {} ({} bytes)",
                e.info.name,
                e.info.size
            );
        }
        daemon.add_endpoint(Arc::new(nbd));
    }
    Ok(daemon)
}

/// Says what is exported and how a client reaches it.
fn greet(roots: &[RootConfig], addresses: &[String]) {
    for r in roots {
        let how = if r.read_only { " (read-only)" } else { "" };
        tracing::info!("exporting {} = {}{how}", r.name, r.path.display());
    }
    if let (Some(RootConfig { name, .. }), Some(addr)) = (roots.first(), addresses.first()) {
        tracing::info!(
            "from a client: ferry cp FILE {}/{name}/ (token in FERRY_TOKEN)",
            reachable(addr)
        );
    }
}

/// `addr` as a client elsewhere would write it: a wildcard host becomes this host's name.
fn reachable(addr: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "HOST".into());
    ["0.0.0.0", "[::]"]
        .iter()
        .find_map(|w| {
            let (scheme, rest) = addr.split_once("://")?;
            let port = rest.strip_prefix(w)?;
            Some(format!("{scheme}://{host}{port}"))
        })
        .unwrap_or_else(|| addr.to_string())
}

/// The configuration file as a TOML table, each face taking its part.
fn read_config(path: &std::path::Path) -> Result<toml::Table, XferError> {
    let text = std::fs::read_to_string(path).map_err(|e| XferError::io(path.display(), &e))?;
    text.parse().map_err(|e| {
        XferError::new(
            Kind::Usage,
            format!("{}: bad server configuration: {e}", path.display()),
        )
    })
}

/// Collective I/O's configuration: the file's `[cio]` table, taken out (file transfer's
/// configuration is the rest).
fn cio_config(table: &mut toml::Table) -> Result<ferry_cio::CioConfig, XferError> {
    match table.remove("cio") {
        None => Ok(ferry_cio::CioConfig::default()),
        Some(toml::Value::Table(t)) => ferry_cio::CioConfig::from_table(t).map_err(cio_err),
        Some(_) => Err(XferError::new(Kind::Usage, "[cio] must be a table")),
    }
}

/// A collective I/O setup error as `ferry serve` reports it.
fn cio_err(e: ferry_cio::CioError) -> XferError {
    let kind = match e.class {
        ferry_cio::ErrorClass::Arg => Kind::Usage,
        _ => Kind::Io,
    };
    XferError::new(kind, format!("collective I/O (cio): {}", e.message))
}

/// File transfer's configuration (with the daemon's listen addresses, authentication and
/// limits): the file's top level, then the command line on top.
fn xfer_config(table: toml::Table, a: ServeArgs) -> Result<ServerConfig, XferError> {
    let mut cfg = ServerConfig::from_table(table)?;
    let writable = a.roots.iter().map(|r| (r, false));
    for (r, read_only) in writable.chain(a.read_only_roots.iter().map(|r| (r, true))) {
        let (name, path) = r
            .split_once('=')
            .ok_or_else(|| XferError::new(Kind::Usage, format!("--root {r}: write NAME=PATH")))?;
        cfg.roots.push(RootConfig {
            name: name.into(),
            path: path.into(),
            read_only,
        });
    }
    if !a.listen.is_empty() {
        cfg.listen = a.listen;
    }
    cfg.auth.anonymous |= a.anonymous;
    cfg.auth.anonymous_write |= a.anonymous_write;
    if let Some(f) = a.authorized_keys {
        cfg.auth.authorized_keys = Some(f);
    }
    if let Some(f) = a.audit_log {
        cfg.audit_log = Some(f);
    }
    cfg.security.allow_clear |= a.allow_clear;
    if !a.protection.is_empty() {
        cfg.security.protection = Some(a.protection);
    }
    if let Some(d) = a.state_dir {
        cfg.security.state_dir = Some(d);
    }
    cfg.mem |= a.mem;
    cfg.direct |= a.direct;
    cfg.checksum_cache &= !a.no_checksum_cache;
    if !a.tokens.is_empty() {
        tracing::warn!("--token is visible to every user of this machine (ps): prefer --token-file or FERRY_TOKEN");
    }
    cfg.auth.tokens.extend(a.tokens);
    cfg.auth.token_files.extend(a.token_files);
    if let Some(t) = std::env::var("FERRY_TOKEN").ok().filter(|t| !t.is_empty()) {
        cfg.auth.tokens.push(t);
    }
    cfg.third_party.extend(a.third_party);
    let limits = &mut cfg.limits;
    limits.max_connections = a.max_connections.unwrap_or(limits.max_connections);
    limits.max_per_address = a.max_per_address.unwrap_or(limits.max_per_address);
    limits.idle_timeout = a.idle_timeout.unwrap_or(limits.idle_timeout);
    limits.memory_budget = a.memory_budget.or(limits.memory_budget);
    Ok(cfg)
}

/// Reads the token files and warns about secrets others can read or guess: the token
/// files, a configuration file holding tokens, short tokens.
fn secrets(cfg: &mut ServerConfig, config_file: Option<&Path>) -> Result<(), XferError> {
    let has_tokens = !cfg.auth.tokens.is_empty();
    let warnings = cfg.auth.load_token_files()?;
    let config_warning = config_file
        .filter(|_| has_tokens)
        .and_then(ferry_service::auth::secret_file_warning);
    for w in config_warning.into_iter().chain(warnings) {
        tracing::warn!("{w}");
    }
    Ok(())
}
