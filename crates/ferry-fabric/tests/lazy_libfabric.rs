//! libfabric is not a link-time dependency: a process loads it only when it first uses an
//! `ofi` driver (its load can cost 0.2 s: Debian's libfabric pulls in libpsm_infinipath,
//! whose constructor calibrates the clock). One test, so nothing else in this process loads
//! the library first.

mod tcp_util;

use ferry_fabric::{listen, Access, Address, OpKind};
use tcp_util::*;

/// The signals this process catches (`SigCgt` of /proc/self/status, a hex mask).
fn caught_signals() -> String {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let line = status.lines().find(|l| l.starts_with("SigCgt:"));
    line.expect("SigCgt line").to_string()
}

/// Whether libfabric is mapped into this process.
fn libfabric_mapped() -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    maps.lines().any(|l| l.contains("/libfabric.so"))
}

#[test]
fn libfabric_is_loaded_only_by_an_ofi_driver() {
    assert!(
        !libfabric_mapped(),
        "libfabric is mapped before any fabric call: it is linked (DT_NEEDED) again"
    );

    // Native tcp work: a connection and a message each way.
    let p = pair();
    for (from, to) in [(&p.client, &p.server), (&p.server, &p.client)] {
        let data = pattern(1000, 7);
        let src = register_data(&**from, &data, Access::LOCAL);
        let dst = register(&**to, 1000, Access::LOCAL);
        to.post_recv(&[dst.full()], 1).unwrap();
        from.post_send(&[src.full()], 2).unwrap();
        assert_eq!(ok(&**from).op, OpKind::Send);
        assert_eq!(ok(&**to).op, OpKind::Recv);
        assert_eq!(dst.buffer().to_vec(), data);
    }
    drop(p);
    assert!(
        !libfabric_mapped(),
        "the native tcp driver loaded libfabric"
    );

    // The first ofi use opens it, and leaves the process's signal handlers as they were
    // (Debian's libinfinipath, loaded with libfabric, installs its own for SIGINT, SIGTERM,
    // SIGSEGV, SIGBUS, SIGILL and SIGABRT).
    let caught = caught_signals();
    let addr: Address = "ofi+tcp://127.0.0.1:0".parse().unwrap();
    let listener = listen(&addr).expect("ofi+tcp listen");
    assert!(
        libfabric_mapped(),
        "an ofi+tcp listener without libfabric mapped"
    );
    assert_eq!(
        caught_signals(),
        caught,
        "loading libfabric changed signal handlers"
    );
    assert_ne!(listener.local_addr().port, Some(0));
}
