//! The `tpsgate` binary: the library's `main`, with the allocator the binary runs on.

use std::process::ExitCode;

// Why jemalloc rather than the system allocator: Cargo.toml, beside the dependency.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    tpsgate::main()
}
