//! Capacity simulation figures for `cargo xtask bench` (group `sim`): the paper's ShareGPT
//! setting (OPT-13B, KV memory for 15.7K tokens, max length 2048, block 16, requests arriving
//! faster than they finish) and the Alpaca shape, paged vs Orca (Max / Pow2 / Oracle).
//!
//! Writes `$BENCH_FIGURES_DIR/sim.json`, a report fragment `sim.md`, and the chart
//! `sim_kv_usage.svg` next to the report (`$BENCH_FIGURES_DIR/..`). Figures are means over
//! seeds (`BENCH_QUICK=1`: one seed, same workload size).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use sim::{
    Comparison, CostModel, Hardware, ModelShape, Placement, Reservation, SimReport, SimSetup, Trace,
    TraceShape, compare, simulate_contiguous,
};

struct Workload {
    shape: TraceShape,
    num_requests: usize,
    /// Requests per second: several times what the paged system can finish.
    rate: f64,
}

const WORKLOADS: [Workload; 2] = [
    Workload { shape: TraceShape::SHAREGPT, num_requests: 1000, rate: 20.0 },
    Workload { shape: TraceShape::ALPACA, num_requests: 3000, rate: 400.0 },
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1");
    let seeds: Vec<u64> = if quick { vec![1] } else { (1..=5).collect() };
    let dir = std::env::var_os("BENCH_FIGURES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/bench-report/figures-run"));
    std::fs::create_dir_all(&dir)?;
    let setup = SimSetup::paper_sharegpt();
    let cost = CostModel::new(ModelShape::OPT_13B, Hardware::A100_40GB);

    let mut figures: BTreeMap<String, f64> = BTreeMap::new();
    let mut md = String::from("## Capacity simulation (paged vs contiguous reservation)\n\n");
    writeln!(
        md,
        "OPT-13B cost model on an A100-40GB roofline, KV memory for {} token slots (block {}), max length {}, \
         Poisson arrivals faster than service; averages over the saturated busy period, mean of {} seed(s).\n",
        setup.usable_tokens(),
        setup.block_size,
        setup.max_model_len,
        seeds.len()
    )?;
    md.push_str(
        "| trace | system | KV utilization | mean running | max running | preemptions | output tok/s |\n",
    );
    md.push_str("|---|---|---:|---:|---:|---:|---:|\n");
    let mut chart_run: Option<Comparison> = None;
    for w in &WORKLOADS {
        let traces: Vec<Trace> = seeds
            .iter()
            .map(|&seed| Trace::synthetic(w.shape, w.num_requests, w.rate, setup.max_model_len, seed))
            .collect();
        let runs: Vec<Comparison> =
            traces.iter().map(|trace| compare(trace, &setup, &cost)).collect::<Result<_, _>>()?;
        // The paper's baselines use buddy allocation; first fit over exact sizes wastes less.
        let first_fit_oracle: Vec<SimReport> = traces
            .iter()
            .map(|trace| {
                simulate_contiguous(
                    trace,
                    &setup.contiguous_config(Reservation::Oracle, Placement::FirstFit),
                    &cost,
                )
            })
            .collect();
        let mean = |f: &dyn Fn(&Comparison) -> f64| runs.iter().map(f).sum::<f64>() / runs.len() as f64;
        let name = w.shape.name;
        for (i, system) in ["paged", "max", "pow2", "oracle"].iter().enumerate() {
            let pick = |c: &Comparison| c.all()[i].clone();
            let util = mean(&|c| pick(c).kv_util);
            let running = mean(&|c| pick(c).mean_running);
            let max_running = mean(&|c| pick(c).max_running as f64);
            let preempt = mean(&|c| pick(c).preemptions as f64);
            let tput = mean(&|c| pick(c).output_tokens_per_s);
            figures.insert(format!("sim.{name}.kv_util_{system}"), util);
            figures.insert(format!("sim.{name}.mean_running_{system}"), running);
            writeln!(
                md,
                "| {name} | {} | {util:.3} | {running:.1} | {max_running:.0} | {preempt:.0} | {tput:.0} |",
                runs[0].all()[i].system
            )?;
        }
        figures.insert(
            format!("sim.{name}.concurrency_paged_over_oracle"),
            mean(&|c| c.concurrency_paged_over_oracle()),
        );
        let ff_mean = |f: &dyn Fn(&SimReport) -> f64| {
            first_fit_oracle.iter().map(f).sum::<f64>() / first_fit_oracle.len() as f64
        };
        let (ff_util, ff_running) = (ff_mean(&|r| r.kv_util), ff_mean(&|r| r.mean_running));
        let ff_ratio = runs
            .iter()
            .zip(&first_fit_oracle)
            .map(|(c, ff)| c.paged.mean_running / ff.mean_running.max(f64::MIN_POSITIVE))
            .sum::<f64>()
            / runs.len() as f64;
        figures.insert(format!("sim.{name}.kv_util_oracle_firstfit"), ff_util);
        figures.insert(format!("sim.{name}.mean_running_oracle_firstfit"), ff_running);
        figures.insert(format!("sim.{name}.concurrency_paged_over_oracle_firstfit"), ff_ratio);
        let requests = w.num_requests as f64;
        figures.insert(
            format!("sim.{name}.preemptions_per_request_paged"),
            mean(&|c| c.paged.preemptions as f64) / requests,
        );
        writeln!(
            md,
            "| {name} | orca-oracle, first fit (not the paper's) | {ff_util:.3} | {ff_running:.1} | {:.0} | 0 | {:.0} |",
            ff_mean(&|r| r.max_running as f64),
            ff_mean(&|r| r.output_tokens_per_s)
        )?;
        if chart_run.is_none() {
            chart_run = runs.into_iter().next();
        }
    }
    md.push_str(MODELLING_NOTES);
    let svg = dir.parent().unwrap_or(&dir).join("sim_kv_usage.svg");
    if let Some(c) = &chart_run {
        draw_chart(&svg, c, setup.usable_tokens())?;
        md.push_str("\n![KV usage over time, ShareGPT (seed 1)](sim_kv_usage.svg)\n\n");
        md.push_str("Token states held as a share of KV memory over the ShareGPT run (seed 1).\n");
    }
    std::fs::write(dir.join("sim.json"), serde_json::to_string_pretty(&figures)? + "\n")?;
    std::fs::write(dir.join("sim.md"), &md)?;
    for (k, v) in &figures {
        println!("{k} = {v:.4}");
    }
    println!("wrote {} and {}", dir.join("sim.json").display(), svg.display());
    Ok(())
}

/// How the systems are modelled, for the report (see the `sim` crate).
const MODELLING_NOTES: &str = "
Modelling, as in the PagedAttention paper (§6.1): the Orca baselines reserve for a request's whole
lifetime — Max: 2048 slots; Pow2: the prompt plus the next power of two of the true output
length; Oracle: the true length — and place the reservation with a buddy allocator, which rounds
it up to a power of two. First fit over exact sizes (the Oracle row marked \"first fit\") wastes
less than the paper's baselines and is shown for comparison. The paged system is the real
scheduler: like vLLM's block manager it admits a request only when its whole remaining prompt
fits above the 1% watermark and preempts the latest arrival (recompute) when a running request
needs a block. Synthetic ShareGPT lengths are log-normal (σ = 1) with the dataset's means (161
in, 338 out), heavy-tailed and cut to the 2048 max length. Why paged ÷ Oracle is about 2: a
request holds its prompt plus half its output on average while Oracle reserves all of it from the
start, and long requests dominate the time average (on this trace the output-weighted footprint is
868 slots reserved vs 513 held, 1.7x, before fragmentation); buddy rounding takes Oracle's
footprint to 1131 (2.2x). Paper, Fig. 13a (ShareGPT, 2 req/s): Max 7.00, Pow2 9.81, Oracle
13.62, vLLM 30.42 requests; Fig. 2 utilizations: 20.4% / 26.8% / 38.2% / 96.3%.
";

/// Token states held ÷ KV memory over time, one line per system.
fn draw_chart(path: &Path, c: &Comparison, capacity: usize) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let end = c.all().iter().map(|r| r.sim_time_s).fold(0.0, f64::max).max(1e-9);
    let mut chart = ChartBuilder::on(&root)
        .caption("KV cache: token states held / KV memory (ShareGPT, 15.7K slots)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(0.0..end, 0.0..1.0)?;
    chart.configure_mesh().x_desc("simulated time (s)").y_desc("share of KV memory").draw()?;
    let colors =
        [RGBColor(31, 119, 180), RGBColor(214, 39, 40), RGBColor(255, 127, 14), RGBColor(44, 160, 44)];
    for (report, color) in c.all().into_iter().zip(colors) {
        let points = series(report, capacity);
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(report.system.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.85)).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}

fn series(report: &SimReport, capacity: usize) -> Vec<(f64, f64)> {
    report.downsampled(600).iter().map(|s| (s.t_s, s.held_tokens as f64 / capacity as f64)).collect()
}
