//! Named network namespaces (the `ip netns` kind, bind-mounted under /run/netns so any
//! process can `ip netns exec` into them) and the `ip` commands that configure them.

use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::process::Command;

use rustix::fs::{open, Mode, OFlags};
use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};

use crate::error::Error;

/// Where `ip netns` keeps its namespaces.
pub(crate) const NETNS_DIR: &str = "/run/netns";
/// Where `ip netns exec NAME` finds files it bind-mounts over /etc (`/etc/netns/NAME/hosts`
/// becomes the command's /etc/hosts).
const ETC_NETNS_DIR: &str = "/etc/netns";

/// A namespace this process created; deleted on drop.
#[derive(Debug)]
pub(crate) struct Netns {
    pub name: String,
}

impl Netns {
    /// Creates the namespace and brings its loopback up.
    pub fn create(name: &str) -> Result<Netns, Error> {
        ip(&["netns", "add", name])?;
        let ns = Netns {
            name: name.to_string(),
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Gives commands run through `ip netns exec` an /etc/hosts of the host's entries
    /// plus `names`. The namespace reaches no resolver, so a program that looks its own
    /// address up (GridFTP's server does) would fail with "temporary failure in name
    /// resolution" without them. Removed with the namespace.
    pub fn write_hosts(&self, names: &[(std::net::Ipv4Addr, &str)]) -> Result<(), Error> {
        let dir = std::path::Path::new(ETC_NETNS_DIR).join(&self.name);
        let mut hosts = fs::read_to_string("/etc/hosts").unwrap_or_default();
        if !hosts.is_empty() && !hosts.ends_with('\n') {
            hosts.push('\n');
        }
        for (addr, name) in names {
            hosts += &format!("{addr} {name}\n");
        }
        fs::create_dir_all(&dir)
            .and_then(|()| fs::write(dir.join("hosts"), hosts))
            .map_err(|e| Error::io(format!("write {}/hosts", dir.display()), e))
    }

    /// Runs `ip -n NAME ARGS...`.
    pub fn ip(&self, args: &[&str]) -> Result<(), Error> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Runs `f` on a thread that has moved into this namespace, so the sockets, devices
    /// and /proc/sys/net files it opens are the namespace's. The rest of the process
    /// stays where it is.
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, Error> {
        let path = format!("{NETNS_DIR}/{}", self.name);
        let handle: OwnedFd = open(&path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| Error::io(format!("open {path}"), e.into()))?;
        std::thread::scope(|s| {
            s.spawn(|| {
                move_into_link_name_space(handle.as_fd(), Some(LinkNameSpaceType::Network))
                    .map_err(|e| Error::io(format!("setns into {}", self.name), e.into()))?;
                Ok(f())
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Writes a sysctl of this namespace (a path under /proc/sys/net); must be called on a
    /// thread inside it (see `enter`).
    pub fn write_sysctl(key: &str, value: &str) -> Result<(), Error> {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        fs::write(&path, value).map_err(|e| Error::io(format!("set {key} = {value}"), e))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Best effort: a namespace already gone (`ferry-wan down --all` ran) is fine.
        let _ = ip(&["netns", "del", &self.name]);
        remove_etc(&self.name);
    }
}

/// Removes `/etc/netns/NAME` (see [`Netns::write_hosts`]); best effort.
pub(crate) fn remove_etc(name: &str) {
    if !name.is_empty() && !name.contains('/') && !name.starts_with('.') {
        let _ = fs::remove_dir_all(std::path::Path::new(ETC_NETNS_DIR).join(name));
    }
}

/// Runs `ip ARGS...` and turns a failure into an error holding its stderr.
pub(crate) fn ip(args: &[&str]) -> Result<(), Error> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| Error::io("run `ip` (apt-get install iproute2)".to_string(), e))?;
    if out.status.success() {
        return Ok(());
    }
    Err(Error::Command {
        cmd: format!("ip {}", args.join(" ")),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}

/// Names of the namespaces under /run/netns that start with `prefix`.
pub(crate) fn list(prefix: &str) -> Vec<String> {
    let Ok(dir) = fs::read_dir(NETNS_DIR) else {
        return Vec::new();
    };
    let mut names: Vec<String> = dir
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    names
}
