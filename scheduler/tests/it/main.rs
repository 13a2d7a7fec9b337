//! Integration tests of the scheduler: scenarios with a fake model, property tests with random
//! arrivals, lengths and aborts over tiny pools, and the capacity simulator.

mod fake;
mod props;
mod scenarios;
mod sim;
