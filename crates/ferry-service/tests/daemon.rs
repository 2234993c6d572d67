//! A daemon hosting an EXS service and an endpoint with a socket of its own, in a process
//! of its own (this file is its own test binary, so the signal it sends itself reaches no
//! other test): both faces' addresses are listed, the service answers a probe, the first
//! SIGTERM stops accepting and begins every face's drain, and the drain sums what each face
//! reports.

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_service::admit::{Admission, LimitsConfig};
use ferry_service::auth::AuthConfig;
use ferry_service::daemon::{Daemon, Endpoint};
use ferry_service::drain::DrainReport;
use ferry_service::registry::{probe_with, Answer, Conn, Service};
use ferry_service::secure::{ClientSecurity, ServerSecurity};

const T: Duration = Duration::from_secs(10);

/// Counts what the daemon asked of a face.
#[derive(Default)]
struct Calls {
    begun: AtomicUsize,
    drained: AtomicUsize,
}

/// A service that serves nothing (the probe is answered by the floor) and reports one
/// transfer in flight at its drain.
#[derive(Default)]
struct Quiet(Calls);

impl Service for Quiet {
    fn serve_connection(&self, _conn: Conn) {}

    fn begin_drain(&self) {
        self.0.begun.fetch_add(1, Ordering::SeqCst);
    }

    fn drain(&self, _grace: Duration) -> DrainReport {
        self.0.drained.fetch_add(1, Ordering::SeqCst);
        DrainReport {
            in_flight: 1,
            interrupted: 0,
            abandoned: 0,
        }
    }
}

/// An endpoint on a TCP socket of its own that accepts nothing and reports one transfer
/// interrupted at its drain.
struct Plain {
    listener: TcpListener,
    calls: Calls,
    served_until_quit: AtomicBool,
}

impl Endpoint for Plain {
    fn local_addrs(&self) -> Vec<String> {
        vec![format!("nbd://{}", self.listener.local_addr().unwrap())]
    }

    fn serve_until(&self, quit: &AtomicBool) {
        while !quit.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.served_until_quit.store(true, Ordering::SeqCst);
    }

    fn begin_drain(&self) {
        self.calls.begun.fetch_add(1, Ordering::SeqCst);
    }

    fn drain(&self, _grace: Duration) -> DrainReport {
        self.calls.drained.fetch_add(1, Ordering::SeqCst);
        DrainReport {
            in_flight: 1,
            interrupted: 1,
            abandoned: 0,
        }
    }
}

#[test]
fn a_signal_drains_every_face() {
    let dir = std::env::temp_dir().join(format!("ferry-service-daemon-{}", std::process::id()));
    let security = ServerSecurity::from_state_dir(&dir, false).unwrap();
    let pin = ClientSecurity {
        fingerprint: security.fingerprint().map(String::from),
        ..ClientSecurity::default()
    };
    let admission = Admission::new(&LimitsConfig::default(), |_, _| 0);
    let mut daemon = Daemon::new(
        vec!["tcp://127.0.0.1:0".into()],
        AuthConfig {
            anonymous: true,
            ..AuthConfig::default()
        },
        admission,
        security.clone(),
    );
    let service = Arc::new(Quiet::default());
    let endpoint = Arc::new(Plain {
        listener: TcpListener::bind("127.0.0.1:0").unwrap(),
        calls: Calls::default(),
        served_until_quit: AtomicBool::new(false),
    });
    daemon.add_service("quiet", service.clone()).unwrap();
    daemon.add_endpoint(endpoint.clone());
    assert!(daemon.add_service("quiet", service.clone()).is_err());

    let mut running = daemon.start().unwrap();
    let addrs = running.addresses();
    assert_eq!(addrs.len(), 2, "{addrs:?}");
    assert!(addrs[0].starts_with("tcp://127.0.0.1:"), "{addrs:?}");
    assert!(addrs[1].starts_with("nbd://127.0.0.1:"), "{addrs:?}");

    let exs = addrs[0].clone();
    let watched = service.clone();
    let signaller = std::thread::spawn(move || {
        assert_eq!(
            probe_with(&exs, "quiet", T, &pin).unwrap(),
            Answer::Selected
        );
        assert_eq!(
            watched.0.begun.load(Ordering::SeqCst),
            0,
            "drained before the signal"
        );
        let me = rustix::process::getpid();
        rustix::process::kill_process(me, rustix::process::Signal::TERM).unwrap();
    });
    running.serve_until_signal();
    signaller.join().unwrap();
    assert!(endpoint.served_until_quit.load(Ordering::SeqCst));
    assert_eq!(service.0.begun.load(Ordering::SeqCst), 1);
    assert_eq!(endpoint.calls.begun.load(Ordering::SeqCst), 1);

    let report = running.drain(T);
    assert_eq!(
        report,
        DrainReport {
            in_flight: 2,
            interrupted: 1,
            abandoned: 0
        }
    );
    assert_eq!(service.0.drained.load(Ordering::SeqCst), 1);
    assert_eq!(endpoint.calls.drained.load(Ordering::SeqCst), 1);
}
