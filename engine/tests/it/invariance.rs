//! Batch invariance (placeholder replaced below).
