//! The `server` binary: loads a model folder, starts the engine on its own thread and serves
//! the OpenAI-compatible API until SIGINT/SIGTERM (`cargo xtask serve` is the same server
//! with the default model fetched when none is named).

use clap::Parser;
use server::cli::ServeArgs;

#[derive(Debug, Parser)]
#[command(name = "server", about = "OpenAI-compatible server over the paged-attention engine")]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
}

fn main() {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    if let Err(e) = run(&cli.serve) {
        eprintln!("server: {e}");
        std::process::exit(1);
    }
}

fn run(args: &ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    let dir = args.knobs.model.clone().ok_or("--model DIR is required (a Hugging Face model folder)")?;
    let engine = engine::Engine::new(&dir, args.engine_config())?;
    server::run_until_signal(engine, args)
}
