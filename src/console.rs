//! The one place the binary writes to stdout (its logs go to stderr through tracing).

/// Prints one line to stdout: the only place the binary writes there. A closed stdout (a pipe
/// whose reader left) loses the line instead of panicking as `println!` would.
pub(crate) fn say(line: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
}

/// Rewrites the terminal's current line with `line` (a status that updates in place): for a
/// terminal only; elsewhere, [`say`] it.
pub(crate) fn status(line: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    // Carriage return, then erase to the end of the line.
    let _ = write!(out, "\r\x1b[K{line}");
    let _ = out.flush();
}
