//! The test data of `bench cp`: a large file and a tree of small files in /dev/shm, a large
//! file on the real disk (under /var/tmp), and where each workload's output goes. Removed
//! when the run ends.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::{CpRow, Plan};

/// The run's directories; both are removed on drop.
pub struct Workspace {
    /// In /dev/shm: `big`, `small/` (the tree), outputs.
    pub shm: PathBuf,
    /// On disk (/var/tmp): `big`, `out/`.
    pub disk: PathBuf,
    small_files: usize,
}

impl Drop for Workspace {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.shm);
        let _ = std::fs::remove_dir_all(&self.disk);
    }
}

/// Writes `len` bytes of a cheap pseudo-random stream (not compressible, not all zeros).
pub(crate) fn write_data(path: &Path, len: u64, seed: u64) -> Result<()> {
    let mut f =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut x = seed | 1;
    let mut block = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for w in block.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])
            .with_context(|| format!("writing {}", path.display()))?;
        left -= n as u64;
    }
    f.sync_all()
        .with_context(|| format!("syncing {}", path.display()))
}

/// The `start` workload's one-byte file, in the shm directory.
pub const TINY: &str = "tiny";

impl Workspace {
    /// Creates the data of `plan` (a few seconds for the full run's 2 × 4 GiB).
    pub fn create(plan: &Plan) -> Result<Workspace> {
        let tag = format!("ferry-bench-cp-{}", std::process::id());
        let ws = Workspace {
            shm: Path::new("/dev/shm").join(&tag),
            disk: Path::new("/var/tmp").join(&tag),
            small_files: plan.small_files,
        };
        for d in [&ws.shm, &ws.disk, &ws.shm.join("small")] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        tracing::info!(
            "writing test data under {} and {}",
            ws.shm.display(),
            ws.disk.display()
        );
        write_data(&ws.shm.join("big"), plan.mem_bytes, 0x9e37_79b9)?;
        write_data(&ws.shm.join(TINY), 1, 0x2545_f491)?;
        write_data(&ws.disk.join("big"), plan.disk_bytes, 0x7f4a_7c15)?;
        for i in 0..plan.small_files {
            let p = ws.shm.join("small").join(format!("f{i:05}"));
            write_data(&p, plan.small_bytes as u64, i as u64 + 1)?;
        }
        Ok(ws)
    }

    /// The xrootd configuration file's path.
    pub fn xrootd_cfg(&self) -> PathBuf {
        self.shm.join("xrootd.cfg")
    }

    /// Source and destination of a workload (`mem` reads no file: its source is unused).
    pub fn paths(&self, workload: &str) -> (PathBuf, PathBuf) {
        match workload {
            "disk" => (self.disk.join("big"), self.disk.join("out-big")),
            "small" => (self.shm.join("small"), self.shm.join("out-small")),
            "start" => (self.shm.join(TINY), PathBuf::from("/dev/null")),
            _ => (self.shm.join("big"), PathBuf::from("/dev/null")),
        }
    }

    /// Removes a workload's output (before and after each transfer).
    pub fn clear_output(&self, workload: &str) -> Result<()> {
        let (_, dst) = self.paths(workload);
        if dst.starts_with(&self.shm) || dst.starts_with(&self.disk) {
            let r = match dst.is_dir() {
                true => std::fs::remove_dir_all(&dst),
                false => std::fs::remove_file(&dst),
            };
            if let Err(e) = r {
                if e.kind() != std::io::ErrorKind::NotFound {
                    return Err(e).with_context(|| format!("removing {}", dst.display()));
                }
            }
        }
        Ok(())
    }

    /// Checks the transfer left what it should: the whole file, or every small file.
    pub fn check_output(&self, row: &CpRow) -> Result<()> {
        let (_, dst) = self.paths(&row.workload);
        match row.workload.as_str() {
            "disk" => {
                let len = std::fs::metadata(&dst)
                    .with_context(|| format!("{}: no output", dst.display()))?
                    .len();
                if len != row.bytes {
                    bail!(
                        "{}: {len} bytes written, {} expected",
                        dst.display(),
                        row.bytes
                    );
                }
            }
            "small" => {
                let n = count_files(&dst);
                if n != self.small_files {
                    bail!(
                        "{}: {n} files arrived, {} expected",
                        dst.display(),
                        self.small_files
                    );
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Regular files under `dir`, at any depth.
fn count_files(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => count_files(&e.path()),
            Ok(t) if t.is_file() => 1,
            _ => 0,
        })
        .sum()
}

/// Makes a disk workload's output durable (inside the timed span, for every tool alike:
/// ferry fsyncs its files, the peers do not).
pub fn sync_output(workload: &str, dst: &Path) -> Result<()> {
    if workload == "disk" {
        std::fs::File::open(dst)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("syncing {}", dst.display()))?;
    }
    Ok(())
}

/// `sync; echo 3 > /proc/sys/vm/drop_caches`; false if the cache could not be dropped.
pub fn drop_caches() -> bool {
    rustix::fs::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}
