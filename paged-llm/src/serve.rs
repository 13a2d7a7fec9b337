//! `paged-llm serve`: the OpenAI-compatible server (crate `server`) on the default model
//! (fetched if missing) or `--model PATH` (or a name `fetch-model` knows: `smollm2`,
//! `gemma3-270m`, fetched if missing), until Ctrl-C / SIGTERM.

use clap::Args;
use server::cli::ServeArgs;

use crate::start::StartEngine;

#[derive(Debug, Args)]
pub struct ServeCmd {
    #[command(flatten)]
    pub serve: ServeArgs,
}

pub fn run(args: &ServeCmd) -> anyhow::Result<()> {
    let engine = args.serve.knobs.start_engine_with(false, args.serve.engine_config())?;
    server::run_until_signal(engine, &args.serve).map_err(|e| anyhow::anyhow!("{e}"))
}
