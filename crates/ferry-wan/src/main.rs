//! `ferry-wan`: bring an emulated WAN path up, run commands across it, clean up.

use std::process::{Child, Command, ExitCode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use ferry_wan::units::{parse_bytes, parse_duration, parse_probability, parse_rate};
use ferry_wan::{Config, HostLimits, Offload, Wan};

#[derive(Parser)]
#[command(
    name = "ferry-wan",
    version,
    about = "A WAN emulator: two network namespaces \
    joined by a user-space delay line with a bottleneck (needs root)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Bring the path up, print the namespaces and addresses, hold it until SIGINT or
    /// SIGTERM. SIGUSR1 cuts the link (everything is dropped), SIGUSR2 restores it.
    Up(PathArgs),
    /// Bring the path up, run one command in A and one in B, tear down. Exits with B's
    /// status (or A's when B succeeded and A failed on its own).
    Run(RunArgs),
    /// Delete namespaces left by runs that are gone (and the processes inside them).
    Down(DownArgs),
}

#[derive(Args)]
struct PathArgs {
    /// Round-trip time (each direction delays by half): 30ms, 0.1s.
    #[arg(long, default_value = "0ms", value_parser = parse_duration)]
    rtt: Duration,
    /// Bottleneck rate, each direction: 1gbit, 200mbit (default: none).
    #[arg(long, value_parser = parse_rate)]
    rate: Option<u64>,
    /// Drop-tail queue limit: 4m, 512k (default: one bandwidth-delay product, ≥ 256k).
    #[arg(long, value_parser = parse_bytes)]
    queue: Option<u64>,
    /// Random loss per 1500-byte segment, each direction: 0.1%.
    #[arg(long, default_value = "0", value_parser = parse_probability)]
    loss: f64,
    /// Share of segments held back by --reorder-delay so later ones overtake them: 1%.
    #[arg(long, default_value = "0", value_parser = parse_probability)]
    reorder: f64,
    /// How much longer a reordered segment is held.
    #[arg(long, default_value = "1ms", value_parser = parse_duration)]
    reorder_delay: Duration,
    /// Seed of the loss and reordering draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// TCP GSO super-packets cross the line whole (on) or as 1500-byte packets (off).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    offload: String,
    /// Keep the host's tcp_rmem/tcp_wmem in the namespaces instead of raising them.
    #[arg(long)]
    host_buffers: bool,
    /// Run the delay line at normal priority instead of SCHED_FIFO.
    #[arg(long)]
    no_realtime: bool,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    path: PathArgs,
    /// Shell command run in namespace A (first); $FERRY_WAN_A and $FERRY_WAN_B hold the
    /// addresses. Killed when B's command ends and --grace has passed.
    #[arg(long = "a", value_name = "CMD")]
    a_cmd: String,
    /// Shell command run in namespace B once A's has started.
    #[arg(long = "b", value_name = "CMD")]
    b_cmd: String,
    /// How long A's command may go on after B's ended.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    grace: Duration,
}

#[derive(Args)]
struct DownArgs {
    /// Every ferry-wan namespace whose process is gone.
    #[arg(long)]
    all: bool,
    /// Also those of runs still alive.
    #[arg(long, requires = "all")]
    force: bool,
}

fn main() -> ExitCode {
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ferry-wan: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn real_main() -> Result<ExitCode> {
    match Cli::parse().cmd {
        Cmd::Up(args) => up(&args),
        Cmd::Run(args) => run(&args),
        Cmd::Down(args) => down(&args),
    }
}

impl PathArgs {
    fn config(&self) -> Config {
        Config {
            rtt: self.rtt,
            rate_bps: self.rate,
            queue_bytes: self.queue,
            loss: self.loss,
            reorder: self.reorder,
            reorder_delay: self.reorder_delay,
            seed: self.seed,
            offload: match self.offload.as_str() {
                "off" => Offload::Off,
                _ => Offload::On,
            },
            raise_buffers: !self.host_buffers,
            realtime: !self.no_realtime,
        }
    }
}

/// SIGINT, SIGTERM and SIGHUP set the returned flag instead of killing the process, so
/// teardown always runs.
fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(sig, flag.clone()).context("install signal handler")?;
    }
    Ok(flag)
}

fn bring_up(args: &PathArgs) -> Result<Wan> {
    let wan = Wan::up(args.config())?;
    describe(&wan);
    Ok(wan)
}

fn up(args: &PathArgs) -> Result<ExitCode> {
    let stop = stop_on_signals()?;
    let (cut, restore) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    signal_hook::flag::register(signal_hook::consts::SIGUSR1, cut.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGUSR2, restore.clone())?;
    let wan = bring_up(args)?;
    println!("a {} {}", wan.a().netns, wan.a().addr);
    println!("b {} {}", wan.b().netns, wan.b().addr);
    eprintln!(
        "ferry-wan: up (pid {}); SIGUSR1 cuts the link, SIGUSR2 restores it, SIGINT or \
         SIGTERM tears it down",
        std::process::id()
    );
    while !stop.load(Ordering::Relaxed) {
        if cut.swap(false, Ordering::Relaxed) {
            wan.set_cut(true);
            eprintln!("ferry-wan: link cut");
        }
        if restore.swap(false, Ordering::Relaxed) {
            wan.set_cut(false);
            eprintln!("ferry-wan: link restored");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    report_stats(&wan);
    Ok(ExitCode::SUCCESS)
}

/// Prints the path's settings and what the host's own buffers would allow, on stderr.
fn describe(wan: &Wan) {
    let cfg = wan.config();
    let rate = cfg
        .rate_bps
        .map_or("none".to_string(), |r| format!("{} Mbit/s", r / 1_000_000));
    eprintln!(
        "ferry-wan: rtt {} ms, bottleneck {rate}, queue {} KiB, loss {}%, reorder {}%, \
         tcp buffer ceiling {} MiB{}",
        cfg.rtt.as_secs_f64() * 1e3,
        cfg.queue_limit() >> 10,
        cfg.loss * 100.0,
        cfg.reorder * 100.0,
        cfg.buffer_ceiling() >> 20,
        if cfg.raise_buffers {
            ""
        } else {
            " (not set: host's)"
        },
    );
    if let Ok(host) = HostLimits::read() {
        if let Some(bps) = host.single_stream_bps(cfg.rtt) {
            eprintln!(
                "ferry-wan: host tcp_rmem max {} KiB, tcp_wmem max {} KiB: one autotuned \
                 stream outside the emulator gets roughly {:.0} Mbit/s at this rtt",
                host.tcp_rmem_max >> 10,
                host.tcp_wmem_max >> 10,
                bps / 1e6
            );
        }
    }
}

fn report_stats(wan: &Wan) {
    for (dir, s) in [("a->b", wan.stats_a_to_b()), ("b->a", wan.stats_b_to_a())] {
        let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        eprintln!(
            "ferry-wan: {dir}: {} packets, {} MB; segments dropped: {} by the queue, {} by \
             the loss, {} by a cut; {} reordered; {} releases over 1 ms late, the latest {} us{}",
            get(&s.packets),
            get(&s.bytes) / 1_000_000,
            get(&s.queue_drops),
            get(&s.random_drops),
            get(&s.cut_drops),
            get(&s.reordered),
            get(&s.late_releases),
            get(&s.max_release_lateness_us),
            if s.realtime.load(Ordering::Relaxed) {
                ""
            } else {
                " (normal priority: SCHED_FIFO was refused or turned off)"
            },
        );
    }
}

fn run(args: &RunArgs) -> Result<ExitCode> {
    let stop = stop_on_signals()?;
    let wan = bring_up(&args.path)?;
    for (side, end) in [("a", wan.a()), ("b", wan.b())] {
        eprintln!("ferry-wan: namespace {side} {} {}", end.netns, end.addr);
    }
    let mut a = spawn_shell(&wan, true, &args.a_cmd)?;
    let mut b = match spawn_shell(&wan, false, &args.b_cmd) {
        Ok(b) => b,
        Err(e) => {
            kill_group(&mut a);
            return Err(e);
        }
    };
    let b_status = wait_or_stop(&mut b, &stop, None);
    let a_status = wait_or_stop(&mut a, &stop, Some(args.grace));
    kill_group(&mut a);
    kill_group(&mut b);
    report_stats(&wan);
    if stop.load(Ordering::Relaxed) {
        bail!("stopped by a signal");
    }
    let code = |s: Option<std::process::ExitStatus>| s.map_or(1, |s| s.code().unwrap_or(1));
    Ok(match (b_status, a_status) {
        (Some(b), Some(a)) if b.success() && !a.success() => ExitCode::from(code(Some(a)) as u8),
        (b, _) => ExitCode::from(code(b) as u8),
    })
}

/// Starts `sh -c CMD` in namespace A or B, in a process group of its own so that
/// everything it starts can be stopped together.
fn spawn_shell(wan: &Wan, in_a: bool, cmd: &str) -> Result<Child> {
    use std::os::unix::process::CommandExt;
    let mut sh = Command::new("sh");
    sh.args(["-c", cmd]);
    let mut cmd_ns = if in_a {
        wan.exec_in_a(sh)
    } else {
        wan.exec_in_b(sh)
    };
    cmd_ns.process_group(0);
    cmd_ns.spawn().with_context(|| format!("start {cmd:?}"))
}

/// Waits for the child to exit, for a signal, or (with a limit) for `limit` to pass.
/// `None` when it did not exit on its own.
fn wait_or_stop(
    child: &mut Child,
    stop: &AtomicBool,
    limit: Option<Duration>,
) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    while !stop.load(Ordering::Relaxed) && limit.is_none_or(|l| start.elapsed() < l) {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => return None,
        }
    }
    None
}

/// Ends a child's process group (SIGTERM, then SIGKILL after a second) and reaps it.
fn kill_group(child: &mut Child) {
    use rustix::process::{kill_process_group, Pid, Signal};
    let Some(pgid) = Pid::from_raw(child.id() as i32) else {
        return;
    };
    if matches!(child.try_wait(), Ok(Some(_))) {
        // The leader is gone; stray members of its group still get the signal.
        let _ = kill_process_group(pgid, Signal::KILL);
        return;
    }
    let _ = kill_process_group(pgid, Signal::TERM);
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = kill_process_group(pgid, Signal::KILL);
    let _ = child.wait();
}

fn down(args: &DownArgs) -> Result<ExitCode> {
    if !args.all {
        bail!("say --all (every ferry-wan namespace whose run is gone)");
    }
    for name in ferry_wan::stale_namespaces(args.force) {
        ferry_wan::remove_namespace(&name)?;
        println!("removed {name}");
    }
    Ok(ExitCode::SUCCESS)
}
