//! One trace, one memory size, four systems: paged (the scheduler) against the contiguous
//! baselines Orca (Max), Orca (Pow2) and Orca (Oracle).

use scheduler::SchedulerError;

use crate::contiguous::{Reservation, simulate_contiguous};
use crate::cost::CostModel;
use crate::metrics::SimReport;
use crate::paged::{SimSetup, simulate_paged};
use crate::trace::Trace;

/// Reports of the four systems on the same trace and memory.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub paged: SimReport,
    pub max: SimReport,
    pub pow2: SimReport,
    pub oracle: SimReport,
}

impl Comparison {
    pub fn all(&self) -> [&SimReport; 4] {
        [&self.paged, &self.max, &self.pow2, &self.oracle]
    }

    /// Mean running requests, paged ÷ Orca (Oracle).
    pub fn concurrency_paged_over_oracle(&self) -> f64 {
        if self.oracle.mean_running > 0.0 { self.paged.mean_running / self.oracle.mean_running } else { 0.0 }
    }
}

/// Runs all four systems.
pub fn compare(trace: &Trace, setup: &SimSetup, cost: &CostModel) -> Result<Comparison, SchedulerError> {
    let baseline = |reservation| {
        simulate_contiguous(trace, &setup.contiguous_config(reservation, setup.baseline_placement), cost)
    };
    Ok(Comparison {
        paged: simulate_paged(trace, setup, cost)?,
        max: baseline(Reservation::Max),
        pow2: baseline(Reservation::Pow2),
        oracle: baseline(Reservation::Oracle),
    })
}
