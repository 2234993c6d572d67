//! The SIGBUS guard of file mappings against a real provider that copies a send in user
//! space: libfabric's shm with CMA turned off (`FI_SHM_DISABLE_CMA=1`) copies through its
//! own buffers, so a send from a mapping whose file was truncated reads the lost pages in
//! this process. Without the guard that read kills the process with SIGBUS; with it the
//! send completes, the lost pages arrive as zeros and the buffer says it is torn. The test
//! runs itself as a child, since the variable must be set before libfabric starts.

use std::process::Command;
use std::time::Duration;

use ferry_fabric::{connect, listen, Access, Address, Buffer};

const T: Duration = Duration::from_secs(20);
const CHILD: &str = "FERRY_TEST_GUARD_CHILD";
const NAME: &str = "a_send_shm_copies_in_user_space_reads_zeros_past_a_truncation";

/// The child: a connected shm pair, a 1 MiB file mapped behind an 8-byte header and cut to
/// half once registered, then sent.
fn child() {
    let addr: Address = format!("ofi+shm://ferry-guard-{}", std::process::id())
        .parse()
        .unwrap();
    let l = listen(&addr).expect("listen");
    let at = l.local_addr();
    let c = std::thread::spawn(move || connect(&at, T).expect("connect"));
    let server = l.accept(T).expect("accept");
    let client = c.join().unwrap();
    let path = std::env::temp_dir().join(format!("ferry-guard-{}", std::process::id()));
    let len = 1 << 20;
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8 | 1).collect();
    std::fs::write(&path, &data).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let map = Buffer::map_file_after(&file, 0, len, 8, true).unwrap();
    map.write_at(0, b"HEADER!!");
    let src = client.domain().register(&map, Access::LOCAL).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len as u64 / 2)
        .unwrap();
    let dst = server
        .domain()
        .register(&Buffer::new(len + 64), Access::LOCAL)
        .unwrap();
    server.post_recv(&[dst.full()], 1).unwrap();
    client.post_send(&[src.full()], 2).unwrap();
    let sent = client.cq().wait(T).expect("the send completes");
    assert!(sent.result.is_ok(), "{:?}", sent.result);
    assert!(map.file_torn(), "the lost half was read without a trace");
    let got = server.cq().wait(T).expect("the message arrives");
    assert!(got.result.is_ok(), "{:?}", got.result);
    let bytes = dst.buffer().to_vec();
    let half = 8 + len / 2;
    assert_eq!(&bytes[8..half], &data[..len / 2], "the kept half");
    assert!(bytes[half..8 + len].iter().all(|&b| b == 0), "zeros");
    println!("torn and zeros, as guarded");
    drop((src, map));
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_send_shm_copies_in_user_space_reads_zeros_past_a_truncation() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--nocapture"])
        .env(CHILD, "1")
        .env("FI_SHM_DISABLE_CMA", "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "the child ended {:?}: {stdout}{stderr}",
        out.status
    );
    assert!(stdout.contains("torn and zeros"), "{stdout}{stderr}");
}
