//! `ferry ls`: names, or with `-l` the mode, a human size and the modification time, or with
//! `--json` one JSON object per entry; `-R` descends into directories.

use std::io::Write;

use clap::Args;
use ferry_xfer::client::Client;
use ferry_xfer::proto::{Entry, EntryKind};
use ferry_xfer::XferError;

use crate::units::human_size;
use crate::xfer::{remote_of, Remote};

#[derive(Args)]
pub struct LsArgs {
    /// Long listing: type and permissions, size (KiB, MiB, ... ; exact bytes with --json),
    /// modification time (UTC), name.
    #[arg(short = 'l', long = "long")]
    long: bool,
    /// List directories' contents too, recursively (names relative to TARGET).
    #[arg(short = 'R', long)]
    recursive: bool,
    /// One JSON object per entry on stdout: path, kind, mode, size (bytes), mtime (seconds
    /// since the epoch).
    #[arg(long, conflicts_with = "long")]
    json: bool,
    #[command(flatten)]
    remote: Remote,
    /// What to list: HOST:ROOT/PATH or ferry://HOST[:PORT]/ROOT/PATH (HOST: alone lists the roots).
    target: String,
}

/// Runs `ferry ls`.
pub fn ls(a: LsArgs) -> Result<(), XferError> {
    let r = remote_of(&a.target, &a.remote.driver)?;
    let opts = a.remote.options()?;
    // The path's STAT and LIST go with the handshake: one round trip for both.
    let (mut c, entry) = if r.path.is_empty() {
        (Client::connect(&r.addr, &opts)?, None)
    } else {
        let mut c = Client::connect_and_look(&r.addr, &opts, &r.path, true)?;
        let entry = c.look_once(&r.path, true)?;
        (c, Some(entry))
    };
    let mut out = std::io::stdout().lock();
    match entry {
        Some(e) if e.kind != EntryKind::Dir => show(&mut out, &a, "", &e),
        _ => list(&mut c, &mut out, &a, &r.path, "")?,
    }
    c.bye();
    Ok(())
}

/// Shows the entries of `dir` on the server (`prefix` before each name), and with `-R` the
/// directories among them after.
fn list(
    c: &mut Client,
    out: &mut impl Write,
    a: &LsArgs,
    dir: &str,
    prefix: &str,
) -> Result<(), XferError> {
    let entries = c.list_once(dir)?;
    for e in &entries {
        show(out, a, prefix, e);
    }
    if a.recursive {
        for e in entries.iter().filter(|e| e.kind == EntryKind::Dir) {
            let sub = join(dir, &e.name);
            list(c, out, a, &sub, &format!("{prefix}{}/", e.name))?;
        }
    }
    Ok(())
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{}/{name}", dir.trim_end_matches('/'))
    }
}

/// One entry, as the flags ask.
fn show(out: &mut impl Write, a: &LsArgs, prefix: &str, e: &Entry) {
    let path = format!("{prefix}{}", e.name);
    let line = if a.json {
        serde_json::json!({
            "path": path,
            "kind": kind_name(e.kind),
            "mode": e.mode,
            "size": e.size,
            "mtime": e.mtime,
        })
        .to_string()
    } else {
        let suffix = if e.kind == EntryKind::Dir { "/" } else { "" };
        let name = format!("{}{suffix}", printable(&path));
        if a.long {
            format!(
                "{} {:>10} {} {name}",
                mode_string(e.kind, e.mode),
                human_size(e.size),
                utc_minute(e.mtime)
            )
        } else {
            name
        }
    };
    let _ = writeln!(out, "{line}");
}

fn kind_name(k: EntryKind) -> &'static str {
    match k {
        EntryKind::File => "file",
        EntryKind::Dir => "dir",
        EntryKind::Symlink => "symlink",
        EntryKind::Other => "other",
    }
}

/// `drwxr-xr-x`, as ls(1) writes it (setuid, setgid and sticky bits included).
fn mode_string(kind: EntryKind, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        EntryKind::File => '-',
        EntryKind::Dir => 'd',
        EntryKind::Symlink => 'l',
        EntryKind::Other => '?',
    });
    let special = [(0o4000, 's'), (0o2000, 's'), (0o1000, 't')];
    for (who, (bit, mark)) in special.iter().enumerate() {
        let shift = 6 - 3 * who as u32;
        let bit_at = |at: u32| (mode >> at) & 1 == 1;
        let (r, w, x) = (bit_at(shift + 2), bit_at(shift + 1), bit_at(shift));
        s.push(if r { 'r' } else { '-' });
        s.push(if w { 'w' } else { '-' });
        s.push(match (x, mode & bit != 0) {
            (true, true) => *mark,
            (false, true) => mark.to_ascii_uppercase(),
            (true, false) => 'x',
            (false, false) => '-',
        });
    }
    s
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM` in UTC (days to a civil date by the
/// proleptic Gregorian calendar, valid for any `i64` day count that fits a year in `i64`).
fn utc_minute(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let of_day = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        of_day / 3600,
        of_day % 3600 / 60
    )
}

/// Days since 1970-01-01 to (year, month, day), after H. Hinnant's `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_escape_control_characters_only() {
        assert_eq!(printable("plain é name"), "plain é name");
        assert_eq!(printable("a\nb\u{1b}[2J"), "a\\nb\\u{1b}[2J");
    }

    #[test]
    fn modes_and_times_read_as_ls_writes_them() {
        assert_eq!(mode_string(EntryKind::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(mode_string(EntryKind::File, 0o640), "-rw-r-----");
        assert_eq!(mode_string(EntryKind::File, 0o4755), "-rwsr-xr-x");
        assert_eq!(mode_string(EntryKind::Dir, 0o1777), "drwxrwxrwt");
        assert_eq!(mode_string(EntryKind::File, 0o2644), "-rw-r-Sr--");
        assert_eq!(utc_minute(0), "1970-01-01 00:00");
        assert_eq!(utc_minute(951_782_400), "2000-02-29 00:00");
        assert_eq!(utc_minute(1_795_710_900), "2026-11-26 16:35");
        assert_eq!(utc_minute(-60), "1969-12-31 23:59");
    }
}
