//! Quick measurements of the ofi driver on tcp and shm (ignored by default; run with
//! `cargo test --release -p ferry-fabric --test ofi_bench -- --ignored --nocapture`).
//! Absolute numbers on a shared 2-core machine are noise; they show orders of magnitude and
//! the cost of the progress thread's idle strategy.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ferry_fabric::{listen, open, Access, Buffer, Domain, Endpoint, OpKind};

const T: Duration = Duration::from_secs(30);

fn pair(url: &str) -> (Arc<dyn Domain>, Box<dyn Endpoint>, Box<dyn Endpoint>) {
    let l = listen(&url.parse().unwrap()).unwrap();
    let la = l.local_addr();
    let h = thread::spawn(move || {
        let d = open(&la).unwrap();
        let ep = d.connect(&la, T).unwrap();
        (d, ep)
    });
    let server = l.accept(T).unwrap();
    server.enable_remote_access();
    let (d, client) = h.join().unwrap();
    (d, client, server)
}

fn urls() -> Vec<String> {
    vec![
        "ofi+tcp://127.0.0.1:0".into(),
        format!("ofi+shm://ferry-bench-{}", std::process::id()),
    ]
}

/// CPU time (user + system) of this process's threads named `ferry-ofi-*`, in clock ticks.
fn progress_cpu_ticks() -> u64 {
    let mut ticks = 0;
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("ferry-ofi") {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
        let f: Vec<&str> = after.split_whitespace().collect();
        ticks += f.get(11).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
        ticks += f.get(12).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    }
    ticks
}

#[test]
#[ignore]
fn ping_pong_8_bytes() {
    for url in urls() {
        let (d, client, server) = pair(&url);
        let n = 20_000;
        let sd = server.domain();
        let echo = thread::spawn(move || {
            let r = sd.register(&Buffer::new(8), Access::LOCAL).unwrap();
            for _ in 0..n {
                server.post_recv(&[r.full()], 1).unwrap();
                let c = server.cq().wait(T).unwrap();
                assert!(c.result.is_ok());
                server.post_send(&[r.full()], 2).unwrap();
                server.cq().wait(T).unwrap();
            }
            server
        });
        let s = d
            .register(&Buffer::from_slice(&[7; 8]), Access::LOCAL)
            .unwrap();
        let r = d.register(&Buffer::new(8), Access::LOCAL).unwrap();
        let mut rtts = Vec::with_capacity(n);
        for _ in 0..n {
            let t0 = Instant::now();
            client.post_recv(&[r.full()], 1).unwrap();
            client.post_send(&[s.full()], 2).unwrap();
            let mut got = 0;
            while got < 2 {
                let c = client.cq().wait(T).unwrap();
                assert!(c.result.is_ok());
                got += 1;
            }
            rtts.push(t0.elapsed());
        }
        echo.join().unwrap();
        rtts.sort();
        let med = rtts[n / 2];
        let p99 = rtts[n * 99 / 100];
        println!(
            "{url}: 8 B ping-pong half round trip: median {:.1} us, p99 {:.1} us",
            med.as_secs_f64() * 1e6 / 2.0,
            p99.as_secs_f64() * 1e6 / 2.0
        );
        // Idle cost: the progress threads of both domains, nothing posted.
        let t0 = progress_cpu_ticks();
        thread::sleep(Duration::from_secs(2));
        let busy = (progress_cpu_ticks() - t0) as f64 / 100.0 / 2.0 * 100.0;
        println!("{url}: idle progress threads use {busy:.1}% of one core in total");
    }
}

fn bandwidth(url: &str, kind: OpKind) {
    const SIZE: usize = 4 << 20;
    const N: usize = 100;
    let (d, client, server) = pair(url);
    let target = server
        .domain()
        .register(&Buffer::new(SIZE), Access::ALL)
        .unwrap();
    server.grant(&target).unwrap();
    let local = d.register(&Buffer::new(SIZE), Access::LOCAL).unwrap();
    let remote = target.remote(..).unwrap();
    let t0 = Instant::now();
    for i in 0..N {
        match kind {
            OpKind::Write => client
                .post_write(&[local.full()], remote, i as u64)
                .unwrap(),
            _ => client.post_read(&[local.full()], remote, i as u64).unwrap(),
        }
        let c = client.cq().wait(T).unwrap();
        assert!(c.result.is_ok(), "{:?}", c.result);
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{url}: 4 MiB RMA {kind:?}: {:.2} GB/s ({:.0} us each)",
        (SIZE * N) as f64 / secs / 1e9,
        secs / N as f64 * 1e6
    );
    drop(server);
}

#[test]
#[ignore]
fn rma_4_mib_bandwidth() {
    for url in urls() {
        bandwidth(&url, OpKind::Write);
        bandwidth(&url, OpKind::Read);
    }
}

#[test]
#[ignore]
fn send_4_mib_bandwidth() {
    const SIZE: usize = 4 << 20;
    const N: usize = 100;
    for url in urls() {
        let (d, client, server) = pair(&url);
        let sd = server.domain();
        let rx = thread::spawn(move || {
            let r = sd.register(&Buffer::new(SIZE), Access::LOCAL).unwrap();
            for _ in 0..N {
                server.post_recv(&[r.full()], 0).unwrap();
                assert!(server.cq().wait(T).unwrap().result.is_ok());
            }
        });
        let s = d.register(&Buffer::new(SIZE), Access::LOCAL).unwrap();
        let t0 = Instant::now();
        for _ in 0..N {
            client.post_send(&[s.full()], 0).unwrap();
            assert!(client.cq().wait(T).unwrap().result.is_ok());
        }
        rx.join().unwrap();
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "{url}: 4 MiB send/recv: {:.2} GB/s",
            (SIZE * N) as f64 / secs / 1e9
        );
    }
}

#[test]
#[ignore]
fn rma_8_bytes_latency() {
    for url in urls() {
        let (d, client, server) = pair(&url);
        let target = server
            .domain()
            .register(&Buffer::new(8), Access::ALL)
            .unwrap();
        server.grant(&target).unwrap();
        let local = d.register(&Buffer::new(8), Access::LOCAL).unwrap();
        let remote = target.remote(..).unwrap();
        let mut lat = Vec::new();
        for i in 0..5_000u64 {
            let t0 = Instant::now();
            client.post_write(&[local.full()], remote, i).unwrap();
            assert!(client.cq().wait(T).unwrap().result.is_ok());
            lat.push(t0.elapsed());
        }
        lat.sort();
        println!(
            "{url}: 8 B RMA write, post to completion: median {:.1} us",
            lat[lat.len() / 2].as_secs_f64() * 1e6
        );
        drop(server);
    }
}
