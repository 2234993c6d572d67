//! `ferry sync`: make a destination hold what a source holds, moving only what differs.

use clap::Args;
use ferry_xfer::client::{self, Filter, Options, Skip, SyncHow};
use ferry_xfer::url;
use ferry_xfer::XferError;

use crate::units::human_size;
use crate::xfer::Remote;

#[derive(Args)]
pub struct SyncArgs {
    /// Remove what the destination has and the source does not (after the copy
    /// succeeded; what --include/--exclude leave out is never removed).
    #[arg(long)]
    delete: bool,
    /// Print what would be copied and removed, and change nothing.
    #[arg(short = 'n', long)]
    dry_run: bool,
    /// Compare files by size and BLAKE3 (reading both sides) instead of size and mtime.
    #[arg(short = 'c', long)]
    checksum: bool,
    /// Copy only files matching PATTERN (as `ferry cp --include`). Repeatable.
    #[arg(long, value_name = "PATTERN")]
    include: Vec<String>,
    /// Leave out what matches PATTERN (as `ferry cp --exclude`). Repeatable.
    #[arg(long, value_name = "PATTERN")]
    exclude: Vec<String>,
    /// Copy what symlinks point to (as `ferry cp -L`).
    #[arg(short = 'L', long)]
    follow_links: bool,
    /// Parallel streams (as `ferry cp -p`).
    #[arg(short = 'p', long = "streams", value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=16))]
    streams: u16,
    /// Print one JSON line on stdout: what was (or would be) copied and removed.
    #[arg(long)]
    json: bool,
    /// Token for the destination server when both ends are servers [default:
    /// $FERRY_DEST_TOKEN, else the same token].
    #[arg(long, value_name = "TOKEN")]
    dest_token: Option<String>,
    #[command(flatten)]
    remote: Remote,
    /// Source: a local path or a remote one (HOST:ROOT/PATH, ferry://HOST/ROOT/PATH, ...);
    /// it lands where `ferry cp -r` puts it (SRC/ for its contents).
    src: String,
    /// Destination: the other end. With both ends remote, the source server sends the
    /// files that differ straight to the destination server (a third-party copy: the
    /// source's operator must allow the destination, `ferry serve --allow-third-party`).
    dst: String,
}

/// `ferry sync`.
pub fn sync(a: SyncArgs, quiet: bool) -> Result<(), XferError> {
    let src = url::parse(&a.src, &a.remote.driver)?;
    let dst = url::parse(&a.dst, &a.remote.driver)?;
    let opts = Options {
        streams: a.streams,
        follow_links: a.follow_links,
        filter: Filter::new(&a.include, &a.exclude)?,
        skip: Skip::Unchanged,
        resume: true,
        dest_token: a
            .dest_token
            .or_else(|| std::env::var("FERRY_DEST_TOKEN").ok()),
        ..a.remote.options()?
    };
    let how = SyncHow {
        delete: a.delete,
        dry_run: a.dry_run,
        checksum: a.checksum,
    };
    let start = std::time::Instant::now();
    let r = client::sync(&src, &dst, how, &opts, &())?;
    let secs = start.elapsed().as_secs_f64();
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "ok": true, "op": "sync", "dry_run": a.dry_run,
                "copied": r.copied, "removed": r.removed,
                "files": r.stats.files, "files_unchanged": r.stats.files_skipped,
                "entries_skipped": r.stats.entries_skipped,
                "bytes": r.stats.bytes, "wire_bytes": r.stats.wire_bytes, "seconds": secs,
            })
        );
        return Ok(());
    }
    if a.dry_run {
        for p in &r.copied {
            println!("copy {}", if p.is_empty() { &a.src } else { p });
        }
        for p in &r.removed {
            println!("remove {p}");
        }
    } else if !quiet {
        let skipped = crate::xfer::skipped_hint(r.stats.entries_skipped, a.follow_links);
        eprintln!(
            "{} file(s) copied ({}), {} unchanged, {} removed{skipped}, in {secs:.2} s",
            r.copied.len(),
            human_size(r.stats.wire_bytes),
            r.stats.files_skipped,
            r.removed.len()
        );
    }
    Ok(())
}
