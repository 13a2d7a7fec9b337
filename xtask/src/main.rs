//! `cargo xtask …`: the project's task runner (tests, benchmarks, checks) and the door to the
//! user program from a checkout (`run`, `serve`, … forward to `paged-llm` built in release).
//!
//! Everything a developer or CI runs goes through here so that the README's commands
//! stay two lines long. Each subcommand lives in its own module. xtask depends on none of the
//! engine's crates: it builds in seconds, and the engine is compiled once, in release, for
//! what users run.

mod bench;
mod build_sharing;
mod clippy_build;
mod cmd;
mod cuda_check;
mod glibc;
mod gpu_check;
mod layering;
mod llamacpp;
mod module_cycles;
mod paged_llm;
mod python;
mod test;
mod tidy;

use std::ffi::OsString;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "xtask", about = "Project tasks: test, bench, run, fetch-model, …")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// fmt check, clippy -D warnings, tidy, and every test of the workspace (what CI runs).
    Test(test::TestArgs),
    /// Run the benchmarks and write target/bench-report/{summary.json,report.md}.
    Bench(bench::BenchArgs),
    /// `paged-llm plan …` (release build): the KV cache calculator.
    #[command(disable_help_flag = true)]
    Plan(Forwarded),
    /// `paged-llm run …` (release build): the default model, fetched if missing; a batch of
    /// varied prompts streamed; a summary.
    #[command(disable_help_flag = true)]
    Run(Forwarded),
    /// `paged-llm serve …` (release build): the OpenAI-compatible server.
    #[command(disable_help_flag = true)]
    Serve(Forwarded),
    /// `paged-llm bench throughput …` (release build): offline throughput.
    #[command(disable_help_flag = true)]
    Throughput(Forwarded),
    /// `paged-llm perplexity …` (release build): perplexity and KL divergence.
    #[command(disable_help_flag = true)]
    Perplexity(Forwarded),
    /// Build the Python package's abi3 wheel (release) with maturin into target/wheels.
    Wheel(python::WheelArgs),
    /// Build and install the Python package into target/venv-python and run its pytest suite.
    Pytest,
    /// Only the tidy checks (every .rs file starts with `//!`, no `#[ignore]`).
    Tidy,
    /// `paged-llm fetch-model …` (release build): SmolLM2 or Gemma 3 into target/models.
    #[command(disable_help_flag = true)]
    FetchModel(Forwarded),
    /// `paged-llm make-model …` (release build), its Python the checkout's llama.cpp venv.
    #[command(disable_help_flag = true)]
    MakeModel(Forwarded),
    /// Print the python of target/venv-llamacpp (llama.cpp for this CPU), making it if needed.
    #[command(hide = true)]
    LlamacppPython,
    /// Compile every CUDA kernel for sm_80/sm_90 with NVRTC (no GPU needed); fail on errors or spills.
    CudaCheck(cuda_check::CudaCheckArgs),
    /// Build target/gpu-bundle (GPU check binary + sm_90 cubins) and print the device run command.
    GpuCheck(gpu_check::GpuCheckArgs),
}

/// A subcommand's arguments, passed to `paged-llm` as they are (`--help` included).
#[derive(Debug, Args)]
struct Forwarded {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<OsString>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Test(args) => test::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Plan(f) => paged_llm::forward(&["plan"], &f.args),
        Command::Run(f) => paged_llm::forward(&["run"], &f.args),
        Command::Serve(f) => paged_llm::forward(&["serve"], &f.args),
        Command::Throughput(f) => paged_llm::forward(&["bench", "throughput"], &f.args),
        Command::Perplexity(f) => paged_llm::forward(&["perplexity"], &f.args),
        Command::Wheel(args) => python::wheel(&args),
        Command::Pytest => python::test(),
        Command::Tidy => tidy::check(&cmd::workspace_root()),
        Command::FetchModel(f) => paged_llm::forward(&["fetch-model"], &f.args),
        Command::MakeModel(f) => paged_llm::forward(&["make-model"], &f.args),
        Command::LlamacppPython => llamacpp::print_python(),
        Command::CudaCheck(args) => cuda_check::run(&args),
        Command::GpuCheck(args) => gpu_check::run(&args),
    }
}
