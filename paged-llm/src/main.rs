//! The `paged-llm` program: its subcommands live in the library (`paged_llm_cli`), which the
//! Python wheel's console script runs too.

fn main() -> std::process::ExitCode {
    paged_llm_cli::main_with(std::env::args_os())
}
