//! Dropping privileges: `ferry serve --user NAME` binds its ports and opens its state
//! directory, roots and key files as root, then becomes NAME for good, so a flaw in a face
//! cannot act as root. FFI (libc), because glibc's `setuid` changes every thread of the
//! process, which a raw system call does not.

use crate::error::{Error, Kind, Result};

/// A user's ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ids {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
}

/// The ids of `user`: a name in `/etc/passwd`, or `UID[:GID]` in digits (GID defaults to
/// UID).
pub fn lookup(user: &str) -> Result<Ids> {
    if let Some(ids) = numeric(user) {
        return Ok(ids);
    }
    let passwd =
        std::fs::read_to_string("/etc/passwd").map_err(|e| Error::io("/etc/passwd", &e))?;
    passwd
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() >= 4 && f[0] == user).then(|| {
                Some(Ids {
                    uid: f[2].parse().ok()?,
                    gid: f[3].parse().ok()?,
                })
            })?
        })
        .next()
        .ok_or_else(|| {
            Error::new(
                Kind::Usage,
                format!("--user {user}: no such user in /etc/passwd (or give UID:GID)"),
            )
        })
}

/// `UID[:GID]` in digits.
fn numeric(s: &str) -> Option<Ids> {
    let (u, g) = s.split_once(':').unwrap_or((s, s));
    Some(Ids {
        uid: u.parse().ok()?,
        gid: g.parse().ok()?,
    })
}

/// Becomes `ids` for good: supplementary groups cleared, group, then user. Needs root; checks
/// afterwards that root cannot be regained.
pub fn drop_to(ids: Ids) -> Result<()> {
    let failed = |what: &str| {
        Error::new(
            Kind::Permission,
            format!(
                "cannot drop privileges ({what}): {} (--user needs ferry serve started as root)",
                std::io::Error::last_os_error()
            ),
        )
    };
    // SAFETY: setgroups reads one gid_t from a valid local; setgid and setuid take plain
    // integers. glibc applies each to every thread of the process.
    unsafe {
        let groups = [ids.gid as libc::gid_t];
        if libc::setgroups(1, groups.as_ptr()) != 0 {
            return Err(failed("setgroups"));
        }
        if libc::setgid(ids.gid as libc::gid_t) != 0 {
            return Err(failed("setgid"));
        }
        if libc::setuid(ids.uid as libc::uid_t) != 0 {
            return Err(failed("setuid"));
        }
    }
    // SAFETY: plain system calls without pointers.
    let regained = ids.uid != 0 && unsafe { libc::setuid(0) } == 0;
    if regained {
        return Err(Error::new(
            Kind::Permission,
            "dropped privileges but could become root again: refusing to serve",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_by_name_and_number() {
        assert_eq!(lookup("root").unwrap(), Ids { uid: 0, gid: 0 });
        assert_eq!(
            lookup("1000").unwrap(),
            Ids {
                uid: 1000,
                gid: 1000
            }
        );
        assert_eq!(lookup("1000:50").unwrap(), Ids { uid: 1000, gid: 50 });
        assert!(lookup("no-such-user-here").is_err());
    }
}
