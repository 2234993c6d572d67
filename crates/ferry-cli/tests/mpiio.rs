//! The MPI-IO interposer `libferry-mpiio.so` under real MPI: unmodified MPI programs
//! (`c/mpiio/tests/*.c`, mpi4py, h5py, HDF5, PnetCDF) run with `mpirun` and
//! `LD_PRELOAD`, their files named `ferry+DRIVER://…/d/…` on a `ferry serve` (tcp and
//! ofi+shm, 2 and 4 ranks); each file on the server's disk is compared byte for byte with
//! the file Open MPI's own MPI-IO writes for the same program on a local path.
//!
//! The interposer is built once per run (`cargo build -p ferry-mpiio` into this test's
//! target directory, then `c/mpiio/link.sh`). Needs Open MPI (`scripts/install-deps.sh`).
//! `FERRY_MPIIO_SEED_COUNT` sets the seed pattern's count (default 102,400; the seed's
//! largest is 1,024,000).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

use common::*;

/// The workspace's root.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where the MPI pieces of this run live: the interposer and the compiled test programs.
struct Mpi {
    lib: PathBuf,
    bin: PathBuf,
}

/// Builds the interposer and the C test programs, once.
fn mpi() -> &'static Mpi {
    static MPI: OnceLock<Mpi> = OnceLock::new();
    MPI.get_or_init(|| {
        // This test runs from TARGET/PROFILE/deps/; the interposer goes to TARGET/PROFILE.
        let exe = std::env::current_exe().unwrap();
        let profile = exe.parent().unwrap().parent().unwrap().to_path_buf();
        let mut cargo = Command::new(env!("CARGO"));
        cargo
            .current_dir(workspace())
            .args(["build", "--locked", "-p", "ferry-mpiio", "--target-dir"])
            .arg(profile.parent().unwrap());
        if profile.ends_with("release") {
            cargo.arg("--release");
        }
        must(run(cargo), "cargo build -p ferry-mpiio");
        let mut link = Command::new("bash");
        link.arg(workspace().join("c/mpiio/link.sh")).arg(&profile);
        must(run(link), "c/mpiio/link.sh");
        let bin = scratch("mpiio-bin");
        // Each C program with its compiler driver and libraries.
        let programs: [(&str, &str, &[&str]); 5] = [
            ("seed", "mpicc", &[]),
            ("views", "mpicc", &[]),
            ("fault", "mpicc", &[]),
            ("hdf5_grid", "h5pcc", &[]),
            ("pnetcdf_grid", "mpicc", &["-lpnetcdf"]),
        ];
        for (prog, cc, libs) in programs {
            let mut c = Command::new(cc);
            // h5pcc leaves its object file in the current directory.
            c.current_dir(&bin)
                .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
                .arg(bin.join(prog))
                .arg(workspace().join(format!("c/mpiio/tests/{prog}.c")))
                .args(libs);
            must(run(c), cc);
        }
        Mpi {
            lib: profile.join("libferry-mpiio.so"),
            bin,
        }
    })
}

/// Panics with the command's output unless it succeeded.
fn must(o: Output, what: &str) -> Output {
    assert!(
        o.status.success(),
        "{what} failed ({:?}):\n{}\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// How a program runs under `mpirun`.
enum Io<'a> {
    /// With the interposer preloaded, talking to a ferry server (its token in the env).
    Ferry,
    /// Open MPI's own MPI-IO on local files, with these MCA settings (name, value).
    Local(&'a [(&'a str, &'a str)]),
}

/// `mpirun -np NP PROGRAM ARGS` as root if need be, oversubscribed (2 cores here).
fn mpirun(np: u32, io: Io, program: &[&str]) -> Command {
    let mut c = Command::new("mpirun");
    c.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        &np.to_string(),
    ])
    // Open MPI's shared-memory transport cannot use CMA/XPMEM in most containers.
    .args(["--mca", "btl_vader_single_copy_mechanism", "none"]);
    match io {
        Io::Ferry => {
            // The ranks pin the test servers' identity in this test process's own
            // known-hosts file, as `isolate` gives every other client: the user's
            // (~/.config/ferry) would hold another run's key for a reused port.
            let sec = security_dir();
            c.arg("-x")
                .arg(format!("LD_PRELOAD={}", mpi().lib.display()))
                .args(["-x", &format!("FERRY_TOKEN={TOKEN}")])
                .args(["-x", "FERRY_MPIIO_VERBOSE=1"])
                .arg("-x")
                .arg(format!(
                    "FERRY_KNOWN_HOSTS={}",
                    sec.join("known_hosts").display()
                ))
                .arg("-x")
                .arg(format!("XDG_CONFIG_HOME={}", sec.join("config").display()));
        }
        Io::Local(mca) => {
            for (k, v) in mca {
                c.args(["--mca", k, v]);
            }
        }
    }
    c.args(program);
    c
}

/// Runs an `mpirun` command, one at a time: Open MPI's launchers race creating their
/// session directory (`/tmp/ompi.HOST.UID`: "File exists") when started together, and
/// the machine has 2 cores anyway.
fn run_mpi(cmd: Command) -> Output {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    run(cmd)
}

/// The command line of test program `prog`: a C program built by [`mpi`], or a Python
/// script of `c/mpiio/tests/` run by Debian's python3 (where python3-mpi4py and
/// python3-h5py-mpi install; `FERRY_MPIIO_PYTHON` to change it).
fn program(prog: &str) -> Vec<String> {
    if prog.ends_with(".py") {
        let python =
            std::env::var("FERRY_MPIIO_PYTHON").unwrap_or_else(|_| "/usr/bin/python3".into());
        let script = workspace().join("c/mpiio/tests").join(prog);
        vec![python, script.display().to_string()]
    } else {
        vec![mpi().bin.join(prog).display().to_string()]
    }
}

/// `prog FILE ARGS`.
fn argv(prog: &str, file: &str, args: &[&str]) -> Vec<String> {
    let mut v = program(prog);
    v.push(file.to_string());
    v.extend(args.iter().map(|a| a.to_string()));
    v
}

fn seed_count() -> u64 {
    std::env::var("FERRY_MPIIO_SEED_COUNT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(102_400)
}

/// ROMIO (Open MPI's `romio321`) with its defaults: two-phase collective I/O.
const ROMIO: &[(&str, &str)] = &[("io", "romio321")];

/// OMPIO with fcoll `individual`: each rank writes exactly its own pieces. (ROMIO's and
/// OMPIO vulcan's collective buffering write stale buffer bytes into the holes inside a
/// tile, so they are no reference where a view has holes; ferry never writes a hole.)
const OMPIO_INDIVIDUAL: &[(&str, &str)] = &[("io", "ompio"), ("fcoll", "individual")];

/// A file written by a program through Open MPI's MPI-IO (`mca`) on a local path; the
/// directory goes when it is dropped.
struct Local {
    dir: PathBuf,
    path: PathBuf,
}

impl Drop for Local {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn reference(np: u32, mca: &[(&str, &str)], prog: &str, args: &[&str]) -> Local {
    let dir = scratch("mpiio-ref");
    let path = dir.join(format!("ref-{}", prog.replace(".py", "")));
    let cmd = argv(prog, &path.display().to_string(), args);
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    must(run_mpi(mpirun(np, Io::Local(mca), &cmd)), prog);
    Local { dir, path }
}

/// A program's run against a ferry server.
struct Ran {
    /// The server (its root holds the file; stopped when dropped).
    _server: Server,
    /// The file on the server's disk.
    file: PathBuf,
    /// What the ranks printed.
    stdout: String,
}

/// Runs `prog FILE ARGS` on `np` ranks against a ferry server on `driver`, the file named
/// `ferry+DRIVER://…/d/NAME`; the program must say ": ok".
fn through_ferry(driver: &str, np: u32, prog: &str, args: &[&str]) -> Ran {
    let s = serve_as(ferry(), driver, &[], &[]);
    let name = prog.replace(".py", "");
    let url = format!("ferry+{}", s.url(&name));
    let cmd = argv(prog, &url, args);
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let out = must(run_mpi(mpirun(np, Io::Ferry, &cmd)), prog);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(stdout.contains(": ok"), "{prog} did not say ok: {stdout}");
    Ran {
        file: s.root.join(&name),
        _server: s,
        stdout,
    }
}

/// `prog` through ferry and through Open MPI (`mca`) give byte-identical files; returns
/// ferry's run, for more checks.
fn same_as(driver: &str, np: u32, prog: &str, args: &[&str], mca: &[(&str, &str)]) -> Ran {
    let ran = through_ferry(driver, np, prog, args);
    let want = reference(np, mca, prog, args);
    same_file(
        &std::fs::read(&ran.file).unwrap(),
        &std::fs::read(&want.path).unwrap(),
        &format!("{prog} np {np} on {driver}"),
    );
    ran
}

fn same_file(ferry: &[u8], reference: &[u8], what: &str) {
    assert_eq!(ferry.len(), reference.len(), "{what}: file sizes differ");
    if let Some(i) = ferry.iter().zip(reference).position(|(a, b)| a != b) {
        panic!("{what}: the files differ first at byte {i}");
    }
}

/// The seed's pattern (MPI_INT, block length 1, stride 2) written collectively and read
/// back: the file equals ROMIO's for the same program.
fn seed(driver: &str, np: u32) {
    same_as(driver, np, "seed", &[&seed_count().to_string()], ROMIO);
}

#[test]
fn seed_pattern_np2_tcp() {
    seed("tcp", 2);
}

#[test]
fn seed_pattern_np4_ofi_shm() {
    seed("ofi+shm", 4);
}

/// The seed's pattern with write pipelining on (hint `ferry_pipeline=on`), 20 collective
/// writes then 20 reads: the file still equals ROMIO's. A bad value of the hint fails the
/// open with MPI_ERR_ARG and ferry's message.
#[test]
fn seed_pattern_pipelined_np2_tcp() {
    let count = seed_count().to_string();
    let hint = ["20", "wr", "ferry_pipeline=on"];
    same_as(
        "tcp",
        2,
        "seed",
        &[&count, hint[0], hint[1], hint[2]],
        ROMIO,
    );
    let s = serve_as(ferry(), "tcp", &[], &[]);
    let url = format!("ferry+{}", s.url("bad-hint"));
    let cmd = argv("seed", &url, &["4096", "1", "wr", "ferry_pipeline=lots"]);
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let out = run_mpi(mpirun(2, Io::Ferry, &cmd));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a bad ferry_pipeline opened: {err}");
    assert!(
        err.contains("ferry_pipeline") && err.contains("CALLS,BYTES"),
        "no clear message: {err}"
    );
}

/// The seed's pattern with the client's pipelining and read cache off (hints
/// `ferry_pipeline=off`, `ferry_read_cache=off`: every call a round trip, collective reads
/// gathered by the server), 5 writes then 5 reads: the file still equals ROMIO's. A bad
/// `ferry_read_cache` fails the open with MPI_ERR_ARG and ferry's message.
#[test]
fn seed_pattern_plain_np2_tcp() {
    let count = seed_count().to_string();
    let args = [
        &count,
        "5",
        "wr",
        "ferry_pipeline=off",
        "ferry_read_cache=off",
    ];
    same_as("tcp", 2, "seed", &args, ROMIO);
    let s = serve_as(ferry(), "tcp", &[], &[]);
    let url = format!("ferry+{}", s.url("bad-cache"));
    let cmd = argv("seed", &url, &["4096", "1", "wr", "ferry_read_cache=lots"]);
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let out = run_mpi(mpirun(2, Io::Ferry, &cmd));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a bad ferry_read_cache opened: {err}"
    );
    assert!(
        err.contains("ferry_read_cache") && err.contains("64M"),
        "no clear message: {err}"
    );
}

/// Views and memory types of every constructor (subarray, darray, indexed, struct,
/// dup(hvector), indexed_block, hindexed_block; vector memory, a negative lower bound, a
/// named type with a hole): the file equals OMPIO's with fcoll `individual`. (ROMIO 3.2.1
/// in Open MPI 4.1 also fails on the negative lower bound and on MPI_SHORT_INT.)
fn views(driver: &str, np: u32) {
    let ran = same_as(driver, np, "views", &[], OMPIO_INDIVIDUAL);
    assert!(
        ran.stdout.contains("the user error handler was called"),
        "no user error handler call: {}",
        ran.stdout
    );
}

#[test]
fn views_of_every_constructor_np2_tcp() {
    views("tcp", 2);
}

#[test]
fn views_of_every_constructor_np4_ofi_shm() {
    views("ofi+shm", 4);
}

/// mpi4py's `MPI.File` (Set_view + Write_at_all / Read_at_all, file pointers, non-blocking
/// calls, the view and property getters): the file equals ROMIO's.
#[test]
fn mpi4py_np2_tcp() {
    same_as("tcp", 2, "mpi4py_views.py", &[], ROMIO);
}

/// h5py with driver='mpio' (collective hyperslab writes and reads of a 2-D dataset): the
/// file equals ROMIO's (h5py does not stamp times), and the local tools read it.
fn h5py(driver: &str, np: u32) {
    let ran = same_as(driver, np, "h5py_grid.py", &[], ROMIO);
    let got = &ran.file;
    let mut check = Command::new(&program("h5py_grid.py")[0]);
    check.args([
        "-c",
        "import sys, h5py, numpy as np; d = h5py.File(sys.argv[1], 'r')['grid'][...]; \
         assert (d == np.arange(d.size, dtype='i4').reshape(d.shape)).all(); print(d.shape)",
    ]);
    check.arg(got);
    let out = must(run(check), "h5py (serial) reading the file");
    let rows = 8 * np;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("({rows}, 16)")
    );
    must(run(h5dump(got)), "h5dump");
}

fn h5dump(file: &Path) -> Command {
    let mut c = Command::new("h5dump");
    c.args(["-d", "grid"]).arg(file);
    c
}

#[test]
fn h5py_np2_tcp() {
    h5py("tcp", 2);
}

#[test]
fn h5py_np4_ofi_shm() {
    h5py("ofi+shm", 4);
}

/// A C HDF5 program (a strided column-block hyperslab written collectively, a row block
/// read back): h5dump shows the same dataset as for ROMIO's file. (HDF5 stamps objects
/// with their creation time, so the files themselves differ from run to run.)
#[test]
fn hdf5_c_np4_ofi_shm() {
    let ran = through_ferry("ofi+shm", 4, "hdf5_grid", &[]);
    let got = &ran.file;
    let want = reference(4, ROMIO, "hdf5_grid", &[]);
    let data = |f: &Path| {
        let out = must(run(h5dump(f)), "h5dump");
        // The first line names the file.
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1)
            .collect::<Vec<_>>()
            .join("\n")
    };
    let (g, w) = (data(got), data(&want.path));
    assert!(g.contains("(15,0): 15000, 15001"), "h5dump shows: {g}");
    assert_eq!(g, w, "h5dump shows other data than for ROMIO's file");
}

/// PnetCDF (put_vara_all of row blocks, then get_vara_all of column blocks after a
/// reopen): the file equals ROMIO's and ncmpidump reads it.
#[test]
fn pnetcdf_np4_tcp() {
    let ran = same_as("tcp", 4, "pnetcdf_grid", &[], ROMIO);
    let got = &ran.file;
    let mut dump = Command::new("ncmpidump");
    dump.arg(got);
    let out = must(run(dump), "ncmpidump");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("int grid(y, x)") && text.contains("1500, 1501, 1502"),
        "ncmpidump shows: {text}"
    );
}

/// Bad input and what is not supported, each an MPI error of the right class whose string
/// is ferry's message (a bad token, a path outside the roots, overlapping pieces with
/// nothing written, a negative displacement, atomic mode, shared file pointers, another
/// data representation); the hint ferry_mode=independent; MPI_File_delete and
/// MPI_MODE_DELETE_ON_CLOSE remove the file on the server.
#[test]
fn errors_np2_tcp() {
    let ran = through_ferry("tcp", 2, "errors.py", &[]);
    assert!(!ran.file.exists(), "MPI_File_delete left the file");
}

/// Runs `fault FILE MODE [pipelined]` on 3 ranks (the last one fails the collective write)
/// and checks that rank 0's write (or, pipelined, its next sync) failed with MPI_ERR_OTHER
/// in bounded time and that the same server serves the next job; returns what the ranks
/// printed.
fn rank_lost(mode: &str, pipelined: bool) -> String {
    let s = serve_as(ferry(), "tcp", &[], &[]);
    let url = format!("ferry+{}", s.url("fault"));
    let mut cmd = mpirun(3, Io::Ferry, &[]);
    // Without it mpirun ends the whole job when a rank dies.
    cmd.arg("--enable-recovery").args(argv(
        "fault",
        &url,
        &[mode, if pipelined { "pipelined" } else { "off" }],
    ));
    let start = std::time::Instant::now();
    let out = run_mpi(cmd);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("fault: ok"),
        "rank 0 saw no error: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("(MPI_ERR_OTHER)"),
        "not MPI_ERR_OTHER: {text}"
    );
    // Far below the server's collective_timeout (120 s), which would otherwise end it.
    assert!(start.elapsed() < std::time::Duration::from_secs(30));
    let url = format!("ferry+{}", s.url("after"));
    let cmd = argv("seed", &url, &["4096"]);
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    must(run_mpi(mpirun(2, Io::Ferry, &cmd)), "seed after the fault");
    text
}

/// A rank killed (SIGKILL) before a collective write: the other ranks' call fails with an
/// MPI error at once (the server sees the connection end), and the server goes on serving.
#[test]
fn rank_killed_mid_collective_np3_tcp() {
    let text = rank_lost("kill", false);
    assert!(text.contains("write_at_all returned"), "{text}");
}

/// The same with write pipelining on (the default): the write returns at once, and the
/// next `MPI_File_sync` reports the lost rank with MPI_ERR_OTHER in bounded time.
#[test]
fn rank_killed_mid_collective_pipelined_np3_tcp() {
    let text = rank_lost("kill", true);
    assert!(text.contains("returned class"), "{text}");
}

/// A rank whose memory type cannot be decoded (it fails with MPI_ERR_TYPE before reaching
/// the server) leaves the session, so the others' collective write fails at once instead
/// of waiting for it while it waits for them in MPI_Barrier.
#[test]
fn rank_failing_its_memory_type_np3_tcp() {
    let text = rank_lost("type", false);
    assert!(text.contains("(MPI_ERR_TYPE)"), "rank 2: {text}");
}

/// `ferry bench cio --quick --json` at one tiny point (4,000 ints, 2 ranks, one call per
/// configuration, about 15 s): a row per configuration and direction, each measured or
/// saying why not, ferry's rows measured with no bytes resent between ranks, ROMIO
/// two-phase's resent size the other rank's half, the summary keys the issue names and a
/// verdict per goal; CSV and JSON written with --out.
#[test]
fn bench_cio_quick_shape() {
    if Command::new("mpirun").arg("--version").output().is_err() {
        eprintln!("skipped: mpirun is not installed (scripts/install-deps.sh)");
        return;
    }
    let out_dir = scratch("bench-cio");
    let mut c = ferry();
    c.args(["bench", "cio", "--quick", "--json"])
        .args([
            "--counts", "4000", "--np", "2", "--iters", "1", "--budget", "0",
        ])
        .arg("--mpiio-lib")
        .arg(&mpi().lib)
        .arg("--out")
        .arg(&out_dir)
        .arg("--dir")
        .arg(&out_dir);
    let out = must(run_mpi(c), "ferry bench cio");
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {text}"));
    assert_eq!(v["bench"], "cio");
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 14, "7 configurations × write and read: {v}");
    for r in rows {
        assert!(
            r["ms"].as_f64().is_some() || r["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{r}"
        );
        assert_eq!(r["bytes"].as_u64(), Some(16_000), "{r}");
    }
    let row = |io: &str, variant: &str, driver: &str, op: &str| {
        rows.iter()
            .find(|r| {
                r["io"] == io && r["variant"] == variant && r["driver"] == driver && r["op"] == op
            })
            .unwrap_or_else(|| panic!("no {io} {variant} {driver} {op} row: {v}"))
    };
    for driver in ["tcp", "ofi+shm"] {
        for op in ["write", "read"] {
            let r = row("ferry", "ecio", driver, op);
            assert!(r["ms"].as_f64().is_some_and(|ms| ms > 0.0), "{r}");
            assert!(r["server_cpu_ms"].as_f64().is_some(), "{r}");
            assert!(r["rank_cpu_ms"].as_f64().is_some(), "{r}");
            assert_eq!(r["resent_bytes"].as_u64(), Some(0), "{r}");
            assert_eq!(r["client"], "pipeline", "{r}");
        }
    }
    assert_eq!(row("romio", "cb-off", "local", "read")["client"], "", "{v}");
    assert_eq!(
        row("romio", "two-phase", "local", "write")["resent_bytes"].as_u64(),
        Some(8_000)
    );
    let s = &v["summary"];
    for k in [
        "ecio_vs_best_mpiio_write_np2_1m",
        "ecio_vs_best_mpiio_read_np2_1m",
        "ecio_vs_best_mpiio_write_np4_1m",
        "ecio_vs_best_mpiio_read_np4_1m",
        "ecio_vs_twophase_write_np2_1m",
    ] {
        // Not measured at this count: null, but present.
        assert!(s[k].is_null(), "{k}: {s}");
    }
    assert!(s["ecio_min_vs_best_mpiio"].as_f64().is_some(), "{s}");
    let targets = v["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 6, "{v}");
    let csv = std::fs::read_to_string(out_dir.join("cio.csv")).expect("cio.csv");
    assert!(
        csv.starts_with("io,variant,driver,client,np,count,op,bytes,iters,ms,"),
        "{csv}"
    );
    assert_eq!(csv.lines().count(), 15, "{csv}");
    assert!(out_dir.join("cio.json").is_file());
    let _ = std::fs::remove_dir_all(&out_dir);
}
