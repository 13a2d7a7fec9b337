//! `gpu_check`: the kernel half of the GPU run (the model half is `gpu_model_check`), one section
//! per process: `gpu_check --only SECTION [--smallest]` runs one section of
//! `gpu_check::sections` (`Program::Kernels`) and writes its record where `gpu_run` says. The
//! sections check every CUDA kernel against the CPU reference on random data (every cache
//! dtype, head size and block size; NaN-poisoned padding; shuffled blocks; decode, varlen and
//! prefill batches, long contexts and long prompts) through one attention path each (v1, v2,
//! split v2, the tiled prefill path), `reshape_and_cache`, copy/swap, every cache kernel at
//! offsets past 2³² elements, and measure device-to-device copy bandwidth and paged decode
//! attention. Each failing case is recorded with its dtype, head size, block size, KV heads,
//! GQA group and context. `--smallest` keeps one configuration and one batch (what the
//! sanitizer script runs).
//!
//! `gpu_check --probe` opens the device, prints it, its driver and architecture, and loads one
//! bundled cubin without compiling (exit 3 when it does not load: `run.sh` then precompiles
//! with the device's NVRTC). `gpu_check --precompile DIR [--arch sm_90]` runs without a GPU: it
//! compiles every program into the cubin cache folder DIR, so the GPU run needs no NVRTC.
//! The cubin folder is `$ATTN_KERNELS_CUBIN_DIR` (what `run.sh` sets).

mod attention;
mod bench;
mod cache;
mod far;
mod sweep;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use attn_kernels::cuda::cubin_cache::{CubinCache, default_dir, file_name};
use attn_kernels::cuda::kernels::{all_programs, model_program};
use attn_kernels::cuda::runtime::arch_name;
use attn_kernels::cuda::{CudaDevice, CudaKernels, nvrtc};
use cudarc::nvrtc::Ptx;
use gpu_check::figures::{Recorder, Res, run_section};
use gpu_check::sections::{self, Program};
use rayon::prelude::*;

/// What every section gets: the device, its kernels, and whether to run the smallest cases only.
struct Ctx {
    device: Arc<CudaDevice>,
    kernels: CudaKernels,
    smallest: bool,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    if let Some(dir) = flag("--precompile") {
        let arch = flag("--arch").unwrap_or_else(|| "sm_90".into());
        return report("--precompile", precompile(PathBuf::from(dir), &arch));
    }
    if args.iter().any(|a| a == "--probe") {
        return probe();
    }
    let Some(name) = flag("--only") else {
        let names: Vec<&str> = sections::of(Program::Kernels).map(|s| s.name).collect();
        eprintln!("usage: gpu_check --only SECTION [--smallest] | --probe | --precompile DIR [--arch sm_XY]");
        eprintln!("sections: {}", names.join(", "));
        return ExitCode::from(2);
    };
    if sections::by_name(&name).is_none_or(|s| s.program != Program::Kernels) {
        eprintln!("gpu_check: no section {name}");
        return ExitCode::from(2);
    }
    let smallest = args.iter().any(|a| a == "--smallest");
    run_section(&name, |rec| {
        let device = CudaDevice::open(0)?;
        rec.figure("device", device.name()?);
        let kernels = CudaKernels::new(device.clone())?;
        let ctx = Ctx { device, kernels, smallest };
        run(&name, &ctx, rec)
    })
}

fn run(name: &str, ctx: &Ctx, rec: &mut Recorder) -> Res<()> {
    use attn_kernels::cuda::kernels::AttentionVariant::{Tiled, V1, V2};
    match name {
        "attention_v1" => attention::check(ctx, rec, ("V1", V1, false)),
        "attention_v2" => attention::check(ctx, rec, ("V2", V2, false)),
        "attention_split" => attention::check(ctx, rec, ("V2_split", V2, true)),
        "prefill_tiles" => attention::check(ctx, rec, ("Tiled", Tiled, true)),
        "reshape" => cache::check_reshape_and_cache(ctx, rec),
        "copy_swap" => cache::check_copy_and_swap(ctx, rec),
        "bandwidth" => bench::bench(ctx, rec),
        "far_offsets" => far::check_far_offsets(ctx, rec),
        other => Err(format!("gpu_check has no section {other}").into()),
    }
}

fn report(what: &str, result: Res<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu_check {what}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Compiles every program for `arch` into the cubin cache folder (no GPU needed).
fn precompile(dir: PathBuf, arch: &str) -> Res<()> {
    let cache = CubinCache::new(Some(dir.clone()));
    let headers = std::env::temp_dir().join("kernels-nvrtc-headers");
    let programs = all_programs();
    programs.par_iter().try_for_each(|p| {
        nvrtc::compile(p, arch, &headers, false).and_then(|c| cache.store(p, arch, &c.cubin)).map(drop)
    })?;
    println!("precompiled {} programs for {arch} into {}", programs.len(), dir.display());
    Ok(())
}

/// Prints the device, its driver and architecture, then loads the bundled cubin of the model
/// program as it is: exit 0 when it loads, 3 when it is missing or does not load, 1 when there
/// is no device at all.
fn probe() -> ExitCode {
    let device = match CudaDevice::open(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("gpu_check --probe: no device: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut driver = 0;
    // SAFETY: a plain out-parameter; the driver library is loaded (the device opened).
    let _ = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) };
    let arch = match device.compute_capability() {
        Ok((major, minor)) => arch_name(major, minor),
        Err(e) => {
            eprintln!("gpu_check --probe: compute capability: {e}");
            return ExitCode::FAILURE;
        }
    };
    let name = device.name().unwrap_or_default();
    println!("device={name} driver={}.{} arch={arch}", driver / 1000, (driver % 1000) / 10);
    let program = model_program();
    let Some(path) = default_dir().map(|d| d.join(file_name(&program, &arch))) else {
        eprintln!("gpu_check --probe: no cubin folder (set ATTN_KERNELS_CUBIN_DIR)");
        return ExitCode::from(3);
    };
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => {
            println!("cubin={} missing ({e})", path.display());
            return ExitCode::from(3);
        }
    };
    match device.context().load_module(Ptx::from_binary(bytes)) {
        Ok(_) => {
            println!("cubin={} loads", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("cubin={} does not load: {e}", path.display());
            ExitCode::from(3)
        }
    }
}
