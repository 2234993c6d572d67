//! Shell completions (`ferry completions SHELL`) and man pages (`ferry manpages DIR`, run by
//! `make install`), generated from the command definition so they never drift from
//! `--help`.

use std::path::Path;

use ferry_xfer::XferError;

/// Prints the completion script of the command `cmd` for `shell` on stdout.
pub fn completions(mut cmd: clap::Command, shell: clap_complete::Shell) {
    clap_complete::generate(shell, &mut cmd, "ferry", &mut std::io::stdout());
}

/// Writes `ferry.1` for the command `root` and a page per visible subcommand
/// (`ferry-cp.1`, `ferry-bench-cp.1`, ...) into `dir`, which is created if missing.
pub fn manpages(root: clap::Command, dir: &Path) -> Result<(), XferError> {
    std::fs::create_dir_all(dir).map_err(|e| XferError::io(dir.display(), &e))?;
    write_page(&root, "ferry", dir)?;
    for sub in root.get_subcommands().filter(|c| !c.is_hide_set()) {
        let name = format!("ferry-{}", sub.get_name());
        write_page(sub, &name, dir)?;
        for leaf in sub.get_subcommands().filter(|c| !c.is_hide_set()) {
            write_page(leaf, &format!("{name}-{}", leaf.get_name()), dir)?;
        }
    }
    Ok(())
}

fn write_page(cmd: &clap::Command, name: &str, dir: &Path) -> Result<(), XferError> {
    let path = dir.join(format!("{name}.1"));
    let mut page = Vec::new();
    // NAME shows the page's name (ferry-cp), SYNOPSIS the command as typed (ferry cp).
    let cmd = cmd
        .clone()
        .display_name(name)
        .bin_name(name.replace('-', " "));
    let man = clap_mangen::Man::new(cmd)
        .title(name.to_uppercase())
        .section("1")
        .source(format!("ferry {}", env!("CARGO_PKG_VERSION")))
        .manual("ferry manual");
    man.render(&mut page)
        .and_then(|()| std::fs::write(&path, &page))
        .map_err(|e| XferError::io(path.display(), &e))
}
