//! Diagnostics for people and for log files: how much (`-q`, `-v`, `-vv`, or `FERRY_LOG` /
//! `RUST_LOG` filters), in plain text without colour unless stderr is a terminal (and
//! `NO_COLOR` is unset), without Rust module paths unless `-vv` asks for them, and never
//! drawn over a progress bar: a line is written with the bar taken off the screen and
//! redrawn under it.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// The progress bar on screen, if any: log lines are written around it.
static BAR: Mutex<Option<indicatif::ProgressBar>> = Mutex::new(None);

/// Installs the log subscriber. `quiet` keeps errors only; each `verbose` step adds a level
/// (debug, then trace with module paths). Without either, `FERRY_LOG` or `RUST_LOG` (an
/// `EnvFilter` such as `warn` or `ferry_xfer=debug`) decides, else info.
pub fn init(verbose: u8, quiet: bool) {
    let filter = match (quiet, verbose) {
        (true, _) => EnvFilter::new("error"),
        (false, 0) => EnvFilter::try_from_env("FERRY_LOG")
            .or_else(|_| EnvFilter::try_from_default_env())
            .unwrap_or_else(|_| EnvFilter::new("info")),
        (false, 1) => EnvFilter::new("debug"),
        (false, _) => EnvFilter::new("trace"),
    };
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_target(verbose >= 2)
        .with_writer(AroundBar)
        .init();
}

/// Puts `bar` on screen for log lines to go around (`None` takes it off).
pub fn show_bar(bar: Option<&indicatif::ProgressBar>) {
    *BAR.lock().unwrap_or_else(|p| p.into_inner()) = bar.cloned();
}

/// Standard error, with the progress bar (if any) suspended while a line is written.
#[derive(Clone, Copy)]
struct AroundBar;

impl Write for AroundBar {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let bar = BAR.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match bar {
            Some(b) => b.suspend(|| std::io::stderr().write(buf)),
            None => std::io::stderr().write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> MakeWriter<'a> for AroundBar {
    type Writer = AroundBar;

    fn make_writer(&'a self) -> AroundBar {
        AroundBar
    }
}
