//! [`Timed`]: any backend's [`DecoderOps`] with the wall time of every op added to a
//! [`StepProfile`], phase by phase (each projection apart, attention, norms, rope, the gated
//! activation): where a step's time goes, for the bench report. The ops run as they would
//! untimed; a clock is read around each, which costs well under a microsecond an op.

use std::time::Instant;

use attn_kernels::AttnScores;

use super::{Buf, DecoderOps, LinearOut, MatrixId, NormId};
use crate::arch::{Activation, LayerMatrix, RopeKind};

/// The phases of a step a profile tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Embed,
    /// RMSNorms of the residual stream, of heads, and the final one.
    Norms,
    /// The fused Q/K/V projection (and its split into Q, K and V).
    Qkv,
    Rope,
    /// The cache write and paged attention.
    Attention,
    /// The output projection (with the residual add).
    O,
    GateUp,
    /// The gated activation.
    Act,
    /// The down projection (with the residual add).
    Down,
    /// Residual adds and softcaps written as ops of their own.
    Elementwise,
    LmHead,
}

impl Phase {
    pub const ALL: [Phase; 11] = [
        Phase::Embed,
        Phase::Norms,
        Phase::Qkv,
        Phase::Rope,
        Phase::Attention,
        Phase::O,
        Phase::GateUp,
        Phase::Act,
        Phase::Down,
        Phase::Elementwise,
        Phase::LmHead,
    ];

    /// The phase's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Embed => "embedding",
            Phase::Norms => "norms",
            Phase::Qkv => "matmul q/k/v",
            Phase::Rope => "rope",
            Phase::Attention => "attention (cache write + paged)",
            Phase::O => "matmul o (+ residual)",
            Phase::GateUp => "matmul gate/up",
            Phase::Act => "gated activation",
            Phase::Down => "matmul down (+ residual)",
            Phase::Elementwise => "adds, softcaps",
            Phase::LmHead => "matmul LM head",
        }
    }

    /// Whether the phase is a matrix multiplication.
    pub fn is_matmul(self) -> bool {
        matches!(self, Phase::Qkv | Phase::O | Phase::GateUp | Phase::Down | Phase::LmHead)
    }
}

/// Seconds spent in each [`Phase`], summed over the steps profiled into it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepProfile {
    secs: [f64; Phase::ALL.len()],
}

impl StepProfile {
    /// Seconds in `phase`.
    pub fn secs(&self, phase: Phase) -> f64 {
        self.secs[phase as usize]
    }

    /// Seconds in every phase together.
    pub fn total(&self) -> f64 {
        self.secs.iter().sum()
    }

    fn add(&mut self, phase: Phase, secs: f64) {
        self.secs[phase as usize] += secs;
    }
}

/// A backend whose ops are timed into `profile`.
#[derive(Debug)]
pub struct Timed<'p, B> {
    pub inner: B,
    pub profile: &'p mut StepProfile,
}

impl<B> Timed<'_, B> {
    fn time<T>(&mut self, phase: Phase, op: impl FnOnce(&mut B) -> T) -> T {
        let start = Instant::now();
        let out = op(&mut self.inner);
        self.profile.add(phase, start.elapsed().as_secs_f64());
        out
    }
}

fn matrix_phase(matrix: MatrixId) -> Phase {
    match matrix {
        MatrixId::Layer(_, LayerMatrix::Qkv) => Phase::Qkv,
        MatrixId::Layer(_, LayerMatrix::O) => Phase::O,
        MatrixId::Layer(_, LayerMatrix::GateUp) => Phase::GateUp,
        MatrixId::Layer(_, LayerMatrix::Down) => Phase::Down,
        MatrixId::LmHead => Phase::LmHead,
    }
}

impl<B: DecoderOps> DecoderOps for Timed<'_, B> {
    type Error = B::Error;

    fn embed(&mut self, scale: Option<f32>) -> Result<(), Self::Error> {
        self.time(Phase::Embed, |b| b.embed(scale))
    }

    fn rms_norm(&mut self, out: Buf, input: Buf, norm: NormId) -> Result<(), Self::Error> {
        self.time(Phase::Norms, |b| b.rms_norm(out, input, norm))
    }

    fn head_norm(&mut self, buf: Buf, norm: NormId) -> Result<(), Self::Error> {
        self.time(Phase::Norms, |b| b.head_norm(buf, norm))
    }

    fn linear(&mut self, out: LinearOut, input: Buf, matrix: MatrixId) -> Result<(), Self::Error> {
        self.time(matrix_phase(matrix), |b| b.linear(out, input, matrix))
    }

    fn lora(&mut self, out: LinearOut, input: Buf, matrix: MatrixId) -> Result<(), Self::Error> {
        self.time(matrix_phase(matrix), |b| b.lora(out, input, matrix))
    }

    fn rope(&mut self, kind: RopeKind) -> Result<(), Self::Error> {
        self.time(Phase::Rope, |b| b.rope(kind))
    }

    fn attention(&mut self, layer: usize, scores: AttnScores) -> Result<(), Self::Error> {
        self.time(Phase::Attention, |b| b.attention(layer, scores))
    }

    fn gated_act(&mut self, act: Activation) -> Result<(), Self::Error> {
        self.time(Phase::Act, |b| b.gated_act(act))
    }

    fn add(&mut self, out: Buf, input: Buf) -> Result<(), Self::Error> {
        self.time(Phase::Elementwise, |b| b.add(out, input))
    }

    fn softcap(&mut self, buf: Buf, cap: f32) -> Result<(), Self::Error> {
        self.time(Phase::Elementwise, |b| b.softcap(buf, cap))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ops that sleep a known time per phase, and record what reached them.
    #[derive(Default)]
    struct Sleepy {
        calls: Vec<&'static str>,
    }

    impl Sleepy {
        fn op(&mut self, name: &'static str, ms: u64) -> Result<(), ()> {
            self.calls.push(name);
            std::thread::sleep(std::time::Duration::from_millis(ms));
            Ok(())
        }
    }

    impl DecoderOps for Sleepy {
        type Error = ();
        fn embed(&mut self, _: Option<f32>) -> Result<(), ()> {
            self.op("embed", 0)
        }
        fn rms_norm(&mut self, _: Buf, _: Buf, _: NormId) -> Result<(), ()> {
            self.op("norm", 0)
        }
        fn head_norm(&mut self, _: Buf, _: NormId) -> Result<(), ()> {
            self.op("head_norm", 0)
        }
        fn linear(&mut self, _: LinearOut, _: Buf, m: MatrixId) -> Result<(), ()> {
            match m {
                MatrixId::LmHead => self.op("lm_head", 20),
                _ => self.op("linear", 0),
            }
        }
        fn lora(&mut self, _: LinearOut, _: Buf, _: MatrixId) -> Result<(), ()> {
            Ok(())
        }
        fn rope(&mut self, _: RopeKind) -> Result<(), ()> {
            self.op("rope", 0)
        }
        fn attention(&mut self, _: usize, _: AttnScores) -> Result<(), ()> {
            self.op("attention", 10)
        }
        fn gated_act(&mut self, _: Activation) -> Result<(), ()> {
            self.op("act", 0)
        }
        fn add(&mut self, _: Buf, _: Buf) -> Result<(), ()> {
            self.op("add", 0)
        }
        fn softcap(&mut self, _: Buf, _: f32) -> Result<(), ()> {
            self.op("softcap", 0)
        }
    }

    #[test]
    fn each_op_reaches_the_backend_and_its_time_lands_in_its_phase() {
        let mut profile = StepProfile::default();
        let mut timed = Timed { inner: Sleepy::default(), profile: &mut profile };
        timed.attention(0, AttnScores { scale: 1.0, sliding_window: None }).unwrap();
        timed.linear(LinearOut::Write(Buf::Logits), Buf::Sampled, MatrixId::LmHead).unwrap();
        timed.linear(LinearOut::Add(Buf::Hidden), Buf::Act, MatrixId::Layer(0, LayerMatrix::Down)).unwrap();
        timed.rms_norm(Buf::Normed, Buf::Hidden, NormId::Final).unwrap();
        assert_eq!(timed.inner.calls, ["attention", "lm_head", "linear", "norm"]);
        // Lower bounds only: a loaded machine may oversleep, never undersleep.
        assert!(profile.secs(Phase::Attention) >= 0.010);
        assert!(profile.secs(Phase::LmHead) >= 0.020);
        assert!(profile.secs(Phase::Down) > 0.0 && profile.secs(Phase::Norms) > 0.0);
        assert_eq!(profile.secs(Phase::Qkv) + profile.secs(Phase::Rope) + profile.secs(Phase::Act), 0.0);
        assert!((profile.total() - Phase::ALL.iter().map(|&p| profile.secs(p)).sum::<f64>()).abs() < 1e-12);
    }
}
