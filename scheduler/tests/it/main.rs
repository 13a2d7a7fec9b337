//! Integration tests of the scheduler: scenarios with a fake model, and property tests with
//! random arrivals, lengths and aborts over tiny pools.

mod drafts;
mod fake;
mod kv_map;
mod props;
mod scenarios;
