//! Collective I/O through the `ferry` binary: one `ferry serve` hosts file transfer and
//! `cio` side by side; ranks (threads, each with its own connection, through the Rust API)
//! write the ECIO seed's pattern collectively — 4-byte ints, block length 1, stride 2, a
//! resized vector file type, 1,024,000 ints over 2 ranks (tcp) and 4 (ofi+shm) — and read
//! it back; the file on the server's disk is compared byte for byte with the placement
//! MPI-IO's view semantics give, computed from the flattened file type.

use ferry_cio::{amode, Comm, File};
use ferry_dtype::Datatype;

mod common;

use common::*;

const COUNT: u64 = 1_024_000;

/// Rank `r` of `p`: two ranks interleave every other int of each half of the file.
fn view(r: u64, p: u64) -> (u64, Datatype) {
    let n = COUNT / p;
    let int = Datatype::primitive(4).unwrap();
    let v = Datatype::vector(n, 1, 2, &int).unwrap();
    (
        (r / 2) * 8 * n + (r % 2) * 4,
        Datatype::resized(&v, 0, 8 * n as i64).unwrap(),
    )
}

fn data(r: u64, n: u64) -> Vec<u8> {
    (0..n)
        .flat_map(|i| (((r as u32) << 24) | i as u32).to_le_bytes())
        .collect()
}

/// The file the view semantics give: each rank's stream byte by byte, placed by its
/// flattened file type tiled from the displacement.
fn expected(p: u64) -> Vec<u8> {
    let mut image = vec![0u8; 4 * COUNT as usize];
    for r in 0..p {
        let (disp, ft) = view(r, p);
        let tile: Vec<i64> = ft
            .flatten(1)
            .unwrap()
            .iter()
            .flat_map(|s| (0..s.len as i64).map(move |b| s.offset + b))
            .collect();
        for (i, b) in data(r, COUNT / p).into_iter().enumerate() {
            let (k, j) = (i / tile.len(), i % tile.len());
            let at = disp as i64 + k as i64 * ft.extent() + tile[j];
            image[at as usize] = b;
        }
    }
    image
}

fn seed_pattern(driver: &str, p: u64) {
    let s = serve_as(ferry(), driver, &[], &[]);
    let job = u64::from(std::process::id()) << 8 | p;
    let n = COUNT / p;
    let ranks: Vec<_> = (0..p)
        .map(|r| {
            let addr = s.addr.clone();
            std::thread::spawn(move || {
                let comm = Comm {
                    job,
                    rank: r as u32,
                    size: p as u32,
                };
                let mut f = File::open_with(
                    &addr,
                    "d/seed.bin",
                    comm,
                    amode::CREATE | amode::RDWR,
                    TOKEN,
                    &client_security(),
                )
                .unwrap();
                let int = Datatype::primitive(4).unwrap();
                let (disp, ft) = view(r, p);
                f.set_view(disp as i64, &int, &ft).unwrap();
                let mine = data(r, n);
                assert_eq!(f.write_at_all(0, &mine, n, &int).unwrap(), 4 * n);
                let mut back = vec![0u8; mine.len()];
                assert_eq!(f.read_at_all(0, &mut back, n, &int).unwrap(), 4 * n);
                assert!(back == mine, "rank {r} read back other bytes");
                f.close().unwrap();
            })
        })
        .collect();
    for t in ranks {
        t.join().unwrap();
    }
    let got = std::fs::read(s.root.join("seed.bin")).unwrap();
    assert!(
        got == expected(p),
        "the file differs from the view semantics"
    );
    // The same daemon still serves file transfer.
    let o = cp(
        &[
            &s.url("seed.bin"),
            s.root.join("copy.bin").to_str().unwrap(),
        ],
        &[],
    );
    ok(&o);
    assert!(std::fs::read(s.root.join("copy.bin")).unwrap() == got);
}

#[test]
fn seed_pattern_two_ranks_tcp() {
    seed_pattern("tcp", 2);
}

#[test]
fn seed_pattern_four_ranks_ofi_shm() {
    seed_pattern("ofi+shm", 4);
}

#[test]
fn services_lists_cio() {
    let s = serve_as(ferry(), "tcp", &[], &[]);
    let mut c = ferry();
    c.args(["services", &s.addr]);
    let o = run(c);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("xfer") && out.contains("cio"), "{out}");
}

/// A `[cio]` table configures the face (and file transfer still takes the rest); a bad value
/// stops `ferry serve` with a usage error naming it.
#[test]
fn cio_table_in_the_config() {
    let dir = scratch("cio-conf");
    let conf = dir.join("ferry.toml");
    std::fs::write(
        &conf,
        "block_size = 1048576\n[cio]\ncollective_timeout = 5.0\nchunk = 65536\n",
    )
    .unwrap();
    let s = serve_as(ferry(), "tcp", &[], &["--config", conf.to_str().unwrap()]);
    let comm = Comm {
        job: 7,
        rank: 0,
        size: 1,
    };
    let mut f = File::open_with(
        &s.addr,
        "d/one.bin",
        comm,
        amode::CREATE | amode::WRONLY,
        TOKEN,
        &client_security(),
    )
    .unwrap();
    let byte = Datatype::byte();
    assert_eq!(
        f.write_at(0, &vec![1u8; 200_000], 200_000, &byte).unwrap(),
        200_000
    );
    f.close().unwrap();
    assert_eq!(
        std::fs::metadata(s.root.join("one.bin")).unwrap().len(),
        200_000
    );
    std::fs::write(&conf, "[cio]\nchunk = 1\n").unwrap();
    let mut c = ferry();
    c.args([
        "serve",
        "--root",
        &format!("d={}", dir.display()),
        "--token",
        TOKEN,
    ])
    .args([
        "--listen",
        "tcp://127.0.0.1:0",
        "--config",
        conf.to_str().unwrap(),
    ]);
    fails(&run(c), 1, "[cio] chunk = 1");
    std::fs::remove_dir_all(&dir).unwrap();
}
