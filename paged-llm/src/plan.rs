//! `paged-llm plan`: the KV cache calculator. Given a model shape, a memory budget, a block
//! size and a request trace, simulates the paged scheduler (and the contiguous-reservation
//! baselines on the same memory) and prints max concurrency, KV utilization, preemptions and a
//! time series.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use scheduler::PreemptionMode;
use sim::{ClusterPlan, Comparison, CostModel, Hardware, ModelShape, SimSetup, Trace, TraceShape, compare};

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Model shape preset: opt-13b, llama2-7b, smollm2-135m (the flags below override parts).
    #[arg(long, default_value = "opt-13b")]
    model: String,
    #[arg(long)]
    layers: Option<usize>,
    #[arg(long)]
    kv_heads: Option<usize>,
    #[arg(long)]
    head_dim: Option<usize>,
    /// Parameter count, e.g. 7e9.
    #[arg(long)]
    params: Option<f64>,
    /// Bytes per weight and KV element (2 for f16/bf16).
    #[arg(long)]
    dtype_bytes: Option<usize>,
    /// The KV cache's type when it is not the weights' (vLLM's names: int8, fp8, bf16, …;
    /// auto is the engine's, bf16).
    #[arg(long, value_parser = parse_kv_dtype)]
    kv_cache_dtype: Option<engine::DType>,
    /// Layers that attend over a sliding window (0: none; the preset's by default).
    #[arg(long)]
    sliding_layers: Option<usize>,
    /// Tokens of that window.
    #[arg(long)]
    sliding_window: Option<usize>,
    /// Accelerator for the cost model: a100-40gb, h200.
    #[arg(long, default_value = "a100-40gb")]
    hardware: String,
    /// KV cache memory in GiB (default: the accelerator's memory × --gpu-memory-utilization
    /// minus the weights).
    #[arg(long)]
    kv_memory_gib: Option<f64>,
    /// KV cache size in token slots (overrides --kv-memory-gib).
    #[arg(long)]
    kv_tokens: Option<usize>,
    #[arg(long, default_value_t = 0.9)]
    gpu_memory_utilization: f64,
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// `sharegpt`, `alpaca`, or a JSONL file of {"input": n, "output": m} lines.
    #[arg(long, default_value = "sharegpt")]
    trace: String,
    /// Requests drawn for a synthetic trace.
    #[arg(long, default_value_t = 1000)]
    num_requests: usize,
    /// Poisson arrival rate in requests per second (`inf`: all at once).
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, default_value_t = 2048)]
    max_model_len: usize,
    #[arg(long, default_value_t = 256)]
    max_num_seqs: usize,
    #[arg(long, default_value_t = 2048)]
    max_num_batched_tokens: usize,
    #[arg(long, default_value = "recompute", value_parser = ["recompute", "swap"])]
    preemption: String,
    /// Host swap space in GiB (swap mode).
    #[arg(long, default_value_t = 4.0)]
    swap_gib: f64,
    #[arg(long, default_value_t = 0.01)]
    watermark: f64,
    /// Rows of the printed time series.
    #[arg(long, default_value_t = 24)]
    points: usize,
    /// Write every step of every system as CSV here.
    #[arg(long)]
    series_out: Option<PathBuf>,
    /// Print the summary as JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Cluster mode: the request rate (requests/s) a deployment of replicas must serve; prints
    /// how many replicas of this setup sustain it (each replica's capacity from the simulator,
    /// the trace's requests replayed as Poisson arrivals at each rate tried).
    #[arg(long)]
    target_rate: Option<f64>,
    /// Cluster mode's latency bound: mean normalized latency (end-to-end seconds per output
    /// token) a replica may reach at its share of the target rate.
    #[arg(long, default_value_t = 0.1)]
    max_normalized_latency: f64,
}

const GIB: f64 = (1u64 << 30) as f64;

pub fn run(args: &PlanArgs) -> anyhow::Result<()> {
    let model = model_shape(args)?;
    let hardware = Hardware::by_name(&args.hardware).with_context(|| {
        format!("unknown hardware {:?} ({})", args.hardware, names(Hardware::PRESETS.map(|h| h.name)))
    })?;
    let kv_tokens = match (args.kv_tokens, args.kv_memory_gib) {
        (Some(tokens), _) => tokens,
        (None, Some(gib)) => model.kv_token_slots(gib * GIB),
        (None, None) => model.kv_tokens_on(&hardware, args.gpu_memory_utilization).with_context(|| {
            format!(
                "{} weights ({:.1} GB) do not fit {} at this utilization",
                model.name,
                model.weight_bytes() / 1e9,
                hardware.name
            )
        })?,
    };
    if kv_tokens < args.block_size || args.block_size == 0 {
        bail!("KV memory holds {kv_tokens} tokens: not even one block of {}", args.block_size);
    }
    let preemption = if args.preemption == "swap" { PreemptionMode::Swap } else { PreemptionMode::Recompute };
    let setup = SimSetup {
        capacity_tokens: kv_tokens,
        block_size: args.block_size,
        max_model_len: args.max_model_len,
        max_num_seqs: args.max_num_seqs,
        max_num_batched_tokens: args.max_num_batched_tokens,
        watermark: args.watermark,
        preemption,
        swap_tokens: if preemption == PreemptionMode::Swap {
            model.kv_token_slots(args.swap_gib * GIB)
        } else {
            0
        },
        baseline_placement: sim::Placement::Buddy,
        kv_groups: sim::KvGroups::of(&model),
    };
    let trace = match TraceShape::by_name(&args.trace) {
        Some(shape) => Trace::synthetic(shape, args.num_requests, args.rate, args.max_model_len, args.seed),
        None => Trace::from_jsonl_file(args.trace.as_ref(), args.rate, args.max_model_len, args.seed)
            .with_context(|| {
                format!("trace {:?} is neither sharegpt, alpaca nor a readable JSONL file", args.trace)
            })?,
    };
    let cost = CostModel::new(model, hardware);
    let result = compare(&trace, &setup, &cost)?;
    let cluster = match args.target_rate {
        Some(target) => {
            // The trace's requests replayed at each rate the search tries.
            let at = |rate| trace.at_rate(rate, args.seed);
            Some(sim::plan_cluster(&at, &setup, &cost, target, args.max_normalized_latency)?)
        }
        None => None,
    };
    if let Some(path) = &args.series_out {
        std::fs::write(path, series_csv(&result)).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        let summary = serde_json::json!({
            "model": model.name,
            "kv_bytes_per_token": model.kv_bytes_per_token(),
            "kv_tokens": setup.usable_tokens(),
            "num_blocks": setup.num_blocks(),
            "kv_groups": setup.kv_groups.windows(),
            "paged_fit_max_len": paged_fit_max_len(&setup),
            "systems": result.all(),
            "concurrency_paged_over_oracle": result.concurrency_paged_over_oracle(),
            "cluster": cluster.as_ref().map(cluster_json),
        });
        println!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(());
    }
    print_tables(args, &model, &setup, &trace, &result);
    if let Some(plan) = &cluster {
        print_cluster(plan);
    }
    Ok(())
}

fn cluster_json(plan: &ClusterPlan) -> serde_json::Value {
    serde_json::json!({
        "target_rate": plan.target_rate,
        "max_normalized_latency_s": plan.max_normalized_latency_s,
        "replicas": plan.replicas,
        "replica_capacity_rate": plan.capacity.rate,
        "idle_normalized_latency_s": plan.capacity.idle_normalized_latency_s,
        "per_replica_rate": plan.target_rate / plan.replicas as f64,
        "per_replica_normalized_latency_s": plan.per_replica.mean_normalized_latency_s,
        "cluster_output_tokens_per_s": plan.per_replica.output_tokens_per_s * plan.replicas as f64,
    })
}

fn print_cluster(plan: &ClusterPlan) {
    let cap = &plan.capacity;
    println!(
        "\ncluster: one replica sustains {:.2} req/s within {:.3} s/token (normalized latency {:.4} s/token \
         there, {:.4} when idle)",
        cap.rate,
        plan.max_normalized_latency_s,
        cap.report.mean_normalized_latency_s,
        cap.idle_normalized_latency_s
    );
    println!(
        "{:.2} req/s needs {} replicas: each at {:.2} req/s has normalized latency {:.4} s/token, \
         {:.0} output tok/s for the cluster",
        plan.target_rate,
        plan.replicas,
        plan.target_rate / plan.replicas as f64,
        plan.per_replica.mean_normalized_latency_s,
        plan.per_replica.output_tokens_per_s * plan.replicas as f64
    );
    println!(
        "(Poisson arrivals split evenly over the replicas; prefix-cache hits across requests not counted)"
    );
}

/// Sequences of `max_model_len` tokens the paged pool holds at once (each group's blocks of
/// one such sequence: every block in a full group, the window's in a sliding one).
fn paged_fit_max_len(setup: &SimSetup) -> usize {
    setup.num_blocks() / setup.kv_groups.blocks_per_sequence(setup.max_model_len, setup.block_size).max(1)
}

/// Preset names for an error message.
fn parse_kv_dtype(s: &str) -> Result<engine::DType, String> {
    let kinds = &engine::config::KV_DTYPE;
    kinds.parse(s).ok_or_else(|| format!("one of {}", kinds.names().collect::<Vec<_>>().join(", ")))
}

fn names<const N: usize>(names: [&str; N]) -> String {
    names.join(", ")
}

fn model_shape(args: &PlanArgs) -> anyhow::Result<ModelShape> {
    let mut m = ModelShape::by_name(&args.model).with_context(|| {
        format!("unknown model {:?} ({})", args.model, names(ModelShape::PRESETS.map(|m| m.name)))
    })?;
    m.num_layers = args.layers.unwrap_or(m.num_layers);
    m.num_kv_heads = args.kv_heads.unwrap_or(m.num_kv_heads);
    m.head_dim = args.head_dim.unwrap_or(m.head_dim);
    m.num_params = args.params.unwrap_or(m.num_params);
    m.dtype_bytes = args.dtype_bytes.unwrap_or(m.dtype_bytes);
    m.kv_dtype = args.kv_cache_dtype.or(m.kv_dtype);
    m.sliding_layers = args.sliding_layers.unwrap_or(m.sliding_layers).min(m.num_layers);
    m.sliding_window = args.sliding_window.unwrap_or(m.sliding_window);
    if m.sliding_layers > 0 && m.sliding_window == 0 {
        bail!("--sliding-layers {} needs a --sliding-window", m.sliding_layers);
    }
    if m.kv_bytes_per_token() == 0 {
        bail!("model shape has zero KV bytes per token");
    }
    Ok(m)
}

/// Prints the setup, every system's summary and the paged time series.
fn print_tables(args: &PlanArgs, model: &ModelShape, setup: &SimSetup, trace: &Trace, c: &Comparison) {
    let kv_gib = setup.usable_tokens() as f64 * model.kv_bytes_per_token() as f64 / GIB;
    println!(
        "model {} ({} layers, {} KV heads × {}, KV {}): {} KiB of KV per token",
        model.name,
        model.num_layers,
        model.num_kv_heads,
        model.head_dim,
        model.kv_dtype.map_or(format!("{} B/elem", model.dtype_bytes), |d| d.name().to_owned()),
        model.kv_bytes_per_token() / 1024
    );
    println!(
        "KV memory {kv_gib:.2} GiB = {} token slots = {} blocks of {} on {}",
        setup.usable_tokens(),
        setup.num_blocks(),
        setup.block_size,
        args.hardware
    );
    let g = setup.kv_groups;
    if g.sliding_groups > 0 {
        println!(
            "KV groups: {} sliding (window {}) and {} full, {} layers a block: sequences of {} tokens that fit: {}",
            g.sliding_groups,
            g.window,
            g.full_groups,
            g.layers_per_block,
            setup.max_model_len,
            paged_fit_max_len(setup)
        );
    } else {
        println!("sequences of {} tokens that fit: {}", setup.max_model_len, paged_fit_max_len(setup));
    }
    println!(
        "trace {}: {} requests, mean input {:.1}, mean output {:.1}, {} req/s; max_model_len {}, {} preemption\n",
        args.trace,
        trace.len(),
        trace.mean_input(),
        trace.mean_output(),
        args.rate,
        setup.max_model_len,
        args.preemption
    );
    println!(
        "{:<12} {:>8} {:>8} {:>9} {:>8} {:>11} {:>9} {:>10} {:>10} {:>12}",
        "system",
        "KV util",
        "KV used",
        "mean run",
        "max run",
        "preemptions",
        "finished",
        "out tok/s",
        "makespan s",
        "norm lat s/t"
    );
    for r in c.all() {
        println!(
            "{:<12} {:>8.3} {:>8.3} {:>9.1} {:>8} {:>11} {:>9} {:>10.0} {:>10.1} {:>12.4}",
            r.system,
            r.kv_util,
            r.kv_usage,
            r.mean_running,
            r.max_running,
            r.preemptions,
            r.finished,
            r.output_tokens_per_s,
            r.sim_time_s,
            r.mean_normalized_latency_s
        );
    }
    println!(
        "\nmax concurrency (paged): {} requests; mean running paged / Orca (Oracle): {:.2}×",
        c.paged.max_running,
        c.concurrency_paged_over_oracle()
    );
    println!("KV util = token states held ÷ memory reserved, over the steps with requests waiting.\n");
    println!("paged time series:");
    println!(
        "{:>9} {:>8} {:>8} {:>10} {:>10} {:>7}",
        "t (s)", "running", "waiting", "held", "reserved", "used"
    );
    for p in c.paged.downsampled(args.points) {
        println!(
            "{:>9.2} {:>8} {:>8} {:>10} {:>10} {:>6.1}%",
            p.t_s,
            p.running,
            p.waiting,
            p.held_tokens,
            p.reserved_tokens,
            100.0 * p.reserved_tokens as f64 / setup.usable_tokens() as f64
        );
    }
}

fn series_csv(c: &Comparison) -> String {
    let mut s = String::from("system,t_s,dt_s,running,waiting,held_tokens,reserved_tokens,saturated\n");
    for r in c.all() {
        for p in &r.series {
            let _ = writeln!(
                s,
                "{},{:.6},{:.6},{},{},{},{},{}",
                r.system, p.t_s, p.dt_s, p.running, p.waiting, p.held_tokens, p.reserved_tokens, p.saturated
            );
        }
    }
    s
}
