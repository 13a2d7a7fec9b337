//! Progress of a model's load, for a person waiting on it: the checkpoint's bytes brought into
//! memory, then the tensors the model is built from.

/// A step of a model's load, reported as it happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadProgress {
    /// `done` of the checkpoint's `total` bytes read into memory.
    Bytes { done: u64, total: u64 },
    /// `done` of the `total` tensors the model is built from checked and in place.
    Tensors { done: usize, total: usize },
}

/// Where a load reports its progress.
pub type OnLoad<'a> = &'a mut dyn FnMut(LoadProgress);

/// A load nobody watches.
pub fn unwatched(_: LoadProgress) {}

/// How much is read between two reports: a few reports a second at disk speed.
pub(crate) const REPORT_EVERY: usize = 64 << 20;

/// The bytes of each of `maps` (a checkpoint's memory-mapped files), brought into memory now,
/// a page at a time, as `MAP_POPULATE` would (llama.cpp maps its models that way): a step
/// would otherwise stall on reading the file from disk, and the load could show no progress.
/// Reports `Bytes` every [`REPORT_EVERY`] bytes and at the end.
pub(crate) fn fault_in(maps: &[&[u8]], on: OnLoad<'_>) {
    const PAGE: usize = 4096;
    let total: u64 = maps.iter().map(|m| m.len() as u64).sum();
    let mut done = 0u64;
    on(LoadProgress::Bytes { done, total });
    for map in maps {
        for chunk in map.chunks(REPORT_EVERY) {
            // One byte of each page: the read is what brings the page in.
            let touched = chunk.iter().step_by(PAGE).fold(0u8, |acc, &b| acc ^ b);
            std::hint::black_box(touched);
            done += chunk.len() as u64;
            on(LoadProgress::Bytes { done, total });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faulting_in_reports_every_chunk_and_ends_at_the_total() {
        let a = vec![1u8; REPORT_EVERY + 10];
        let b = vec![2u8; 5];
        let mut seen = Vec::new();
        fault_in(&[&a, &b, &[]], &mut |p| seen.push(p));
        let total = (REPORT_EVERY + 15) as u64;
        let done = |done| LoadProgress::Bytes { done, total };
        assert_eq!(seen, [done(0), done(REPORT_EVERY as u64), done(REPORT_EVERY as u64 + 10), done(total)]);
    }
}
