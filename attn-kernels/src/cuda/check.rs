//! The compile check CI runs without a GPU (`cargo xtask cuda-check`): compile every program of
//! the instantiation table for each target architecture with ptxas statistics on, and fail on a
//! compile error, on an entry point the cubin lacks, or on any register spill in an attention
//! kernel. With a log cache, a program whose source, architecture, options and NVRTC version
//! were compiled before is judged from the saved compiler log instead of compiled again.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::cubin_cache::cache_key;
use super::error::CudaError;
use super::kernels::{Program, all_programs};
use super::lock;
use super::nvrtc::{self, KernelStats};
use crate::file::write_atomically;

/// What to check.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Target architectures, e.g. `["sm_80", "sm_90"]`.
    pub archs: Vec<String>,
    /// Where NVRTC unpacks its bundled headers.
    pub header_dir: PathBuf,
    /// Compiler threads (NVRTC compiles independent programs in parallel).
    pub jobs: usize,
    /// Only programs whose name contains this.
    pub filter: Option<String>,
    /// A folder of the compiler logs of earlier successful compiles, keyed by what the
    /// compile depends on ([`log_file`]); `None` compiles everything.
    pub log_cache: Option<PathBuf>,
}

/// One kernel of one program for one architecture.
#[derive(Debug, Clone)]
pub struct CheckedKernel {
    pub arch: String,
    pub program: String,
    pub stats: KernelStats,
}

/// Everything the check found.
#[derive(Debug, Default)]
pub struct CheckReport {
    pub kernels: Vec<CheckedKernel>,
    /// Human-readable reasons the check fails (empty = pass).
    pub failures: Vec<String>,
    pub programs_compiled: usize,
    /// Of those, the ones judged from a cached log.
    pub logs_reused: usize,
}

impl CheckReport {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Compiles every selected program for every architecture and judges the ptxas statistics.
pub fn run(opts: &CheckOptions) -> Result<CheckReport, CudaError> {
    if !nvrtc::nvrtc_present() {
        return Err(CudaError::NvrtcMissing);
    }
    let programs: Vec<Program> = all_programs()
        .into_iter()
        .filter(|p| opts.filter.as_ref().is_none_or(|f| p.name.contains(f.as_str())))
        .collect();
    let jobs: Vec<(&Program, &str)> =
        programs.iter().flat_map(|p| opts.archs.iter().map(move |a| (p, a.as_str()))).collect();
    let report = Mutex::new(CheckReport::default());
    let reused = AtomicUsize::new(0);
    for_each_parallel(opts.jobs, &jobs, |&(program, arch)| {
        let cached = opts.log_cache.as_ref().map(|dir| dir.join(log_file(program, arch)));
        if let Some(log) = cached.as_ref().and_then(|f| std::fs::read_to_string(f).ok()) {
            reused.fetch_add(1, Ordering::Relaxed);
            judge(&mut lock(&report), program, arch, Ok(nvrtc::Compiled { cubin: Vec::new(), log }));
            return;
        }
        let result = nvrtc::compile(program, arch, &opts.header_dir, true);
        if let (Some(file), Ok(compiled)) = (&cached, &result) {
            // A cache that cannot be written only costs the next run a compile.
            let _ = write_atomically(file, compiled.log.as_bytes());
        }
        judge(&mut lock(&report), program, arch, result);
    });
    let mut report = report.into_inner().unwrap_or_else(|p| p.into_inner());
    report.logs_reused = reused.into_inner();
    report
        .kernels
        .sort_by(|a, b| (&a.arch, &a.program, &a.stats.name).cmp(&(&b.arch, &b.program, &b.stats.name)));
    Ok(report)
}

/// The log cache's file of `program` compiled for `arch`: its name, the architecture, and a hash
/// of the source, the options' version and the NVRTC version.
pub fn log_file(program: &Program, arch: &str) -> String {
    let (major, minor) = nvrtc::version().unwrap_or((0, 0));
    let key = cache_key(
        &Program { source: format!("{}\n// nvrtc {major}.{minor}", program.source), ..program.clone() },
        arch,
    );
    format!("{}-{arch}-{key}.log", program.name)
}

/// Runs `f` on every item from `jobs` threads (NVRTC compiles independent programs in parallel).
pub fn for_each_parallel<T: Sync>(jobs: usize, items: &[T], f: impl Fn(&T) + Sync) {
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| {
                while let Some(item) = items.get(next.fetch_add(1, Ordering::Relaxed)) {
                    f(item);
                }
            });
        }
    });
}

/// Records one compilation's kernels and failures.
pub fn judge(
    report: &mut CheckReport,
    program: &Program,
    arch: &str,
    result: Result<nvrtc::Compiled, CudaError>,
) {
    let compiled = match result {
        Ok(c) => c,
        Err(e) => {
            report.failures.push(format!("{} for {arch}: {e}", program.name));
            return;
        }
    };
    report.programs_compiled += 1;
    let stats = nvrtc::parse_ptxas_log(&compiled.log);
    for entry in &program.entries {
        let Some(s) = stats.iter().find(|s| s.name == entry.name) else {
            report
                .failures
                .push(format!("{} for {arch}: entry {} missing from the cubin", program.name, entry.name));
            continue;
        };
        if entry.attention && s.spills() {
            report.failures.push(format!(
                "{} for {arch}: {} spills ({} bytes stored, {} loaded)",
                program.name, entry.name, s.spill_store_bytes, s.spill_load_bytes
            ));
        }
        report.kernels.push(CheckedKernel {
            arch: arch.to_owned(),
            program: program.name.clone(),
            stats: s.clone(),
        });
    }
}

/// A markdown table of every kernel: registers, static shared memory, stack, spills.
pub fn format_table(report: &CheckReport) -> String {
    let mut out = String::from(
        "| arch | kernel | registers | smem B | stack B | spill st/ld B |\n|---|---|---:|---:|---:|---:|\n",
    );
    let mut seen = std::collections::HashSet::new();
    for k in &report.kernels {
        // copy_blocks / reduce appear in every attention program; list them once per arch.
        if !seen.insert((k.arch.clone(), k.stats.name.clone())) {
            continue;
        }
        let s = &k.stats;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {}/{} |",
            k.arch,
            s.name,
            s.registers,
            s.shared_bytes,
            s.stack_bytes,
            s.spill_store_bytes,
            s.spill_load_bytes
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::kernels::Entry;

    fn program() -> Program {
        Program {
            name: "p".into(),
            source: String::new(),
            entries: vec![
                Entry { name: "attn".into(), attention: true },
                Entry { name: "other".into(), attention: false },
            ],
        }
    }

    fn log(attn_spill: u32, other_spill: u32) -> String {
        format!(
            "ptxas info    : Compiling entry function 'attn' for 'sm_90'\n\
             ptxas         .     0 bytes stack frame, {attn_spill} bytes spill stores, {attn_spill} bytes spill loads\n\
             ptxas info    : Used 64 registers, used 1 barriers\n\
             ptxas info    : Compiling entry function 'other' for 'sm_90'\n\
             ptxas         .     0 bytes stack frame, {other_spill} bytes spill stores, 0 bytes spill loads\n\
             ptxas info    : Used 32 registers, used 0 barriers\n"
        )
    }

    #[test]
    fn a_cached_log_is_found_only_for_the_same_source_and_architecture() {
        let p = program();
        let edited = Program { source: format!("{}\n", p.source), ..p.clone() };
        assert_eq!(log_file(&p, "sm_90"), log_file(&p.clone(), "sm_90"));
        assert_ne!(log_file(&p, "sm_90"), log_file(&edited, "sm_90"));
        assert_ne!(log_file(&p, "sm_80"), log_file(&p, "sm_90"));
        assert!(log_file(&p, "sm_90").starts_with(&format!("{}-sm_90-", p.name)));
    }

    #[test]
    fn spills_fail_only_in_attention_kernels() {
        let mut r = CheckReport::default();
        judge(&mut r, &program(), "sm_90", Ok(nvrtc::Compiled { cubin: vec![], log: log(0, 8) }));
        assert!(r.passed(), "{:?}", r.failures);
        assert_eq!(r.kernels.len(), 2);
        judge(&mut r, &program(), "sm_80", Ok(nvrtc::Compiled { cubin: vec![], log: log(4, 0) }));
        assert_eq!(r.failures.len(), 1);
        assert!(r.failures[0].contains("attn spills"));
    }

    #[test]
    fn missing_entries_and_compile_errors_fail() {
        let mut r = CheckReport::default();
        let only_attn =
            "ptxas info    : Compiling entry function 'attn' for 'sm_90'\nptxas info    : Used 8 registers\n";
        judge(&mut r, &program(), "sm_90", Ok(nvrtc::Compiled { cubin: vec![], log: only_attn.into() }));
        assert!(r.failures.iter().any(|f| f.contains("other missing")));
        judge(
            &mut r,
            &program(),
            "sm_90",
            Err(CudaError::Compile { program: "p".into(), arch: "sm_90".into(), log: "error: x".into() }),
        );
        assert_eq!(r.failures.len(), 2);
        assert!(format_table(&r).contains("| sm_90 | attn | 8 |"));
    }
}
