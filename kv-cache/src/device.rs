//! Where cache memory lives: host memory, or one NVIDIA GPU by ordinal.
//!
//! The CUDA variant is plain data and exists in every build, so a configuration can name it
//! anywhere; only builds with the `cuda` feature can open it (others report that they lack it).
//! `#[non_exhaustive]` so that further devices arrive without breaking a `match` outside.

/// Where cache memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Device {
    /// Host memory; the CPU kernels of `attn-kernels` run on it.
    #[default]
    Cpu,
    /// GPU `ordinal` (as CUDA numbers them); the CUDA kernels of `attn-kernels` run on it.
    Cuda { ordinal: usize },
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
            Device::Cuda { ordinal } => write!(f, "cuda:{ordinal}"),
        }
    }
}

impl std::str::FromStr for Device {
    type Err = String;

    /// `cpu`, `cuda` (GPU 0) or `cuda:N`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda { ordinal: 0 }),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(|ordinal| Device::Cuda { ordinal })
                .ok_or_else(|| format!("unknown device {s:?} (expected cpu, cuda or cuda:N)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_print_alike() {
        for d in [Device::Cpu, Device::Cuda { ordinal: 0 }, Device::Cuda { ordinal: 3 }] {
            assert_eq!(d.to_string().parse::<Device>(), Ok(d));
        }
        assert_eq!("cuda".parse::<Device>(), Ok(Device::Cuda { ordinal: 0 }));
        assert!("gpu".parse::<Device>().is_err());
        assert!("cuda:x".parse::<Device>().is_err());
        assert!(!Device::Cuda { ordinal: 0 }.is_cpu());
    }
}
