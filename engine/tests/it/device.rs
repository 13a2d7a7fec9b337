//! The device choice: `Device::Cuda` fails with one clear error when it cannot run (a build
//! without the `cuda` feature, or no NVIDIA driver), never a panic, and the CPU default is
//! untouched.

use engine::{DType, Device, Engine, EngineConfig};

use crate::support::{Fixture, small_config};

fn cuda_config() -> EngineConfig {
    EngineConfig { device: Device::Cuda { ordinal: 0 }, kv_dtype: DType::BF16, ..small_config(64) }
}

/// Asserts that opening an engine with `config` fails with an error naming `needle`;
/// `opened` says what must not have happened.
fn assert_open_fails(config: EngineConfig, needle: &str, opened: &str) {
    let fx = Fixture::new();
    match Engine::new(fx.dir.path(), config) {
        Ok(_) => panic!("{opened}"),
        Err(e) => assert!(e.to_string().contains(needle), "{e}"),
    }
}

#[test]
fn cpu_is_the_default_device() {
    assert_eq!(EngineConfig::default().device, Device::Cpu);
    let fx = Fixture::new();
    assert_eq!(fx.engine(small_config(64)).num_kv_blocks(), 64);
}

#[test]
fn an_fp8_cache_on_the_cpu_names_the_combination() {
    for (dtype, name) in [(DType::Fp8E4M3, "fp8_e4m3"), (DType::Fp8E5M2, "fp8_e5m2")] {
        let config = EngineConfig { kv_dtype: dtype, ..small_config(64) };
        assert_open_fails(config, &format!("kv_cache_dtype {name} on cpu"), "a CPU engine with an fp8 cache");
    }
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_in_a_build_without_cuda_names_the_feature() {
    assert_open_fails(
        cuda_config(),
        "`cuda` feature",
        "a build without the cuda feature opened a CUDA engine",
    );
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_without_a_driver_is_one_clear_error() {
    let fx = Fixture::new();
    // Opened whether or not a driver is present: with one, opening must not panic either.
    let result = Engine::new(fx.dir.path(), cuda_config());
    if !model::cuda::driver_present() {
        match result {
            Ok(_) => panic!("opened a CUDA engine without a driver"),
            Err(e) => assert!(e.to_string().contains("no CUDA driver"), "{e}"),
        }
    }
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_needs_a_half_precision_cache() {
    let config = EngineConfig { kv_dtype: DType::F32, ..cuda_config() };
    assert_open_fails(config, "bf16 or f16", "a CUDA engine with an f32 cache");
    let config = EngineConfig { kv_dtype: DType::Int8, ..cuda_config() };
    assert_open_fails(config, "kv_cache_dtype int8 on cuda", "a CUDA engine with an int8 cache");
}
