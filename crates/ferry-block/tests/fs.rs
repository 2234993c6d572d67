//! A real file system on an export: `mkfs.ext4` on the export through `nbdfuse` (libnbd's
//! FUSE client: the export as a file), mounted with `fuse2fs`; a tarball of a few thousand
//! files unpacked into it, unmounted, `e2fsck -fn` clean, mounted again read-only and the
//! tree compared with its source byte for byte. Skipped, saying why, where FUSE is not
//! available (no /dev/fuse, or mounting refused as in an unprivileged container).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use ferry_block::config::ExportConfig;

const MIB: u64 = 1 << 20;
/// Files in the tarball: enough directories and files to exercise ext4's allocator and
/// directory blocks, few enough to unpack in seconds through two FUSE layers.
const FILES: usize = 2000;

/// A FUSE mount (and the process serving it, if any), unmounted and reaped on drop.
struct Mount {
    at: PathBuf,
    server: Option<Child>,
}

impl Mount {
    /// Waits until `at` is mounted, or `server` exits.
    fn wait(at: &Path, mut server: Option<Child>) -> Result<Mount, String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !mounted(at) {
            if let Some(Ok(Some(st))) = server.as_mut().map(Child::try_wait) {
                return Err(format!("the FUSE server exited ({st})"));
            }
            if Instant::now() > deadline {
                return Err(format!("{} was not mounted within 20 s", at.display()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Mount {
            at: at.to_path_buf(),
            server,
        })
    }

    fn unmount(&mut self) {
        if mounted(&self.at) {
            unmount(&self.at);
        }
        if let Some(mut c) = self.server.take() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        // A FUSE server killed while its mount was busy leaves a dead mount point
        // ("Transport endpoint is not connected") that breaks every later walk of the
        // scratch directory, cargo's included: detach it.
        if mounted(&self.at) {
            let _ = Command::new("umount").arg("-l").arg(&self.at).status();
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.unmount();
    }
}

/// Whether `at` is a mount point now (/proc/self/mounts).
fn mounted(at: &Path) -> bool {
    let want = at.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mounts").is_ok_and(|m| {
        m.lines()
            .any(|l| l.split(' ').nth(1) == Some(want.as_str()))
    })
}

/// Unmounts a FUSE mount: fusermount3 or fusermount for a user, umount for root.
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

/// Why FUSE cannot be used here, if it cannot.
fn fuse_unavailable() -> Option<String> {
    if !Path::new("/dev/fuse").exists() {
        return Some(
            "no /dev/fuse (load the fuse module, or give the container the device)".into(),
        );
    }
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_err()
    {
        return Some("/dev/fuse cannot be opened by this user".into());
    }
    None
}

/// The source tree: `FILES` files of 0 to 8 KiB in nested directories, contents that
/// differ at every offset.
fn make_tree(root: &Path) {
    for i in 0..FILES {
        let d = root.join(format!("d{:02}/e{}", i % 40, i % 7));
        std::fs::create_dir_all(&d).unwrap();
        let len = (i * 7919) % 8193;
        std::fs::write(d.join(format!("f{i}")), pattern(i as u64 * 8192, len)).unwrap();
    }
}

/// Every file and directory under `root`, relative, with its contents (None: a directory).
fn tree(root: &Path) -> Vec<(PathBuf, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            if rel == Path::new("lost+found") {
                continue;
            }
            if p.is_dir() {
                todo.push(p);
                out.push((rel, None));
            } else {
                out.push((rel, Some(std::fs::read(&p).unwrap())));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn ext4_through_nbdfuse_and_fuse2fs_holds_an_unpacked_tree() {
    if let Some(why) = fuse_unavailable() {
        eprintln!("skipped: FUSE is not available here: {why}");
        return;
    }
    need("nbdfuse", "libnbd-bin");
    need("fuse2fs", "fuse2fs");
    need("mkfs.ext4", "e2fsprogs");
    need("e2fsck", "e2fsprogs");
    let dir = scratch("fs");
    let img = dir.join("disk.img");
    sparse_file(&img, 128 * MIB, &[]);
    let s = start(vec![ExportConfig::file("disk", &img)], &[]);

    let src = dir.join("src");
    make_tree(&src.join("tree"));
    let tgz = dir.join("tree.tgz");
    run(Command::new("tar")
        .arg("czf")
        .arg(&tgz)
        .arg("-C")
        .arg(&src)
        .arg("tree"));

    // The export as a file: <dev>/nbd.
    let dev = dir.join("dev");
    std::fs::create_dir_all(&dev).unwrap();
    let nbdfuse = Command::new("nbdfuse")
        .arg(&dev)
        .arg(s.uri("disk"))
        .stdin(Stdio::null())
        .spawn()
        .expect("nbdfuse starts");
    let disk = match Mount::wait(&dev, Some(nbdfuse)) {
        Ok(m) => m,
        Err(why) => {
            eprintln!("skipped: FUSE is not available here: nbdfuse could not mount: {why}");
            return;
        }
    };
    let file = dev.join("nbd");
    run(Command::new("mkfs.ext4").args(["-F", "-q"]).arg(&file));

    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    // In the foreground, as a child: unmounting returns before a FUSE server has finished
    // writing (fuse2fs writes the superblock and its checksum as it exits), so the check
    // below waits for the process itself, not only for the mount to go.
    let fuse2fs = Command::new("fuse2fs")
        .arg(&file)
        .arg(&mnt)
        .arg("-f")
        .stdin(Stdio::null())
        .spawn()
        .expect("fuse2fs starts");
    let mut fs = Mount::wait(&mnt, Some(fuse2fs)).expect("fuse2fs mounts the file system");
    run(Command::new("tar").arg("xzf").arg(&tgz).arg("-C").arg(&mnt));
    fs.unmount();
    assert!(!mounted(&mnt), "{} still mounted", mnt.display());

    let fsck = run(Command::new("e2fsck").arg("-fn").arg(&file));
    let report = String::from_utf8_lossy(&fsck.stdout);
    assert!(report.contains("Pass 5"), "e2fsck said:\n{report}");

    run(Command::new("fuse2fs")
        .arg(&file)
        .arg(&mnt)
        .args(["-o", "ro"]));
    let ro = Mount::wait(&mnt, None).expect("fuse2fs mounts the file system read-only");
    let (want, got) = (tree(&src), tree(&mnt));
    assert_eq!(
        want.len(),
        got.len(),
        "entries in the source and on the export"
    );
    for (w, g) in want.iter().zip(&got) {
        assert!(w == g, "{} differs on the export", w.0.display());
    }
    drop(ro);
    drop(disk);
}
