//! `paged-llm bench throughput|latency|serve`: vLLM's three benchmark modes (offline
//! throughput, the latency of one batch, and a load generator against a running server).

mod latency;
mod serve;
mod throughput;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Offline throughput (as `vllm bench throughput`): random or JSONL prompts, all at once.
    Throughput(Box<throughput::ThroughputArgs>),
    /// The latency of one batch end to end (as `vllm bench latency`): warm-up rounds, then
    /// timed rounds; mean and percentiles.
    Latency(Box<latency::LatencyArgs>),
    /// A load generator against a running server (as `vllm bench serve`): Poisson arrivals at
    /// --request-rate, at most --max-concurrency in flight; TTFT, TPOT, ITL and E2E percentiles.
    Serve(Box<serve::ServeBenchArgs>),
}

pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Throughput(args) => throughput::run(&args),
        BenchCommand::Latency(args) => latency::run(&args),
        BenchCommand::Serve(args) => serve::run(&args),
    }
}
