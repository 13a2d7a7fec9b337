//! Tests of the `paged-llm` program as users run it: its command line, `serve`'s shutdown,
//! `bench latency` and `throughput`, and `bench serve` against a running server.

mod bench_offline;
mod bench_serve;
mod cli;
mod shutdown;
mod support;
