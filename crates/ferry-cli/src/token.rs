//! `ferry token new`: a fresh random token for `ferry serve --token-file` and clients'
//! `FERRY_TOKEN`.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use ferry_xfer::XferError;

#[derive(Subcommand)]
pub enum TokenCmd {
    /// Print a new random token (48 hex digits), or write it to a private file.
    New(NewArgs),
}

#[derive(Args)]
pub struct NewArgs {
    /// Write the token to FILE (created with mode 600; an existing file is not replaced)
    /// instead of printing it.
    #[arg(long, value_name = "FILE")]
    file: Option<PathBuf>,
}

/// Runs `ferry token ...`.
pub fn run(cmd: TokenCmd) -> Result<(), XferError> {
    let TokenCmd::New(a) = cmd;
    let token = ferry_service::auth::new_token()?;
    match a.file {
        None => println!("{token}"),
        Some(path) => {
            let what = || format!("token file {}", path.display());
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| XferError::io(what(), &e))?;
            writeln!(f, "{token}")
                .and_then(|()| f.sync_all())
                .map_err(|e| XferError::io(what(), &e))?;
        }
    }
    Ok(())
}
