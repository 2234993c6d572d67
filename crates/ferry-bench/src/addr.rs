//! Which drivers a bench runs, and where their peers listen.

use anyhow::{bail, Context, Result};
use ferry_fabric::Address;

/// The address a driver's peer listens on; `n` keeps shm names unique within the run.
pub fn address(driver: &str, n: usize) -> Result<Address> {
    let url = match driver {
        "tcp" => "tcp://127.0.0.1:0".to_string(),
        "ofi+shm" => format!("ofi+shm://ferry-bench-{}-{n}", std::process::id()),
        d if d.starts_with("ofi+") => format!("{d}://127.0.0.1:0"),
        d => bail!("unknown driver {d:?}: expected tcp, ofi+tcp, ofi+shm or ofi+<provider>"),
    };
    url.parse().with_context(|| format!("driver {driver:?}"))
}

/// The drivers asked for, checked and without repeats, in the order given.
pub fn drivers(asked: &[String]) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for d in asked {
        address(d, 0)?;
        if !out.contains(d) {
            out.push(d.clone());
        }
    }
    Ok(out)
}
