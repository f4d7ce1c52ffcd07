//! The `tpsgate` binary: parse the command line and hand it to the library.

use std::process::ExitCode;

use clap::Parser;

// Why jemalloc rather than the system allocator: Cargo.toml, beside the dependency.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = tpsgate::cli::Cli::parse();
    tpsgate::cli::run(cli)
}
