//! `cargo xtask test`: the single command CI runs — fmt, clippy (default and `cuda` builds),
//! tidy, the default model fetch the real-model tests need, the CUDA compile check, then
//! every test of the workspace.

use clap::Args;

use crate::cmd::{cargo, run as run_cmd, workspace_root};
use crate::{cuda_check, fetch_model, tidy};

/// `engine/cuda` turns on the `cuda` feature of every crate below it, for the CUDA clippy pass.
const CUDA_FEATURES: &str = "engine/cuda";

#[derive(Debug, Args)]
pub struct TestArgs {
    /// Skip fmt and clippy (handy while iterating; CI never passes this).
    #[arg(long)]
    pub no_lint: bool,
    /// Skip `cuda-check` (handy while iterating; CI never passes this).
    #[arg(long)]
    pub no_cuda_check: bool,
}

pub fn run(args: &TestArgs) -> anyhow::Result<()> {
    let root = workspace_root();
    if !args.no_lint {
        run_cmd(cargo().args(["fmt", "--all", "--", "--check"]))?;
        run_cmd(cargo().args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]))?;
        run_cmd(cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--features",
            CUDA_FEATURES,
            "--",
            "-D",
            "warnings",
        ]))?;
    }
    tidy::check(&root)?;
    eprintln!("tidy: ok");
    // The real-model tests read the converted default model; fetching is idempotent.
    fetch_model::run(&fetch_model::FetchModelArgs { dir: None, dtype: fetch_model::Dtype::F32 })?;
    if !args.no_cuda_check {
        cuda_check::run(&cuda_check::CudaCheckArgs { arch: "sm_80,sm_90".to_owned(), filter: None })?;
    }
    run_cmd(cargo().args(["test", "--workspace"]))?;
    Ok(())
}
