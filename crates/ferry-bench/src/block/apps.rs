//! The application rows of `bench block`: a file system on the export and three runs on
//! it, the seed's applications. The export becomes a file through `nbdfuse` (libnbd's
//! FUSE client; the machine needs no NBD kernel device), `mkfs.ext4` makes a file system
//! in it, and `fuse2fs` mounts that; then, each on a fresh mount and timed to the end of
//! its unmount (when every block is on the export):
//!
//! - `untar`: unpacking a gzip tarball made by the bench (about 50 MB, 4000 files in 200
//!   directories, the same bytes in every run);
//! - `postmark`: a postmark-like run: a pool of small files created, transactions (read or
//!   append, then create or delete) on files picked at random, the pool deleted;
//! - `fileop`: a fileop-like metadata run: directories of files made, written, stat-ed,
//!   chmod-ed, listed, linked and unlinked, deleted, the directories removed.
//!
//! Each row's rate is operations per second (files unpacked, postmark operations,
//! metadata calls), and the untar row's GB/s is the tarball's bytes unpacked per second.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::servers::need;

/// The runs, in the order they are made.
pub const APPS: [&str; 3] = ["untar", "postmark", "fileop"];

/// How big the runs are.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Files in the tarball.
    tar_files: usize,
    /// Files in postmark's pool, and its transactions.
    pool: usize,
    transactions: usize,
    /// fileop's fan-out: `n` directories of `n` directories of `n` files.
    fan: usize,
}

impl Sizes {
    /// About 50 MB of tarball, 1000 files and 4000 transactions, 12^3 files; a tenth of
    /// that with `quick`.
    pub fn new(quick: bool) -> Sizes {
        match quick {
            false => Sizes {
                tar_files: 4000,
                pool: 1000,
                transactions: 4000,
                fan: 12,
            },
            true => Sizes {
                tar_files: 400,
                pool: 200,
                transactions: 400,
                fan: 6,
            },
        }
    }
}

/// One run's result: seconds, operations, bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ran {
    /// Wall seconds from the start of the run to the end of the unmount.
    pub secs: f64,
    /// Operations made (files unpacked, postmark operations, metadata calls).
    pub ops: u64,
    /// Bytes written to the file system (untar: the tarball's contents).
    pub bytes: u64,
    /// CPU seconds the server used meanwhile.
    pub server_cpu_s: f64,
}

/// Why the application rows cannot run here, if they cannot.
pub fn unavailable() -> Option<String> {
    for (tool, _) in [
        ("nbdfuse", "libnbd-bin"),
        ("fuse2fs", "fuse2fs"),
        ("mkfs.ext4", "e2fsprogs"),
        ("tar", "tar"),
    ] {
        if let Err(e) = need(tool) {
            return Some(format!("{e:#}"));
        }
    }
    let fuse = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse");
    fuse.err()
        .map(|e| format!("FUSE is not available here (/dev/fuse: {e})"))
}

/// A deterministic generator (splitmix64): the tarball and the runs are the same bytes
/// and the same choices every time.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `[lo, hi)`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo) as u64) as usize
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let x = self.next().to_le_bytes();
            c.copy_from_slice(&x[..c.len()]);
        }
    }
}

/// The tarball the untar run unpacks.
#[derive(Debug, Clone)]
pub struct Tarball {
    path: PathBuf,
    files: usize,
    bytes: u64,
}

impl Tarball {
    /// Makes `dir/tree.tgz`: files of 4 to 36 KiB, three fifths random bytes and the rest
    /// text (so gzip finds something to do), in 200 directories.
    pub fn make(dir: &Path, sizes: &Sizes) -> Result<Tarball> {
        let src = dir.join("tree-src");
        let top = src.join("tree");
        let mut rng = Rng(18);
        let mut bytes = 0u64;
        let text = b"ferry bench block: a line of text in a source file, compressible. \n";
        for i in 0..sizes.tar_files {
            let d = top.join(format!("d{:02}/e{}", i % 40, i % 5));
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
            let len = rng.range(4 << 10, 36 << 10);
            let mut data = vec![0u8; len];
            let random = len * 3 / 5;
            rng.fill(&mut data[..random]);
            for (j, b) in data[random..].iter_mut().enumerate() {
                *b = text[j % text.len()];
            }
            std::fs::write(d.join(format!("f{i}.dat")), &data)?;
            bytes += len as u64;
        }
        let path = dir.join("tree.tgz");
        run_tool(
            Command::new("tar")
                .arg("czf")
                .arg(&path)
                .arg("-C")
                .arg(&src)
                .arg("tree"),
        )?;
        std::fs::remove_dir_all(&src).ok();
        Ok(Tarball {
            path,
            files: sizes.tar_files,
            bytes,
        })
    }

    /// Its size, bytes.
    pub fn len(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }
}

/// A FUSE mount and the process serving it (in the foreground), unmounted and reaped on
/// drop.
struct Mount {
    at: PathBuf,
    server: Option<Child>,
}

impl Mount {
    /// Starts `cmd` (a FUSE server in the foreground) and waits until `at` is mounted.
    fn start(mut cmd: Command, at: &Path) -> Result<Mount> {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {cmd:?}"))?;
        let mut m = Mount {
            at: at.to_path_buf(),
            server: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !mounted(at) {
            if let Some(Ok(Some(st))) = m.server.as_mut().map(Child::try_wait) {
                bail!("{cmd:?} exited ({st}) before mounting");
            }
            if Instant::now() > deadline {
                bail!("{} was not mounted within 20 s", at.display());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(m)
    }

    /// Unmounts and waits for the server to exit (it has then written everything).
    fn finish(&mut self) -> Result<()> {
        if mounted(&self.at) {
            unmount(&self.at);
        }
        let Some(mut c) = self.server.take() else {
            return Ok(());
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if c.try_wait()?.is_some() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                bail!("the FUSE server of {} did not exit", self.at.display());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if mounted(&self.at) {
            unmount(&self.at);
        }
        if let Some(mut c) = self.server.take() {
            std::thread::sleep(Duration::from_millis(100));
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Whether `at` is a mount point now.
fn mounted(at: &Path) -> bool {
    let want = at.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mounts")
        .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(1) == Some(&want)))
}

/// Unmounts: fusermount3 or fusermount for a user, umount for root.
fn unmount(at: &Path) {
    for (prog, args) in [
        ("fusermount3", &["-u"][..]),
        ("fusermount", &["-u"][..]),
        ("umount", &[][..]),
    ] {
        let ok = Command::new(prog)
            .args(args)
            .arg(at)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok || !mounted(at) {
            return;
        }
    }
}

fn run_tool(cmd: &mut Command) -> Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!("{cmd:?} failed ({}): {}", out.status, err.trim());
    }
    Ok(())
}

/// Makes a file system on the export at `uri` and times each of [`APPS`] on it, in
/// order, each on a fresh mount; `work` is a scratch directory of this run, `cpu` the
/// server's CPU seconds so far.
pub fn run(
    uri: &str,
    work: &Path,
    tar: &Tarball,
    sizes: &Sizes,
    cpu: &dyn Fn() -> Option<f64>,
) -> Result<Vec<Ran>> {
    let dev = work.join("dev");
    let mnt = work.join("mnt");
    std::fs::create_dir_all(&dev)?;
    std::fs::create_dir_all(&mnt)?;
    let mut nbdfuse = Command::new("nbdfuse");
    nbdfuse.arg(&dev).arg(uri);
    let mut disk = Mount::start(nbdfuse, &dev)?;
    let file = dev.join("nbd");
    run_tool(Command::new("mkfs.ext4").args(["-F", "-q"]).arg(&file))?;
    let mut out = Vec::new();
    for app in APPS {
        let mut fuse2fs = Command::new("fuse2fs");
        fuse2fs.arg(&file).arg(&mnt).arg("-f");
        let mut fs = Mount::start(fuse2fs, &mnt)?;
        let (t0, c0) = (Instant::now(), cpu());
        let (ops, bytes) = match app {
            "untar" => untar(tar, &mnt)?,
            "postmark" => postmark(&mnt, sizes)?,
            _ => fileop(&mnt, sizes)?,
        };
        fs.finish()?;
        let secs = t0.elapsed().as_secs_f64();
        let server_cpu_s = match (c0, cpu()) {
            (Some(a), Some(b)) => (b - a).max(0.0),
            _ => 0.0,
        };
        out.push(Ran {
            secs,
            ops,
            bytes,
            server_cpu_s,
        });
    }
    disk.finish()?;
    Ok(out)
}

fn untar(tar: &Tarball, mnt: &Path) -> Result<(u64, u64)> {
    run_tool(
        Command::new("tar")
            .arg("xzf")
            .arg(&tar.path)
            .arg("-C")
            .arg(mnt),
    )?;
    Ok((tar.files as u64, tar.bytes))
}

/// The postmark-like run: a pool of 512 B to 16 KiB files, transactions of (read a whole
/// file, or append to it) then (create a file, or delete one), the pool deleted; the
/// operations made.
fn postmark(mnt: &Path, sizes: &Sizes) -> Result<(u64, u64)> {
    let dir = mnt.join("postmark");
    std::fs::create_dir_all(&dir)?;
    let mut rng = Rng(7);
    let mut data = vec![0u8; 16 << 10];
    rng.fill(&mut data);
    let (mut live, mut next, mut ops, mut bytes) = (Vec::new(), 0usize, 0u64, 0u64);
    let mut create = |live: &mut Vec<usize>, rng: &mut Rng| -> Result<u64> {
        let len = rng.range(512, 16 << 10);
        std::fs::write(dir.join(format!("p{next}")), &data[..len])?;
        live.push(next);
        next += 1;
        Ok(len as u64)
    };
    for _ in 0..sizes.pool {
        bytes += create(&mut live, &mut rng)?;
        ops += 1;
    }
    let mut buf = Vec::new();
    for _ in 0..sizes.transactions {
        if live.is_empty() {
            bytes += create(&mut live, &mut rng)?;
        }
        let f = dir.join(format!("p{}", live[rng.range(0, live.len())]));
        if rng.next().is_multiple_of(2) {
            buf.clear();
            std::fs::File::open(&f)?.read_to_end(&mut buf)?;
        } else {
            let len = rng.range(512, 16 << 10);
            let mut w = std::fs::OpenOptions::new().append(true).open(&f)?;
            w.write_all(&data[..len])?;
            bytes += len as u64;
        }
        if rng.next().is_multiple_of(2) {
            bytes += create(&mut live, &mut rng)?;
        } else {
            let i = rng.range(0, live.len());
            std::fs::remove_file(dir.join(format!("p{}", live.swap_remove(i))))?;
        }
        ops += 2;
    }
    for f in live.drain(..) {
        std::fs::remove_file(dir.join(format!("p{f}")))?;
        ops += 1;
    }
    Ok((ops, bytes))
}

/// The fileop-like run over `fan`^3 files: mkdir, create and write 4 KiB, stat, chmod,
/// readdir, link and unlink, delete, rmdir; the calls made.
fn fileop(mnt: &Path, sizes: &Sizes) -> Result<(u64, u64)> {
    use std::os::unix::fs::PermissionsExt;
    let n = sizes.fan;
    let top = mnt.join("fileop");
    let block = vec![0x5au8; 4096];
    let dirs: Vec<PathBuf> = (0..n * n)
        .map(|i| top.join(format!("a{}", i / n)).join(format!("b{}", i % n)))
        .collect();
    let files = |d: &Path| (0..n).map(|k| d.join(format!("f{k}"))).collect::<Vec<_>>();
    let mut ops = 0u64;
    for d in &dirs {
        std::fs::create_dir_all(d)?;
        ops += 1;
    }
    for d in &dirs {
        for f in files(d) {
            std::fs::write(&f, &block)?;
            std::fs::metadata(&f)?;
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640))?;
            ops += 3;
        }
        std::fs::read_dir(d)?.try_for_each(|e| e.map(drop))?;
        ops += 1;
    }
    for d in &dirs {
        for f in files(d) {
            let l = f.with_extension("link");
            std::fs::hard_link(&f, &l)?;
            std::fs::remove_file(&l)?;
            std::fs::remove_file(&f)?;
            ops += 3;
        }
        std::fs::remove_dir(d)?;
        ops += 1;
    }
    std::fs::remove_dir_all(&top)?;
    Ok((ops, n.pow(3) as u64 * 4096))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_is_deterministic_and_in_range() {
        let (mut a, mut b) = (Rng(5), Rng(5));
        for _ in 0..1000 {
            let x = a.range(512, 16 << 10);
            assert_eq!(x, b.range(512, 16 << 10));
            assert!((512..16 << 10).contains(&x));
        }
        let (mut x, mut y) = ([0u8; 13], [0u8; 13]);
        Rng(1).fill(&mut x);
        Rng(1).fill(&mut y);
        assert_eq!(x, y);
        assert_ne!(x, [0u8; 13]);
    }

    /// The runs on a plain directory (no FUSE): they make and remove what they say.
    #[test]
    fn postmark_and_fileop_leave_nothing_behind() {
        let dir = std::env::temp_dir().join(format!("ferry-apps-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sizes = Sizes {
            tar_files: 10,
            pool: 20,
            transactions: 50,
            fan: 3,
        };
        let (ops, _) = postmark(&dir, &sizes).unwrap();
        assert!(ops >= 20 + 100, "{ops}");
        assert_eq!(std::fs::read_dir(dir.join("postmark")).unwrap().count(), 0);
        let (ops, bytes) = fileop(&dir, &sizes).unwrap();
        assert!(ops > 27 * 6, "{ops}");
        assert_eq!(bytes, 27 * 4096);
        assert!(!dir.join("fileop").exists());
        let t = Tarball::make(&dir, &sizes).unwrap();
        assert!(t.len() > 10 * 1024 && t.bytes >= 10 * 4096);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
