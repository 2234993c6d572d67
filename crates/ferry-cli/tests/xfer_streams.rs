//! Parallel streams (`ferry cp -p 4`) as real processes over loopback, on every driver:
//! files of 0 B, 1 B, a block ±1 and sizes that are not a multiple of the chunk, down and
//! up, byte-identical; a tree with small and chunked files; memory mode both ways; blocks
//! damaged on the way caught and sent again; a few-hundred-MiB file.

use std::path::Path;

mod common;

use common::*;

const BLOCK: usize = 1 << 20;
/// Small chunks (4 blocks), so modest files are split over the streams.
const CHUNK: usize = 4 * BLOCK;

/// `ferry cp -p 4` with 1 MiB blocks and 4 MiB chunks.
fn cp4(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut all = vec![
        "-p",
        "4",
        "--block-size",
        "1048576",
        "--chunk-size",
        "4194304",
    ];
    all.extend_from_slice(args);
    cp(&all, env)
}

fn no_part_files(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let n = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!n.contains(".ferry-part"), "left behind: {n}");
    }
}

fn sizes(driver: &str) {
    let s = serve_as(ferry(), driver, &[], &[]);
    let local = scratch("local");
    let lens = [
        0,
        1,
        BLOCK - 1,
        BLOCK + 1,
        CHUNK,
        3 * CHUNK + 12345,
        5 * CHUNK - 1,
    ];
    for (i, len) in lens.into_iter().enumerate() {
        let name = format!("f{len}");
        std::fs::write(s.root.join(&name), pattern(len, i as u8 + 1)).unwrap();
        let v = ok(&cp4(&[&s.url(&name), local.to_str().unwrap()], &[]));
        assert_eq!(
            (
                v["files"].as_u64(),
                v["bytes"].as_u64(),
                v["wire_bytes"].as_u64()
            ),
            (Some(1), Some(len as u64), Some(len as u64)),
            "{v}"
        );
        same_file(&s.root.join(&name), &local.join(&name));
        let up = format!("up{len}");
        let v = ok(&cp4(
            &[local.join(&name).to_str().unwrap(), &s.url(&up)],
            &[],
        ));
        assert_eq!(
            (v["files"].as_u64(), v["bytes"].as_u64()),
            (Some(1), Some(len as u64)),
            "{v}"
        );
        same_file(&local.join(&name), &s.root.join(&up));
    }
    // Uploads keep the source's mtime, as with one stream.
    let (a, b) = (
        std::fs::metadata(local.join(format!("f{}", 3 * CHUNK + 12345))).unwrap(),
        std::fs::metadata(s.root.join(format!("up{}", 3 * CHUNK + 12345))).unwrap(),
    );
    assert_eq!(a.modified().unwrap(), b.modified().unwrap());
    no_part_files(&s.root);
    no_part_files(&local);
    std::fs::remove_dir_all(&local).unwrap();
}

/// Blocks damaged by the sender are caught by their CRC and sent again, on every stream.
fn corruption(driver: &str) {
    let s = serve_as(ferry(), driver, &[("FERRY_TEST_CORRUPT_BLOCKS", "3")], &[]);
    let local = scratch("local");
    let len = 3 * CHUNK + 777;
    std::fs::write(s.root.join("f"), pattern(len, 9)).unwrap();
    let v = ok(&cp4(&[&s.url("f"), local.to_str().unwrap()], &[]));
    assert_eq!(v["blocks_resent"].as_u64(), Some(3), "{v}");
    same_file(&s.root.join("f"), &local.join("f"));
    let v = ok(&cp4(
        &[local.join("f").to_str().unwrap(), &s.url("g")],
        &[("FERRY_TEST_CORRUPT_BLOCKS", "3")],
    ));
    assert_eq!(v["blocks_resent"].as_u64(), Some(3), "{v}");
    same_file(&local.join("f"), &s.root.join("g"));
    std::fs::remove_dir_all(&local).unwrap();
}

/// A tree of small files and a few chunked ones, down and up.
fn tree(driver: &str) {
    let s = serve_as(ferry(), driver, &[], &[]);
    let src = s.root.join("tree");
    let mut n = 0;
    for d in 0..5 {
        let dir = src.join(format!("d{d}")).join("e");
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..12 {
            std::fs::write(dir.join(format!("s{f}")), pattern(f * 331 % 3000, f as u8)).unwrap();
            n += 1;
        }
        std::fs::write(
            src.join(format!("d{d}/big")),
            pattern(2 * CHUNK + d * 999, d as u8),
        )
        .unwrap();
        n += 1;
    }
    std::fs::create_dir_all(src.join("empty")).unwrap();
    let local = scratch("local");
    let v = ok(&cp4(&["-r", &s.url("tree"), local.to_str().unwrap()], &[]));
    assert_eq!(v["files"].as_u64(), Some(n), "{v}");
    same_tree(&src, &local.join("tree"));
    let v = ok(&cp4(
        // A source ending in / lands its contents (into back, created).
        &[
            "-r",
            &format!("{}/", local.join("tree").display()),
            &s.url("back"),
        ],
        &[],
    ));
    assert_eq!(v["files"].as_u64(), Some(n), "{v}");
    same_tree(&src, &s.root.join("back"));
    std::fs::remove_dir_all(&local).unwrap();
}

/// Memory mode: zeros to the null sinks both ways, and zeros into real files.
fn memory(driver: &str) {
    let s = serve_as(ferry(), driver, &[], &["--mem"]);
    let size = (3 * CHUNK + 4321) as u64;
    let v = ok(&cp4(&[&s.at(&format!("mem/zero/{size}")), "null:"], &[]));
    assert_eq!(
        (v["files"].as_u64(), v["bytes"].as_u64()),
        (Some(1), Some(size)),
        "{v}"
    );
    let v = ok(&cp4(&[&format!("zero:{size}"), &s.at("mem/null")], &[]));
    assert_eq!(
        (v["files"].as_u64(), v["wire_bytes"].as_u64()),
        (Some(1), Some(size)),
        "{v}"
    );
    let local = scratch("local");
    ok(&cp4(
        &[
            &s.at(&format!("mem/zero/{size}")),
            local.join("z").to_str().unwrap(),
        ],
        &[],
    ));
    assert_eq!(
        std::fs::read(local.join("z")).unwrap(),
        vec![0u8; size as usize]
    );
    ok(&cp4(&[&format!("zero:{size}"), &s.url("z")], &[]));
    assert_eq!(
        std::fs::read(s.root.join("z")).unwrap(),
        vec![0u8; size as usize]
    );
    std::fs::remove_dir_all(&local).unwrap();
}

macro_rules! per_driver {
    ($($name:ident),*) => {
        mod tcp { $( #[test] fn $name() { super::$name("tcp") } )* }
        mod ofi_tcp { $( #[test] fn $name() { super::$name("ofi+tcp") } )* }
        mod ofi_shm { $( #[test] fn $name() { super::$name("ofi+shm") } )* }
    };
}

per_driver!(sizes, corruption, tree, memory);

/// A few hundred MiB with the default chunk, down and up over four streams (tcp).
#[test]
fn three_hundred_mib() {
    let s = serve_as(ferry(), "tcp", &[], &[]);
    let len = (300 << 20) + 4097;
    std::fs::write(s.root.join("big"), pattern(len, 42)).unwrap();
    let local = scratch("local");
    let v = ok(&cp(
        &["-p", "4", &s.url("big"), local.to_str().unwrap()],
        &[],
    ));
    assert_eq!(v["bytes"].as_u64(), Some(len as u64), "{v}");
    same_file(&s.root.join("big"), &local.join("big"));
    let v = ok(&cp(
        &["-p", "4", local.join("big").to_str().unwrap(), &s.url("up")],
        &[],
    ));
    assert_eq!(v["bytes"].as_u64(), Some(len as u64), "{v}");
    same_file(&local.join("big"), &s.root.join("up"));
    std::fs::remove_dir_all(&local).unwrap();
}
