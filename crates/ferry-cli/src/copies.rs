//! `ferry copies`: the server-to-server copies a server is making for you, and `--abort` to
//! stop one (its own `ferry cp` then ends with exit 1, saying so).

use clap::Args;
use ferry_xfer::client::Client;
use ferry_xfer::proto::Msg;
use ferry_xfer::XferError;

use crate::units::human_size;
use crate::xfer::{remote_of, Remote};

#[derive(Args)]
pub struct CopiesArgs {
    /// Stop the copy with this id (from the listing); what the destination verified stays
    /// there, and the same `ferry cp` resumes it.
    #[arg(long, value_name = "ID")]
    abort: Option<u64>,
    /// One JSON object per copy on stdout: id, path, dest, dest_path, done and total
    /// (bytes), secs (since it started).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: Remote,
    /// The source server, as `ferry ls` names it (HOST, HOST: or ferry://HOST[:PORT]): the
    /// one `ferry cp HOST:… OTHER:…` asked to copy. Only copies asked for with your
    /// credential are shown.
    server: String,
}

/// Runs `ferry copies`.
pub fn copies(a: CopiesArgs) -> Result<(), XferError> {
    // `HOST` alone is `HOST:`, as `ferry ls` takes it.
    let target = if a.server.contains(':') {
        a.server.clone()
    } else {
        format!("{}:", a.server)
    };
    let r = remote_of(&target, &a.remote.driver)?;
    let mut c = Client::connect(&r.addr, &a.remote.options()?)?;
    if let Some(id) = a.abort {
        c.abort_copy(id)?;
        if !a.json {
            println!("copy {id} aborted");
        }
    } else {
        for m in c.copies()? {
            show(&m, a.json);
        }
    }
    c.bye();
    Ok(())
}

fn show(m: &Msg, json: bool) {
    let Msg::Copy {
        id,
        done,
        total,
        secs,
        path,
        dest,
        dest_path,
    } = m
    else {
        return;
    };
    if json {
        println!(
            "{}",
            serde_json::json!({"id": id, "path": path, "dest": dest, "dest_path": dest_path,
                "done": done, "total": total, "secs": secs})
        );
    } else {
        println!(
            "{id:>4}  {} / {}  {secs:>5}s  {path} -> {dest} {dest_path}",
            human_size(*done),
            human_size(*total)
        );
    }
}
