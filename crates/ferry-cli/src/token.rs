//! `ferry token new`: a fresh random token for `ferry serve --token-file` and clients'
//! `FERRY_TOKEN`; `ferry keygen`: a client key pair for a server's authorized_keys.

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

#[derive(Args)]
pub struct KeygenArgs {
    /// Where the private key goes (mode 600; never over an existing file); the public key
    /// line goes to PATH.pub [default: ~/.config/ferry/id_ed25519, which `ferry cp` uses
    /// when it has no token].
    #[arg(short = 'f', value_name = "PATH")]
    file: Option<PathBuf>,
    /// The comment at the end of the public key line [default: USER@HOST].
    #[arg(short = 'C', value_name = "COMMENT")]
    comment: Option<String>,
}

/// Runs `ferry keygen`: makes an Ed25519 key pair and says where its parts went and the
/// public key's fingerprint.
pub fn keygen(a: KeygenArgs) -> Result<(), XferError> {
    let path = a.file.unwrap_or_else(ferry_service::keys::default_identity);
    let comment = a.comment.unwrap_or_else(|| {
        let user = std::env::var("USER").unwrap_or_else(|_| "ferry".into());
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".into());
        format!("{user}@{host}")
    });
    let public = ferry_service::keys::generate(&path, &comment)?;
    let pub_path = ferry_service::keys::public_path(&path);
    println!(
        "private key: {}\npublic key:  {}\nfingerprint: {}\nOn the server, add the line of {} to the file `authorized_keys = \"...\"` names (ferry serve --authorized-keys), optionally after roots=NAME,... and ro.",
        path.display(),
        pub_path.display(),
        ferry_service::keys::fingerprint(&public),
        pub_path.display()
    );
    Ok(())
}
