//! `cargo xtask test`: the single command CI runs — fmt, clippy, tidy, then every test.

use clap::Args;

use crate::cmd::{cargo, run as run_cmd, workspace_root};
use crate::tidy;

#[derive(Debug, Args)]
pub struct TestArgs {
    /// Skip fmt and clippy (handy while iterating; CI never passes this).
    #[arg(long)]
    pub no_lint: bool,
}

pub fn run(args: &TestArgs) -> anyhow::Result<()> {
    let root = workspace_root();
    if !args.no_lint {
        run_cmd(cargo().args(["fmt", "--all", "--", "--check"]))?;
        run_cmd(cargo().args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]))?;
    }
    tidy::check(&root)?;
    eprintln!("tidy: ok");
    run_cmd(cargo().args(["test", "--workspace"]))?;
    Ok(())
}
