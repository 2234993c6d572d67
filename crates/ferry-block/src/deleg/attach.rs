//! `ferry block attach`: an export of a remote `ferry serve`, reached over the RMA path,
//! served to local NBD clients (fio, nbdcopy, qemu-img, nbdfuse) by the NBD server of this
//! crate. [`RemoteBackend`] is the [`Backend`] it serves: every call goes to one of a few
//! sessions ([`Client`]s) with the remote export, each shared by the NBD server's workers,
//! so their requests stay in flight together on the fabric (up to each session's credits).
//! Writes go to the session their offset's chunk-sized span picks, so that writes which
//! follow one another meet in one session and merge there ([`super::merge`]); reads and
//! everything else take turns.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};

use ferry_service::Kind;

use super::client::{Client, Options};
use crate::backend::{Backend, Extent, Zeroing};

/// Sessions an attachment opens by default: each keeps up to its credits (16 with the
/// default pool) requests in flight, and each is served by a thread and a few workers of
/// the remote server.
pub const DEFAULT_SESSIONS: usize = 4;

/// A remote export as a local backend.
pub struct RemoteBackend {
    size: u64,
    readonly: bool,
    sessions: Vec<Client>,
    /// The span of the export that picks a write's session: a chunk (the largest request).
    span: u64,
    /// The session the next call starts looking at (round robin).
    next: AtomicUsize,
}

impl RemoteBackend {
    /// Opens `sessions` sessions (at least one) with the export at `addr` as `opts` says.
    pub fn connect(addr: &str, opts: &Options, sessions: usize) -> ferry_service::Result<Self> {
        let mut all = Vec::new();
        for _ in 0..sessions.max(1) {
            all.push(Client::connect(addr, opts)?);
        }
        let (size, readonly) = (all[0].size(), all[0].readonly());
        let span = u64::from(all[0].chunk_size().max(1));
        Ok(RemoteBackend {
            size,
            readonly,
            sessions: all,
            span,
            next: AtomicUsize::new(0),
        })
    }

    /// Whether the remote export refuses writes.
    pub fn readonly(&self) -> bool {
        self.readonly
    }

    /// Runs `f` on the next session that is not broken (round robin). A session that broke
    /// at the connection level is passed over from then on; the call fails once none is left.
    fn with<R>(&self, f: impl FnOnce(&Client) -> ferry_service::Result<R>) -> io::Result<R> {
        self.with_from(self.next.fetch_add(1, Ordering::Relaxed), f)
    }

    /// Runs `f` on the session that the span of `offset` picks (or the next one not broken).
    fn with_at<R>(
        &self,
        offset: u64,
        f: impl FnOnce(&Client) -> ferry_service::Result<R>,
    ) -> io::Result<R> {
        let n = self.sessions.len() as u64;
        self.with_from(((offset / self.span) % n) as usize, f)
    }

    fn with_from<R>(
        &self,
        start: usize,
        f: impl FnOnce(&Client) -> ferry_service::Result<R>,
    ) -> io::Result<R> {
        let n = self.sessions.len();
        let Some(c) = (0..n)
            .map(|i| &self.sessions[(start + i) % n])
            .find(|c| !c.is_broken())
        else {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "no session with the remote export is left",
            ));
        };
        f(c).map_err(to_io)
    }
}

/// A remote failure as the NBD server reports it (its errno chosen from the kind).
fn to_io(e: ferry_service::Error) -> io::Error {
    let errno = match e.kind {
        Kind::Permission => rustix::io::Errno::PERM,
        Kind::Usage => rustix::io::Errno::INVAL,
        _ => rustix::io::Errno::IO,
    };
    tracing::debug!("remote block export: {e}");
    io::Error::from_raw_os_error(errno.raw_os_error())
}

impl Backend for RemoteBackend {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.with(|c| c.read_at(offset, buf))
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.with_at(offset, |c| c.write_at(offset, buf, fua))
    }

    /// A FLUSH on any session covers every write the export acknowledged: the remote
    /// export's storage is shared by all its sessions.
    fn flush(&self) -> io::Result<()> {
        self.with(|c| c.flush())
    }

    fn trim(&self, offset: u64, len: u64, _fua: bool) -> io::Result<()> {
        self.with(|c| pieces(offset, len, |o, n| c.trim(o, n)))
    }

    fn write_zeroes(&self, offset: u64, len: u64, how: Zeroing) -> io::Result<()> {
        if how.fast {
            return Err(crate::backend::not_fast());
        }
        self.with(|c| pieces(offset, len, |o, n| c.write_zeroes(o, n, !how.may_trim)))?;
        if how.fua {
            self.flush()?;
        }
        Ok(())
    }

    /// Unknown from here: all data.
    fn extents(&self, _offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        Ok(vec![Extent {
            len,
            hole: false,
            zero: false,
        }])
    }
}

/// Runs `f` over `len` bytes from `offset` in pieces a request's `u32` length holds.
fn pieces(
    offset: u64,
    len: u64,
    mut f: impl FnMut(u64, u32) -> ferry_service::Result<()>,
) -> ferry_service::Result<()> {
    const MAX: u64 = 1 << 30;
    let mut done = 0;
    while done < len {
        let n = (len - done).min(MAX);
        f(offset + done, n as u32)?;
        done += n;
    }
    Ok(())
}

/// Splits `ADDRESS/EXPORT` (`ofi+shm://ferry/disk`, `tcp://host:7000/disk`) into the
/// fabric address and the export's name.
pub fn split_url(url: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let slash = rest.find('/')?;
    let export = &rest[slash + 1..];
    if export.is_empty() || rest[..slash].is_empty() {
        return None;
    }
    Some((&url[..scheme.len() + 3 + slash], export))
}

#[cfg(test)]
mod tests {
    use super::split_url;

    #[test]
    fn urls_split_into_address_and_export() {
        assert_eq!(
            split_url("ofi+shm://ferry/disk"),
            Some(("ofi+shm://ferry", "disk"))
        );
        assert_eq!(
            split_url("tcp://127.0.0.1:7000/a/b"),
            Some(("tcp://127.0.0.1:7000", "a/b"))
        );
        assert_eq!(split_url("tcp://127.0.0.1:7000"), None);
        assert_eq!(split_url("tcp://127.0.0.1:7000/"), None);
        assert_eq!(split_url("disk"), None);
    }
}
