//! Cluster sizing: how many replicas of one engine serve a target request rate, from the
//! single-replica simulator — the PagedAttention paper's capacity model, where a system
//! sustains a request rate while its normalized latency (seconds per output token) stays
//! under a bound, and its capacity is the highest such rate.
//!
//! Replicas are independent engines behind a router: a Poisson stream split evenly over `n`
//! replicas gives each a Poisson stream of `rate / n` (randomly split Poisson arrivals are
//! Poisson), so a replica's capacity found on one simulated engine sizes the cluster. A
//! router that spreads load more evenly than random (least-loaded, round robin) only does
//! better; prefix-aware routing's cache hits are not counted (the traces share no prefixes).

use scheduler::SchedulerError;

use crate::cost::CostModel;
use crate::metrics::SimReport;
use crate::paged::{SimSetup, simulate_paged};
use crate::trace::Trace;

/// Bisection steps on the request rate: the capacity to within 2⁻¹⁴ of the bracket.
const BISECTION_STEPS: usize = 14;
/// Doublings of the burst throughput tried for a rate that fails the bound.
const BRACKET_DOUBLINGS: usize = 20;
/// Most replicas a plan proposes (a bound on the search, not a limit of the model).
pub const MAX_REPLICAS: usize = 100_000;

/// The highest request rate one replica sustains, and its simulation at that rate.
#[derive(Debug, Clone)]
pub struct ReplicaCapacity {
    /// Requests per second.
    pub rate: f64,
    pub report: SimReport,
    /// Normalized latency of a lone request stream far below capacity: the floor no rate beats.
    pub idle_normalized_latency_s: f64,
    /// Requests per second with every request queued at once (the capacity is near it: a
    /// little above when batching absorbs the arrivals, below when the bound is tight).
    pub throughput_rate: f64,
}

/// Replicas for a target rate, with each replica's simulated share of it.
#[derive(Debug, Clone)]
pub struct ClusterPlan {
    pub target_rate: f64,
    pub max_normalized_latency_s: f64,
    pub capacity: ReplicaCapacity,
    pub replicas: usize,
    /// One replica at `target_rate / replicas`: what each replica of the plan sees.
    pub per_replica: SimReport,
}

/// Why no plan exists.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Scheduler(#[from] SchedulerError),
    #[error("target rate and latency bound must be positive and finite")]
    BadTarget,
    #[error(
        "a replica's normalized latency is {idle:.4} s/token even when idle: above the bound of {bound:.4} s/token"
    )]
    BoundBelowIdle { idle: f64, bound: f64 },
    #[error(
        "the bound never binds on this trace: all its requests at once stay at {burst:.4} s/token; use a tighter bound or more requests"
    )]
    BoundNeverBinds { burst: f64 },
    #[error("the trace's requests never all finish on one replica (the KV cache cannot hold them)")]
    Unservable,
    #[error("more than {MAX_REPLICAS} replicas would be needed")]
    TooManyReplicas,
}

/// Whether one replica's run of a trace meets the bound: every request finished, normalized
/// latency within it.
fn sustains(report: &SimReport, bound: f64) -> bool {
    report.finished == report.num_requests && report.mean_normalized_latency_s <= bound
}

/// The highest rate at which one replica keeps normalized latency within `bound`:
/// `trace_at(rate)` draws the workload at a rate (the same lengths and seed each time, so
/// rates compare like for like).
pub fn replica_capacity(
    trace_at: &dyn Fn(f64) -> Trace,
    setup: &SimSetup,
    cost: &CostModel,
    bound: f64,
) -> Result<ReplicaCapacity, ClusterError> {
    if !(bound.is_finite() && bound > 0.0) {
        return Err(ClusterError::BadTarget);
    }
    // All at once: the replica's throughput in requests per second brackets its capacity.
    let burst = trace_at(f64::INFINITY);
    let saturated = simulate_paged(&burst, setup, cost)?;
    if saturated.finished < saturated.num_requests || saturated.sim_time_s <= 0.0 {
        return Err(ClusterError::Unservable);
    }
    let throughput = saturated.num_requests as f64 / saturated.sim_time_s;
    // Far below capacity: each request alone, the latency floor.
    let idle = simulate_paged(&trace_at(throughput / 1000.0), setup, cost)?;
    let idle_normalized_latency_s = idle.mean_normalized_latency_s;
    if !sustains(&idle, bound) {
        return Err(ClusterError::BoundBelowIdle { idle: idle_normalized_latency_s, bound });
    }
    if sustains(&saturated, bound) {
        return Err(ClusterError::BoundNeverBinds { burst: saturated.mean_normalized_latency_s });
    }
    // A failing rate above: the trace at a high enough rate is the burst, which fails.
    let (mut lo, mut hi, mut best) = (throughput / 1000.0, throughput, idle);
    for _ in 0..BRACKET_DOUBLINGS {
        let report = simulate_paged(&trace_at(hi), setup, cost)?;
        if !sustains(&report, bound) {
            break;
        }
        (lo, best) = (hi, report);
        hi *= 2.0;
    }
    // Invariant: `lo` sustains the bound (with `best`), `hi` does not.
    for _ in 0..BISECTION_STEPS {
        let mid = 0.5 * (lo + hi);
        let report = simulate_paged(&trace_at(mid), setup, cost)?;
        if sustains(&report, bound) {
            (lo, best) = (mid, report);
        } else {
            hi = mid;
        }
    }
    Ok(ReplicaCapacity { rate: lo, report: best, idle_normalized_latency_s, throughput_rate: throughput })
}

/// Replicas needed for `target_rate` requests per second within `bound` seconds per output
/// token: the capacity's ceiling, then checked by simulating one replica at its share (and
/// grown while the check fails, as bisection only brackets the capacity).
pub fn plan_cluster(
    trace_at: &dyn Fn(f64) -> Trace,
    setup: &SimSetup,
    cost: &CostModel,
    target_rate: f64,
    bound: f64,
) -> Result<ClusterPlan, ClusterError> {
    if !(target_rate.is_finite() && target_rate > 0.0) {
        return Err(ClusterError::BadTarget);
    }
    let capacity = replica_capacity(trace_at, setup, cost, bound)?;
    let estimate = (target_rate / capacity.rate).ceil();
    if estimate > MAX_REPLICAS as f64 {
        return Err(ClusterError::TooManyReplicas);
    }
    let mut replicas = (estimate as usize).max(1);
    loop {
        let per_replica = simulate_paged(&trace_at(target_rate / replicas as f64), setup, cost)?;
        if sustains(&per_replica, bound) {
            return Ok(ClusterPlan {
                target_rate,
                max_normalized_latency_s: bound,
                capacity,
                replicas,
                per_replica,
            });
        }
        replicas += 1;
        if replicas > MAX_REPLICAS {
            return Err(ClusterError::TooManyReplicas);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{Hardware, ModelShape};
    use crate::trace::TraceShape;

    fn fixture() -> (SimSetup, CostModel, impl Fn(f64) -> Trace) {
        let model = ModelShape::by_name("opt-13b").expect("preset");
        let cost = CostModel::new(model, Hardware::by_name("a100-40gb").expect("preset"));
        let trace_at = |rate| Trace::synthetic(TraceShape::SHAREGPT, 400, rate, 2048, 7);
        (SimSetup::paper_sharegpt(), cost, trace_at)
    }

    /// A bound that binds: twice the idle normalized latency.
    fn binding_bound(setup: &SimSetup, cost: &CostModel, trace_at: &dyn Fn(f64) -> Trace) -> f64 {
        let idle = simulate_paged(&trace_at(1e-3), setup, cost).expect("sim");
        2.0 * idle.mean_normalized_latency_s
    }

    #[test]
    fn latency_grows_with_rate_and_the_capacity_sits_where_it_crosses_the_bound() {
        let (setup, cost, trace_at) = fixture();
        let bound = binding_bound(&setup, &cost, &trace_at);
        let cap = replica_capacity(&trace_at, &setup, &cost, bound).expect("capacity");
        assert!(cap.rate > 0.5 * cap.throughput_rate && cap.rate < 2.0 * cap.throughput_rate, "{cap:?}");
        assert!(cap.report.mean_normalized_latency_s <= bound);
        assert!(cap.idle_normalized_latency_s <= cap.report.mean_normalized_latency_s);
        // A little past the capacity the bound fails.
        let over = simulate_paged(&trace_at(cap.rate * 1.1), &setup, &cost).expect("sim");
        assert!(
            over.mean_normalized_latency_s > bound,
            "{} at 1.1x capacity",
            over.mean_normalized_latency_s
        );
        // A bound even the whole trace at once meets says so.
        let loose = replica_capacity(&trace_at, &setup, &cost, 100.0).expect_err("never binds");
        assert!(matches!(loose, ClusterError::BoundNeverBinds { .. }), "{loose}");
    }

    #[test]
    fn replicas_scale_with_the_target_and_each_share_meets_the_bound() {
        let (setup, cost, trace_at) = fixture();
        let bound = binding_bound(&setup, &cost, &trace_at);
        let one = plan_cluster(&trace_at, &setup, &cost, 0.5, bound).expect("plan");
        assert_eq!(one.replicas, 1);
        let many = plan_cluster(&trace_at, &setup, &cost, one.capacity.rate * 7.5, bound).expect("plan");
        assert!((8..=9).contains(&many.replicas), "{} replicas for 7.5x capacity", many.replicas);
        assert!(many.per_replica.mean_normalized_latency_s <= bound);
    }

    #[test]
    fn a_bound_below_the_idle_latency_is_an_error_naming_both() {
        let (setup, cost, trace_at) = fixture();
        let err = plan_cluster(&trace_at, &setup, &cost, 1.0, 1e-6).expect_err("impossible bound");
        assert!(matches!(err, ClusterError::BoundBelowIdle { .. }), "{err}");
        assert!(plan_cluster(&trace_at, &setup, &cost, f64::NAN, 0.05).is_err());
    }
}
