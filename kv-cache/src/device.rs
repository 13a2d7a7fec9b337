//! Where cache memory lives.
//!
//! `#[non_exhaustive]` so that the CUDA variant (`Cuda { ordinal }`, behind the `cuda` feature
//! of the CUDA issue) arrives without breaking any `match` outside this crate.

/// Where cache memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Device {
    /// Host memory; the CPU kernels of `attn-kernels` run on it.
    #[default]
    Cpu,
}

impl Device {
    pub const fn is_cpu(self) -> bool {
        matches!(self, Device::Cpu)
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
        }
    }
}
