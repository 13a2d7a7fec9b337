//! Capacity simulator tests (filled in with the paged simulation).
