//! The guides whose next masks a step computes beside its forward pass
//! (for `structured::while_running`): those of the rows it samples.

use super::live::SampleMut;
use crate::structured::Guide;

/// The guide of every sampled row that has one.
pub(super) fn sampled_guides<'s>(samples: &'s mut [SampleMut<'_>]) -> Vec<&'s mut Guide> {
    samples.iter_mut().filter_map(|s| s.seq.guide.as_mut()).collect()
}
