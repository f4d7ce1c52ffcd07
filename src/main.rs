//! The `tpsgate` binary: parse the command line and hand it to the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = tpsgate::cli::Cli::parse();
    tpsgate::cli::run(cli)
}
