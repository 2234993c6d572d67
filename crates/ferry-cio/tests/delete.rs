//! DELETE_ON_CLOSE (protocol 1.1) through a real server on loopback: a file opened with it
//! is removed when every rank closed it, not before; a one-rank session opening a file
//! read-only with it removes the file (what MPI_File_delete does); a missing file is
//! NoSuchFile and a path outside the roots Access, with nothing removed.

mod common;

use std::time::Duration;

use common::{job, start, TOKEN};
use ferry_cio::{amode, Comm, ErrorClass, File};
use ferry_dtype::Datatype;

fn open(
    addr: &str,
    path: &str,
    key: u64,
    rank: u32,
    size: u32,
    mode: u32,
) -> ferry_cio::Result<File> {
    common::open(
        addr,
        path,
        Comm {
            job: key,
            rank,
            size,
        },
        mode,
        TOKEN,
    )
}

#[test]
fn a_file_opened_delete_on_close_goes_at_the_sessions_close() {
    let s = start("tcp", Duration::from_secs(10));
    let key = job();
    let mode = amode::CREATE | amode::RDWR | amode::DELETE_ON_CLOSE;
    let ranks: Vec<_> = (0..2u32)
        .map(|rank| {
            let addr = s.addr.clone();
            std::thread::spawn(move || {
                let mut f = open(&addr, "d/scratch.bin", key, rank, 2, mode).unwrap();
                let int = Datatype::primitive(4).unwrap();
                f.write_at_all(4 * u64::from(rank), &rank.to_le_bytes(), 1, &int)
                    .unwrap();
                f.sync().unwrap();
                f
            })
        })
        .collect();
    let files: Vec<File> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
    let on_disk = s.root.join("scratch.bin");
    assert_eq!(
        std::fs::metadata(&on_disk).unwrap().len(),
        8,
        "there until closed"
    );
    let closing: Vec<_> = files
        .into_iter()
        .map(|f| std::thread::spawn(move || f.close()))
        .collect();
    for c in closing {
        c.join().unwrap().unwrap();
    }
    assert!(!on_disk.exists(), "the close removed it");
}

#[test]
fn a_one_rank_delete_removes_the_file_and_refuses_missing_or_outside_paths() {
    let s = start("tcp", Duration::from_secs(10));
    std::fs::write(s.root.join("old.nc"), b"CDF\x05").unwrap();
    let delete = amode::RDONLY | amode::DELETE_ON_CLOSE;
    open(&s.addr, "d/old.nc", job(), 0, 1, delete)
        .unwrap()
        .close()
        .unwrap();
    assert!(!s.root.join("old.nc").exists());
    let again = open(&s.addr, "d/old.nc", job(), 0, 1, delete);
    assert_eq!(again.err().map(|e| e.class), Some(ErrorClass::NoSuchFile));
    let outside = open(&s.addr, "d/../escape", job(), 0, 1, delete);
    assert_eq!(outside.err().map(|e| e.class), Some(ErrorClass::Access));
    assert!(s.root.exists(), "the root itself stays");
}
