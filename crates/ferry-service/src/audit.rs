//! The audit log: one record per operation a client had a server do (who, from where, what,
//! how much, how long, how it ended), filled by each face's server ([`Record`]) and
//! written by the floor ([`Audit`]): to `audit_log = "PATH"` as one JSON object per line, or,
//! without one, as a human line in the server's log for each operation that moves or
//! changes data (`docs/security.md`, "Audit log").
//!
//! A record names the credential by [`crate::auth::Principal::id`] (a key fingerprint, a
//! token's identifier, `anonymous`): no secret is ever in it.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

/// What a client had the server do, once it is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// When it began.
    pub time: SystemTime,
    /// The client's address.
    pub peer: String,
    /// Who it authenticated as ([`crate::auth::Principal::id`]).
    pub credential: String,
    /// The face (`xfer`, `cio`, `block`).
    pub face: &'static str,
    /// The operation (`get`, `put`, `list`, `remove`, ...).
    pub op: &'static str,
    /// `root/path` it named.
    pub path: String,
    /// Bytes of file data it moved (0 for those that move none).
    pub bytes: u64,
    /// How long it took.
    pub duration: Duration,
    /// `None` if it succeeded; else why not (what the client was told).
    pub error: Option<String>,
    /// For a session that both reads and writes (a block device's): the bytes read and
    /// the bytes written (`bytes` is their sum), as `read` and `written` in the JSON line.
    pub read_written: Option<(u64, u64)>,
    /// Of `bytes`, those sent straight from the page cache, never read into the server's
    /// memory (a file whose blocks' checks the checksum cache holds,
    /// [`crate::sumcache`]): `unread` in the JSON line, when any.
    pub unread: u64,
}

impl Record {
    /// The record as one JSON object (no newline).
    pub fn json(&self) -> String {
        let mut v = serde_json::json!({
            "time": rfc3339(self.time),
            "peer": self.peer,
            "credential": self.credential,
            "face": self.face,
            "op": self.op,
            "path": self.path,
            "bytes": self.bytes,
            "duration_s": (self.duration.as_secs_f64() * 1e6).round() / 1e6,
            "result": if self.error.is_some() { "error" } else { "ok" },
            "error": self.error,
        });
        if let (Some((read, written)), Some(o)) = (self.read_written, v.as_object_mut()) {
            o.insert("read".into(), read.into());
            o.insert("written".into(), written.into());
        }
        if let (n @ 1.., Some(o)) = (self.unread, v.as_object_mut()) {
            o.insert("unread".into(), n.into());
        }
        v.to_string()
    }

    /// The record as a line for people: `PEER CREDENTIAL: OP PATH, BYTES in SECONDS: ok`.
    pub fn human(&self) -> String {
        let outcome = match &self.error {
            None => "ok".to_string(),
            Some(e) => format!("failed: {e}"),
        };
        format!(
            "{} ({}): {} {} {}, {} bytes in {:.3} s: {outcome}",
            self.peer,
            self.credential,
            self.face,
            self.op,
            self.path,
            self.bytes,
            self.duration.as_secs_f64()
        )
    }
}

/// Where a server's records go.
#[derive(Debug)]
pub struct Audit {
    file: Option<Mutex<File>>,
}

impl Audit {
    /// Records to the file `path` (appended to, made with mode 0600: it names who did
    /// what), or, with `None`, to the server's log.
    pub fn open(path: Option<&Path>) -> Result<Audit> {
        let file = match path {
            None => None,
            Some(p) => Some(Mutex::new(
                std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .mode(0o600)
                    .open(p)
                    .map_err(|e| Error::io(format!("audit log {}", p.display()), &e))?,
            )),
        };
        Ok(Audit { file })
    }

    /// Writes `r`: a JSON line to the audit file (one write, so lines of concurrent
    /// connections never interleave), else a line in the log, at info level for operations
    /// that move or change data (`quiet`: false) and at debug level for the others
    /// (listings, stats), so an `ls` does not fill the log.
    pub fn write(&self, r: &Record, quiet: bool) {
        match &self.file {
            Some(f) => {
                let mut line = r.json();
                line.push('\n');
                let mut f = f.lock().unwrap_or_else(|p| p.into_inner());
                if let Err(e) = f.write_all(line.as_bytes()) {
                    tracing::warn!("audit log: {e}");
                }
            }
            None if quiet => tracing::debug!("{}", r.human()),
            None => tracing::info!("{}", r.human()),
        }
    }
}

/// `t` as RFC 3339 in UTC with milliseconds (`2026-11-26T22:46:19.112Z`).
fn rfc3339(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_as_json_and_as_lines() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_795_732_779_112);
        assert_eq!(rfc3339(t), "2026-11-26T22:39:39.112Z");
        let r = Record {
            time: t,
            peer: "127.0.0.1".into(),
            credential: "token 0011223344556677".into(),
            face: "xfer",
            op: "get",
            path: "d/f".into(),
            bytes: 42,
            duration: Duration::from_millis(1500),
            error: None,
            read_written: None,
            unread: 0,
        };
        let v: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(v["result"], "ok");
        assert_eq!(v["bytes"], 42);
        assert_eq!(v["duration_s"], 1.5);
        assert!(v["error"].is_null());
        assert!(r.human().contains("xfer get d/f, 42 bytes in 1.500 s: ok"));
        let failed = Record {
            error: Some("no root named \"x\"".into()),
            ..r
        };
        let v: serde_json::Value = serde_json::from_str(&failed.json()).unwrap();
        assert_eq!(v["result"], "error");
        assert_eq!(v["error"], "no root named \"x\"");
        assert!(v.get("read").is_none());
        let session = Record {
            read_written: Some((40, 2)),
            unread: 0,
            ..failed
        };
        let v: serde_json::Value = serde_json::from_str(&session.json()).unwrap();
        assert_eq!(
            (v["read"].as_u64(), v["written"].as_u64()),
            (Some(40), Some(2))
        );
    }
}
