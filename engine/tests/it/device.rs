//! The device choice: `Device::Cuda` fails with one clear error when it cannot run (a build
//! without the `cuda` feature, or no NVIDIA driver), never a panic, and the CPU default is
//! untouched.

use engine::{DType, Device, Engine, EngineConfig};

use crate::support::{Fixture, small_config};

fn cuda_config() -> EngineConfig {
    EngineConfig { device: Device::Cuda { ordinal: 0 }, kv_dtype: DType::BF16, ..small_config(64) }
}

#[test]
fn cpu_is_the_default_device() {
    assert_eq!(EngineConfig::default().device, Device::Cpu);
    let fx = Fixture::new();
    assert_eq!(fx.engine(small_config(64)).num_kv_blocks(), 64);
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_in_a_build_without_cuda_names_the_feature() {
    let fx = Fixture::new();
    match Engine::new(fx.dir.path(), cuda_config()) {
        Ok(_) => panic!("a build without the cuda feature opened a CUDA engine"),
        Err(e) => assert!(e.to_string().contains("`cuda` feature"), "{e}"),
    }
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_without_a_driver_is_one_clear_error() {
    let fx = Fixture::new();
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
    let fx = Fixture::new();
    let config = EngineConfig { kv_dtype: DType::F32, ..cuda_config() };
    match Engine::new(fx.dir.path(), config) {
        Ok(_) => panic!("a CUDA engine with an f32 cache"),
        Err(e) => assert!(e.to_string().contains("bf16 or f16"), "{e}"),
    }
}
