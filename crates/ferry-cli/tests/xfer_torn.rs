//! A source file overwritten in the middle while `ferry cp` reads it: single-stream and
//! `-p 4`, download and upload, and server to server. The sender pauses after the first block it reads (the test
//! hook `FERRY_TEST_PAUSE_READ`), the test overwrites 1 MiB in the middle of the source and
//! puts its mtime back (so only ctime tells), then lets it go on. Every copy must fail with
//! exit 4, name the file, and leave nothing under the final name (and no part file).
//! Downloads of a source truncated or extended at that point fail alike, and the server
//! goes on serving.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;

use common::*;

const SIZE: usize = 24 << 20;

/// How the test changes the source while the sender is paused.
#[derive(Clone, Copy)]
enum Change {
    /// 1 MiB at 12 MiB overwritten, the mtime put back.
    Overwrite,
    /// Cut to 8 MiB (the rest of the read finds no bytes).
    Truncate,
    /// 1 MiB appended.
    Extend,
}

/// Waits for the sender to pause (the marker appears), overwrites 1 MiB of `src` at 12 MiB
/// with its mtime restored, and releases the sender (removes the marker).
fn overwrite_when_paused(marker: PathBuf, src: PathBuf) -> std::thread::JoinHandle<()> {
    change_when_paused(marker, src, Change::Overwrite)
}

/// Waits for the sender to pause, makes `change` to `src` and releases the sender.
fn change_when_paused(
    marker: PathBuf,
    src: PathBuf,
    change: Change,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let end = Instant::now() + Duration::from_secs(60);
        while !marker.exists() {
            assert!(Instant::now() < end, "the sender never paused");
            std::thread::sleep(Duration::from_millis(5));
        }
        let f = std::fs::OpenOptions::new().write(true).open(&src).unwrap();
        let mtime = f.metadata().unwrap().modified().unwrap();
        match change {
            Change::Overwrite => {
                f.write_all_at(&vec![0xA5; 1 << 20], 12 << 20).unwrap();
                f.set_modified(mtime).unwrap();
            }
            Change::Truncate => f.set_len(8 << 20).unwrap(),
            Change::Extend => f.write_all_at(&vec![0x5A; 1 << 20], SIZE as u64).unwrap(),
        }
        drop(f);
        std::fs::remove_file(&marker).unwrap();
    })
}

/// Asserts the copy failed as a changed source, and `dest` (a final name) never appeared
/// and no part file is left in its directory (the server removes an upload's part as it
/// takes the client's refusal: allowed a moment).
fn torn(o: &std::process::Output, dest: &Path) {
    // "changed while it was being copied" (the sender's check), or, for a parallel
    // download that meets the new size in a later READY, "changed on the server".
    fails(o, 4, "changed");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("big"), "the file is not named: {err}");
    assert!(!dest.exists(), "{} was committed", dest.display());
    let dir = dest.parent().unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".ferry-part"))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < end, "left behind: {left:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn download(streams: &str) {
    download_changed(streams, Change::Overwrite);
}

/// A download whose source undergoes `change` after the server read its first block: it
/// fails as torn, and the server still serves the (now quiet) file afterwards.
fn download_changed(streams: &str, change: Change) {
    let marker = scratch("marker").join("paused");
    let hook = marker.display().to_string();
    let s = serve("tcp", &[("FERRY_TEST_PAUSE_READ", &hook)]);
    let src = s.root.join("big");
    std::fs::write(&src, pattern(SIZE, 1)).unwrap();
    let local = scratch("local");
    let writer = change_when_paused(marker, src.clone(), change);
    let o = cp(
        &[
            "-p",
            streams,
            "--chunk-size",
            "4194304",
            &s.url("big"),
            local.to_str().unwrap(),
        ],
        &[],
    );
    writer.join().unwrap();
    torn(&o, &local.join("big"));
    // The server is alive and sends the file as it is now.
    let o = cp(
        &["-p", streams, &s.url("big"), local.to_str().unwrap()],
        &[],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    same_file(&src, &local.join("big"));
    std::fs::remove_dir_all(&local).unwrap();
}

fn upload(streams: &str) {
    let marker = scratch("marker").join("paused");
    let hook = marker.display().to_string();
    let s = serve("tcp", &[]);
    let local = scratch("local");
    let src = local.join("big");
    std::fs::write(&src, pattern(SIZE, 2)).unwrap();
    let writer = overwrite_when_paused(marker, src.clone());
    let o = cp(
        &[
            "-p",
            streams,
            "--chunk-size",
            "4194304",
            src.to_str().unwrap(),
            &s.url("big"),
        ],
        &[("FERRY_TEST_PAUSE_READ", &hook)],
    );
    writer.join().unwrap();
    torn(&o, &s.root.join("big"));
    std::fs::remove_dir_all(&local).unwrap();
}

/// A server-to-server copy of a `size`-byte file: the source server is the sender (it runs
/// the upload; with several streams, a file over one chunk, 64 MiB, goes in ranges).
fn third_party(streams: &str, size: usize) {
    let marker = scratch("marker").join("paused");
    let hook = marker.display().to_string();
    let b = serve("tcp", &[]);
    let a = serve_as(
        ferry(),
        "tcp",
        &[("FERRY_TEST_PAUSE_READ", &hook)],
        &["--allow-third-party", &b.addr],
    );
    let src = a.root.join("big");
    std::fs::write(&src, pattern(size, 3)).unwrap();
    let writer = overwrite_when_paused(marker, src);
    let o = cp(&["-p", streams, &a.url("big"), &b.url("big")], &[]);
    writer.join().unwrap();
    torn(&o, &b.root.join("big"));
}

fn serve(driver: &str, env: &[(&str, &str)]) -> Server {
    serve_as(ferry(), driver, env, &[])
}

#[test]
fn download_one_stream() {
    download("1");
}

#[test]
fn download_four_streams() {
    download("4");
}

#[test]
fn download_truncated_one_stream() {
    download_changed("1", Change::Truncate);
}

#[test]
fn download_truncated_four_streams() {
    download_changed("4", Change::Truncate);
}

#[test]
fn download_extended_one_stream() {
    download_changed("1", Change::Extend);
}

#[test]
fn download_extended_four_streams() {
    download_changed("4", Change::Extend);
}

#[test]
fn upload_one_stream() {
    upload("1");
}

#[test]
fn upload_four_streams() {
    upload("4");
}

#[test]
fn third_party_one_stream() {
    third_party("1", SIZE);
}

#[test]
fn third_party_four_streams() {
    third_party("4", (64 << 20) + (4 << 20));
}
