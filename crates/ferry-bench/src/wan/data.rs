//! The test data of `bench wan`: in /dev/shm the memory workload's file (the peers' source;
//! ferry reads `mem/zero`), the small-file tree and a warm-up file; on disk (/var/tmp) the
//! disk workloads' file and the two traces' files. Both namespaces see the same files (a
//! network namespace shares the filesystem). Removed when the run ends.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::{Plan, WanRow};
use crate::cp::data::write_data;

/// Bytes of the warm-up file.
pub const WARM_BYTES: u64 = 1 << 20;

/// The run's directories; both are removed on drop.
pub struct Workspace {
    /// In /dev/shm: `big`, `small/`, `warm`, `out-small/`.
    pub shm: PathBuf,
    /// On disk (/var/tmp): `big`, `ccsm/`, `viz/`, `out`.
    pub disk: PathBuf,
    /// The ferry servers' configuration file (`--server-ring`), in `shm`.
    pub serve_config: Option<PathBuf>,
}

impl Drop for Workspace {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.shm);
        let _ = std::fs::remove_dir_all(&self.disk);
    }
}

/// `count` files of `size` bytes in `dir` (created).
fn write_files(dir: &Path, count: usize, size: u64, seed: u64) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for i in 0..count {
        write_data(&dir.join(format!("f{i:05}")), size, seed + i as u64)?;
    }
    Ok(())
}

impl Workspace {
    /// Creates the data of the workloads that run (`runs`), and a server configuration
    /// with `server_ring` if given.
    pub fn create(
        plan: &Plan,
        runs: &dyn Fn(&str) -> bool,
        server_ring: Option<usize>,
    ) -> Result<Workspace> {
        let tag = format!("ferry-bench-wan-{}", std::process::id());
        let shm = Path::new("/dev/shm").join(&tag);
        let ws = Workspace {
            serve_config: server_ring.map(|_| shm.join("serve.toml")),
            shm,
            disk: Path::new("/var/tmp").join(&tag),
        };
        for d in [&ws.shm, &ws.disk] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        if let (Some(path), Some(ring)) = (&ws.serve_config, server_ring) {
            std::fs::write(path, format!("ring = {ring}\n"))
                .with_context(|| format!("writing {}", path.display()))?;
        }
        tracing::info!(
            "writing test data under {} and {}",
            ws.shm.display(),
            ws.disk.display()
        );
        write_data(&ws.shm.join("warm"), WARM_BYTES, 3)?;
        if runs("mem") {
            write_data(&ws.shm.join("big"), plan.mem_bytes, 0x9e37_79b9)?;
        }
        if runs("disk") {
            write_data(&ws.disk.join("big"), plan.disk_bytes, 0x7f4a_7c15)?;
        }
        if runs("trace") {
            write_files(&ws.disk.join("ccsm"), plan.ccsm.0, plan.ccsm.1, 100)?;
            write_files(&ws.disk.join("viz"), plan.viz.0, plan.viz.1, 200)?;
        }
        if runs("small") {
            write_files(&ws.shm.join("small"), plan.small.0, plan.small.1, 1)?;
        }
        Ok(ws)
    }

    /// Source and destination of a workload (`mem`: ferry reads no file, the peers read
    /// `big`; both write nowhere).
    pub fn paths(&self, workload: &str) -> (PathBuf, PathBuf) {
        match workload {
            "disk" | "staged" => (self.disk.join("big"), self.disk.join("out")),
            "ccsm" | "viz" => (self.disk.join(workload), self.disk.join("out")),
            "small" => (self.shm.join("small"), self.shm.join("out-small")),
            "warm" => (self.shm.join("warm"), PathBuf::from("/dev/null")),
            _ => (self.shm.join("big"), PathBuf::from("/dev/null")),
        }
    }

    /// Whether a workload reads its source from disk (the page cache is dropped first).
    pub fn reads_disk(&self, workload: &str) -> bool {
        self.paths(workload).0.starts_with(&self.disk)
    }

    /// `path` as ferry's server exports it: `shm/…` or `disk/…`.
    pub fn remote(&self, path: &Path) -> Result<String> {
        for (name, root) in [("shm", &self.shm), ("disk", &self.disk)] {
            if let Ok(rel) = path.strip_prefix(root) {
                return Ok(format!("{name}/{}", rel.display()));
            }
        }
        bail!("{} is outside the exported roots", path.display())
    }

    /// Removes a workload's output (before and after each transfer).
    pub fn clear_output(&self, workload: &str) -> Result<()> {
        let (_, dst) = self.paths(workload);
        if !(dst.starts_with(&self.shm) || dst.starts_with(&self.disk)) {
            return Ok(());
        }
        let r = match dst.is_dir() {
            true => std::fs::remove_dir_all(&dst),
            false => std::fs::remove_file(&dst),
        };
        match r {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("removing {}", dst.display()))
            }
            _ => Ok(()),
        }
    }

    /// Checks the transfer left what it should: the whole file, or every file of a tree
    /// with all its bytes.
    pub fn check_output(&self, row: &WanRow) -> Result<()> {
        let (_, dst) = self.paths(&row.workload);
        if !(dst.starts_with(&self.shm) || dst.starts_with(&self.disk)) {
            return Ok(());
        }
        let (files, bytes) = tally(&dst);
        if (files, bytes) != (row.files, row.bytes) {
            bail!(
                "{}: {files} file(s) of {bytes} bytes arrived, {} of {} expected",
                dst.display(),
                row.files,
                row.bytes
            );
        }
        Ok(())
    }
}

/// Regular files under `path` (itself if a file), at any depth: (count, bytes).
fn tally(path: &Path) -> (u64, u64) {
    let Ok(meta) = std::fs::metadata(path) else {
        return (0, 0);
    };
    if meta.is_file() {
        return (1, meta.len());
    }
    let Ok(rd) = std::fs::read_dir(path) else {
        return (0, 0);
    };
    rd.flatten()
        .map(|e| tally(&e.path()))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

/// Makes a disk workload's output durable inside the timed span, for every tool alike
/// (ferry fsyncs its files, GridFTP does not).
pub fn sync_output(workload: &str) -> Result<()> {
    if matches!(workload, "disk" | "staged" | "ccsm" | "viz") {
        rustix::fs::sync();
    }
    Ok(())
}
