//! The server against the real NBD clients users run (Debian packages libnbd-bin,
//! python3-libnbd, qemu-utils, fio): nbdinfo, nbdcopy, qemu-img, nbdsh and fio's nbd
//! engine, each on a real file or memory export served on loopback.

mod common;

use std::process::Command;

use common::*;
use ferry_block::config::ExportConfig;

const MIB: u64 = 1 << 20;

/// `nbdinfo --json`: size, flags and block sizes as advertised.
#[test]
fn nbdinfo_json_reports_size_flags_and_block_size() {
    need("nbdinfo", "libnbd-bin");
    let dir = scratch("info");
    let img = dir.join("disk.img");
    sparse_file(&img, 4 * MIB, &[(MIB, 4096)]);
    let mut e = ExportConfig::file("disk", &img);
    e.description = "scratch disk".into();
    let s = start(vec![e], &[]);
    let out = run(Command::new("nbdinfo").args(["--json", &s.uri("disk")]));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let x = &j["exports"][0];
    let show = || serde_json::to_string_pretty(&j).unwrap();
    assert_eq!(x["export-size"], 4 * MIB, "{}", show());
    assert_eq!(x["description"], "scratch disk", "{}", show());
    for yes in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_fast_zero",
        "can_multi_conn",
        "can_cache",
    ] {
        assert_eq!(x[yes], true, "{yes} in {}", show());
    }
    assert_eq!(x["is_read_only"], false, "{}", show());
    assert_eq!(x["block_size_minimum"], 1, "{}", show());
    assert_eq!(x["block_size_maximum"], 32 * MIB, "{}", show());
    let contexts = x["contexts"].to_string();
    assert!(contexts.contains("base:allocation"), "{}", show());
}

/// `nbdinfo --map` on a sparse file: the holes and the data where they are.
#[test]
fn nbdinfo_map_reports_holes() {
    need("nbdinfo", "libnbd-bin");
    let dir = scratch("map");
    let img = dir.join("sparse.img");
    sparse_file(
        &img,
        8 * MIB,
        &[(2 * MIB, MIB as usize), (7 * MIB, MIB as usize)],
    );
    let s = start(vec![ExportConfig::file("sparse", &img)], &[]);
    let out = run(Command::new("nbdinfo").args(["--map", &s.uri("sparse")]));
    let text = String::from_utf8_lossy(&out.stdout);
    // Lines: OFFSET LENGTH TYPE DESCRIPTION.
    let map: Vec<(u64, u64, u32)> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect();
    let expect = vec![
        (0, 2 * MIB, 3),
        (2 * MIB, MIB, 0),
        (3 * MIB, 4 * MIB, 3),
        (7 * MIB, MIB, 0),
    ];
    assert_eq!(map, expect, "nbdinfo --map said:\n{text}");
}

/// `nbdinfo --list`: every export with its description.
#[test]
fn nbdinfo_list_shows_every_export() {
    need("nbdinfo", "libnbd-bin");
    let dir = scratch("list");
    let img = dir.join("a.img");
    sparse_file(&img, MIB, &[]);
    let mut ram = ExportConfig::memory("ram", 64 * MIB);
    ram.description = "memory".into();
    let s = start(vec![ExportConfig::file("a", &img), ram], &[]);
    let out = run(Command::new("nbdinfo").args(["--list", "--json", &s.base]));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = j["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["export-name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["a", "ram"], "{j}");
    assert_eq!(j["exports"][1]["export-size"], 64 * MIB);
    assert_eq!(j["exports"][1]["description"], "memory");
}

/// `nbdcopy --connections=4` into a memory export and back out, and into a file export:
/// the bytes are the source's.
#[test]
fn nbdcopy_both_ways_with_four_connections() {
    need("nbdcopy", "libnbd-bin");
    let dir = scratch("copy");
    let src = dir.join("src.img");
    sparse_file(
        &src,
        24 * MIB,
        &[(0, 3 << 20), (5 * MIB, 7 << 20), (20 * MIB, 4 << 20)],
    );
    let disk = dir.join("disk.img");
    sparse_file(&disk, 24 * MIB, &[(MIB, 4096)]);
    let s = start(
        vec![
            ExportConfig::memory("ram", 24 * MIB),
            ExportConfig::file("disk", &disk),
        ],
        &[],
    );
    let src_s = src.to_str().unwrap();
    for name in ["ram", "disk"] {
        run(Command::new("nbdcopy").args(["--connections=4", "--flush", src_s, &s.uri(name)]));
        let back = dir.join(format!("back-{name}.img"));
        run(Command::new("nbdcopy").args([
            "--connections=4",
            &s.uri(name),
            back.to_str().unwrap(),
        ]));
        assert!(
            same_bytes(&src, &back),
            "{name}: the copy back differs from the source"
        );
    }
    assert!(
        same_bytes(&src, &disk),
        "the file export does not hold the source's bytes"
    );
}

/// `qemu-img convert` onto an export, `qemu-img compare` with the source, and
/// `qemu-img map` seeing the holes.
#[test]
fn qemu_img_convert_compare_map() {
    need("qemu-img", "qemu-utils");
    let dir = scratch("qemu");
    let src = dir.join("src.img");
    sparse_file(&src, 16 * MIB, &[(MIB, 2 << 20), (9 * MIB, MIB as usize)]);
    let disk = dir.join("disk.img");
    sparse_file(&disk, 16 * MIB, &[(12 * MIB, MIB as usize)]);
    let s = start(vec![ExportConfig::file("disk", &disk)], &[]);
    let uri = s.uri("disk");
    let src_s = src.to_str().unwrap();
    run(Command::new("qemu-img").args(["convert", "-n", "-f", "raw", "-O", "raw", src_s, &uri]));
    run(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw", src_s, &uri]));
    assert!(same_bytes(&src, &disk));
    let out = run(Command::new("qemu-img").args(["map", "--output=json", "-f", "raw", &uri]));
    let map: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let entries = map.as_array().unwrap();
    let is_data = |at: u64| {
        entries.iter().any(|e| {
            let (start, len) = (e["start"].as_u64().unwrap(), e["length"].as_u64().unwrap());
            e["data"] == true && (start..start + len).contains(&at)
        })
    };
    // Data where the source has it; holes where it has none (qemu-img convert writes
    // zeroes there, which a file export punches).
    for at in [MIB + MIB / 2, 2 * MIB + 4096, 9 * MIB + MIB / 2] {
        assert!(is_data(at), "qemu-img map: no data at {at}: {map}");
    }
    for at in [MIB / 2, 5 * MIB] {
        assert!(!is_data(at), "qemu-img map: data at {at}: {map}");
    }
}

/// An nbdsh (python3-libnbd) script: block status of holes, a structured read of a
/// hole, FUA write and flush, trim then zeroes, an option the server does not offer
/// (STARTTLS when TLS is only allowed), a misaligned request and out-of-range requests
/// answered with errors on a connection that stays usable, a read-only export refusing a
/// write.
#[test]
fn nbdsh_script_checks_the_edges() {
    let dir = scratch("nbdsh");
    let img = dir.join("disk.img");
    sparse_file(&img, 4 * MIB, &[(MIB, MIB as usize)]);
    let aligned = dir.join("aligned.img");
    sparse_file(&aligned, 4 * MIB, &[(0, 8192)]);
    let mut direct = ExportConfig::file("aligned", &aligned);
    direct.direct = true;
    let mut ro = ExportConfig::file("ro", &img);
    ro.readonly = true;
    let s = start(vec![ExportConfig::file("disk", &img), direct, ro], &[]);
    let script = format!(
        r#"
import errno
h.set_tls(nbd.TLS_ALLOW)
h.add_meta_context("base:allocation")
h.connect_uri("{disk}")
assert not h.get_tls_negotiated()
assert h.can_meta_context("base:allocation")
size = h.get_size()
assert size == 4 * 1048576

ext = []
def extents(ctx, offset, entries, *rest):
    ext.extend(entries)
    return 0
h.block_status(size, 0, extents)
assert ext[0:4] == [1048576, 3, 1048576, 0], ext

chunks = []
def chunk(subbuf, offset, status, *rest):
    chunks.append((offset, len(subbuf), status))
    return 0
buf = h.pread_structured(65536, 0, chunk)
assert buf == bytearray(65536)
assert chunks == [(0, 65536, nbd.READ_HOLE)], chunks

h.pwrite(b"x" * 4096, 8192, nbd.CMD_FLAG_FUA)
h.flush()
assert h.pread(4096, 8192) == b"x" * 4096

h.trim(1048576, 1048576)
assert h.pread(4096, 1048576) == bytearray(4096)
h.zero(65536, 2 * 1048576, nbd.CMD_FLAG_FAST_ZERO)
assert h.pread(4096, 2 * 1048576) == bytearray(4096)

h.set_strict_mode(0)
def refused(f, code):
    try:
        f()
    except nbd.Error as e:
        assert e.errnum == code, (e.string, e.errnum, code)
        return
    raise AssertionError("not refused")
refused(lambda: h.pread(4096, size), errno.EINVAL)
refused(lambda: h.pread(4096, size - 512), errno.EINVAL)
refused(lambda: h.pwrite(b"a" * 512, size), errno.ENOSPC)
assert h.pread(4, 8192) == b"xxxx"
h.shutdown()

a = nbd.NBD()
a.connect_uri("{aligned}")
assert a.get_block_size(nbd.SIZE_MINIMUM) == 4096
a.set_strict_mode(0)
refused(lambda: a.pread(512, 512), errno.EINVAL)
refused(lambda: a.pwrite(b"b" * 4096, 100), errno.EINVAL)
assert len(a.pread(4096, 4096)) == 4096
a.shutdown()

r = nbd.NBD()
r.connect_uri("{ro}")
assert r.is_read_only()
r.set_strict_mode(0)
refused(lambda: r.pwrite(b"c" * 512, 0), errno.EPERM)
refused(lambda: r.trim(512, 0), errno.EPERM)
assert len(r.pread(512, 0)) == 512
r.shutdown()
print("ok")
"#,
        disk = s.uri("disk"),
        aligned = s.uri("aligned"),
        ro = s.uri("ro"),
    );
    let out = run(nbdsh().args(["-c", &script]));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
}

/// fio's nbd engine: a short random write/read/trim run verified with crc32c.
#[test]
fn fio_nbd_engine_verifies() {
    need("fio", "fio");
    let engines = run(Command::new("fio").arg("--enghelp"));
    assert!(
        String::from_utf8_lossy(&engines.stdout).contains("nbd"),
        "this fio has no nbd engine (Debian's fio is built with it; install fio from Debian)"
    );
    let s = start(vec![ExportConfig::memory("ram", 64 * MIB)], &[]);
    // fio leaves verify state files in its working directory.
    let dir = scratch("fio");
    run(Command::new("fio").current_dir(&*dir).args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={}", s.uri("ram")),
        "--rw=randwrite",
        "--bs=4k",
        "--size=16m",
        "--iodepth=8",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
    ]));
    run(Command::new("fio").current_dir(&*dir).args([
        "--name=trim",
        "--ioengine=nbd",
        &format!("--uri={}", s.uri("ram")),
        "--rw=randtrim",
        "--bs=64k",
        "--size=16m",
        "--iodepth=4",
    ]));
}

/// `qemu-nbd --list` on the Unix-socket listener: the exports, the flags advertised and
/// the metadata context.
#[test]
fn qemu_nbd_list_shows_flags_on_the_unix_socket() {
    need("qemu-nbd", "qemu-utils");
    let dir = scratch("qemu-nbd");
    let img = dir.join("disk.img");
    sparse_file(&img, 4 * MIB, &[]);
    let sock = dir.join("nbd.sock");
    let mut e = ExportConfig::file("disk", &img);
    e.description = "listed".into();
    let _s = start(vec![e], &[format!("unix:{}", sock.display())]);
    let out = run(Command::new("qemu-nbd").args(["--list", "-k", sock.to_str().unwrap()]));
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "export: 'disk'",
        "description: listed",
        "size:  4194304",
        "flush",
        "fua",
        "trim",
        "zeroes",
        "multi",
        "cache",
        "fast-zero",
        "base:allocation",
    ] {
        assert!(
            text.contains(want),
            "qemu-nbd --list lacks {want:?}:\n{text}"
        );
    }
}
