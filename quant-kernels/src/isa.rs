//! The instruction set every CPU kernel runs with — attention's micro-kernels (`simd`) and the
//! matmul, norm and activation kernels (`cpu`) alike — detected once for the process.
//!
//! The rule: AVX-512 = AVX-512F on top of AVX2 + FMA + F16C. That is what every AVX-512
//! kernel here is compiled for (`#[target_feature(enable = "avx512f,avx2,fma,f16c")]`: the
//! 16-lane loops are AVX-512F, the byte shuffles that feed them stay in ymm/xmm); no kernel
//! needs DQ, BW or VL, so a CPU with AVX-512F never falls back to AVX2. The one wider
//! extension a kernel uses, the int16 decode kernel's `vpdpwssd` (AVX-512BW + VNNI), is a
//! capability inside the AVX-512 tier ([`avx512_vnni`]), not a tier of its own.

use std::sync::OnceLock;

/// Instruction set the CPU kernels run with; each one includes every one before it, and a
/// kernel given one the CPU lacks runs a path this CPU has (see each entry point).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Plain Rust loops (whatever the compiler vectorizes for the baseline target).
    Portable,
    /// AVX2 + FMA + F16C intrinsics (x86-64 only, checked at run time).
    Avx2,
    /// [`Isa::Avx2`] plus AVX-512F: the sixteen-lane kernels.
    Avx512,
}

impl Isa {
    /// Every instruction set, best last.
    pub const ALL: [Isa; 3] = [Isa::Portable, Isa::Avx2, Isa::Avx512];

    /// The best instruction set this CPU runs, detected once.
    #[inline]
    pub fn detected() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(detect)
    }

    /// Whether this CPU can run `self`.
    #[inline]
    pub fn is_available(self) -> bool {
        self <= Isa::detected()
    }

    /// Every instruction set this CPU can run, portable first (the tests run each).
    pub fn available() -> impl Iterator<Item = Isa> {
        Isa::ALL.into_iter().filter(|isa| isa.is_available())
    }
}

/// The rule of the module doc, applied to this CPU.
fn detect() -> Isa {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
    {
        if is_x86_feature_detected!("avx512f") {
            return Isa::Avx512;
        }
        return Isa::Avx2;
    }
    Isa::Portable
}

/// Whether the CPU runs [`Isa::Avx512`] and also has AVX-512BW and VNNI (the int16 decode
/// kernel's zmm version), detected once.
#[cfg(target_arch = "x86_64")]
pub fn avx512_vnni() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        Isa::detected() == Isa::Avx512
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_nest_and_the_detected_one_is_the_best_available() {
        let available: Vec<Isa> = Isa::available().collect();
        assert_eq!(available.first(), Some(&Isa::Portable));
        assert_eq!(available.last(), Some(&Isa::detected()));
        assert_eq!(available, Isa::ALL[..available.len()]);
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            Isa::Avx512.is_available(),
            is_x86_feature_detected!("avx512f") && Isa::Avx2.is_available()
        );
        #[cfg(not(target_arch = "x86_64"))]
        assert_eq!(available, [Isa::Portable]);
    }
}
