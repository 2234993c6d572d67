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
use std::sync::OnceLock;

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
        for prog in ["seed", "views"] {
            let mut cc = Command::new("mpicc");
            cc.args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
                .arg(bin.join(prog))
                .arg(workspace().join(format!("c/mpiio/tests/{prog}.c")));
            must(run(cc), "mpicc");
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
            c.arg("-x")
                .arg(format!("LD_PRELOAD={}", mpi().lib.display()))
                .args(["-x", &format!("FERRY_TOKEN={TOKEN}")])
                .args(["-x", "FERRY_MPIIO_VERBOSE=1"]);
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

fn bin(prog: &str) -> String {
    mpi().bin.join(prog).display().to_string()
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

/// The file a program writes through Open MPI's MPI-IO (`mca`) on a local path.
fn reference(np: u32, mca: &[(&str, &str)], prog: &str, args: &[&str]) -> Vec<u8> {
    let dir = scratch("mpiio-ref");
    let path = dir.join("ref.bin").display().to_string();
    let mut argv = vec![bin(prog), path.clone()];
    argv.extend(args.iter().map(|a| a.to_string()));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    must(run(mpirun(np, Io::Local(mca), &argv)), prog);
    let bytes = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_dir_all(dir);
    bytes
}

/// Runs `prog FILE ARGS` on `np` ranks against a ferry server on `driver` and returns the
/// file on the server's disk.
fn through_ferry(driver: &str, np: u32, prog: &str, args: &[&str]) -> Vec<u8> {
    let s = serve_as(ferry(), driver, &[], &[]);
    let url = format!("ferry+{}", s.url(&format!("{prog}.bin")));
    let mut argv = vec![bin(prog), url];
    argv.extend(args.iter().map(|a| a.to_string()));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let out = must(run(mpirun(np, Io::Ferry, &argv)), prog);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(": ok"),
        "{prog} did not say ok: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    std::fs::read(s.root.join(format!("{prog}.bin"))).unwrap()
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
    let count = seed_count().to_string();
    let got = through_ferry(driver, np, "seed", &[&count]);
    let want = reference(np, ROMIO, "seed", &[&count]);
    same_file(&got, &want, &format!("seed np {np} on {driver}"));
}

#[test]
fn seed_pattern_np2_tcp() {
    seed("tcp", 2);
}

#[test]
fn seed_pattern_np4_ofi_shm() {
    seed("ofi+shm", 4);
}

/// Views and memory types of every constructor (subarray, darray, indexed, struct,
/// dup(hvector), indexed_block, hindexed_block; vector memory, a negative lower bound, a
/// named type with a hole): the file equals OMPIO's with fcoll `individual`. (ROMIO 3.2.1
/// in Open MPI 4.1 also fails on the negative lower bound and on MPI_SHORT_INT.)
fn views(driver: &str, np: u32) {
    let got = through_ferry(driver, np, "views", &[]);
    let want = reference(np, OMPIO_INDIVIDUAL, "views", &[]);
    same_file(&got, &want, &format!("views np {np} on {driver}"));
}

#[test]
fn views_of_every_constructor_np2_tcp() {
    views("tcp", 2);
}

#[test]
fn views_of_every_constructor_np4_ofi_shm() {
    views("ofi+shm", 4);
}
