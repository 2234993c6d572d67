//! The unasked direct read: a large file on a disk filesystem is read around the page cache
//! only where its pages are not in it ([`direct_read_helps`]), and a file in memory never.

use std::io::Write;

use ferry_service::direct::{cached, direct_helps, direct_read_helps};

/// Whether `f` is on a filesystem whose pages can leave the page cache (not tmpfs).
fn on_disk(f: &std::fs::File) -> bool {
    const TMPFS: u64 = 0x0102_1994;
    rustix::fs::fstatfs(f).is_ok_and(|s| s.f_type as u64 != TMPFS)
}

#[test]
fn only_uncached_pages_of_a_large_disk_file_are_read_directly() {
    let dir = std::env::temp_dir().join(format!("ferry-direct-read-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("f");
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&vec![7u8; 1 << 20]).unwrap();
    f.sync_all().unwrap();
    let f = std::fs::File::open(&path).unwrap();
    // Just written: in the cache.
    assert!(cached(&f, 0) && cached(&f, 512 << 10));
    // Small files stay buffered whatever their pages.
    assert!(!direct_read_helps(&f, 1 << 20, 0));
    if on_disk(&f) {
        // Clean pages dropped from the cache: a read could only come from the disk.
        rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
        assert!(!cached(&f, 0), "dropped pages reported cached");
        let large = 1 << 30;
        assert_eq!(direct_read_helps(&f, large, 0), direct_helps(&f, large));
        // Read again: cached, so buffered.
        let mut page = [0u8; 4096];
        rustix::io::pread(&f, &mut page, 0).unwrap();
        assert!(cached(&f, 0) && !direct_read_helps(&f, large, 0));
    }
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        let p = shm.join(format!("ferry-direct-read-{}", std::process::id()));
        std::fs::write(&p, vec![1u8; 4096]).unwrap();
        let m = std::fs::File::open(&p).unwrap();
        assert!(
            cached(&m, 0) && !direct_read_helps(&m, 1 << 30, 0),
            "tmpfs is its cache"
        );
        let _ = std::fs::remove_file(&p);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
