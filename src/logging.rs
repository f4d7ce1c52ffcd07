//! Log output on stderr: tracing-subscriber's own human format, or one JSON object per line.
//!
//! The JSON lines are written by a formatter of our own. Every proxied request logs one line,
//! and tracing-subscriber's JSON formatter (serde_json behind a bytes-to-str adaptor, a calendar
//! computation per line) was a large share of a whole proxied request's instructions
//! (docs/benchmarks/overhead.md, "Instructions per request"); this one writes fields straight into the line
//! buffer and formats the date once per second. The shape is the same: `timestamp` (RFC 3339, microseconds, UTC),
//! `level`, the event's fields with `message` among them, `target`. Spans are not written: the
//! gateway opens none.
//!
//! Lines at `info` and below (one per proxied request) are gathered in memory and written when
//! the runtime's thread is about to go idle, or once 32 KiB have gathered: under load, many
//! lines leave in one `write` instead of a system call per request; when idle, a line leaves as
//! soon as the work that logged it is done. Warnings and errors are written at once, after what
//! was gathered before them.

use std::cell::Cell;
use std::fmt::{self, Write as _};
use std::io;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Pretty,
    /// One JSON object per line.
    Json,
}

/// The format [`init`] chose; request lines follow it.
static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// Installs the global subscriber (level from `RUST_LOG`, else `default_filter`, else `info`);
/// a second call keeps the first.
pub(crate) fn init(format: LogFormat, default_filter: Option<&str>) {
    let _ = FORMAT.set(format);
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter.unwrap_or("info")));
    // Colour only for a person at a terminal: codes in a file, a pipe or a log collector are
    // noise (and NO_COLOR, https://no-color.org, turns them off there too).
    let colour =
        io::IsTerminal::is_terminal(&io::stderr()) && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(Stderr);
    let _ = match format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.event_format(JsonLines).try_init(),
    };
}

/// Lines gathered for stderr and not yet written.
static PENDING: Mutex<Vec<u8>> = Mutex::new(Vec::new());

/// Gathered lines are written once there are this many bytes of them.
const PENDING_LIMIT: usize = 32 << 10;

fn pending() -> MutexGuard<'static, Vec<u8>> {
    // A panic while holding the lock leaves whole lines behind: nothing to repair.
    PENDING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes the gathered log lines to stderr. The runtime calls it before its threads go idle;
/// call it before the process exits.
pub(crate) fn flush() {
    let mut lines = {
        let mut gathered = pending();
        // Most calls find nothing: keep the allocation where it is.
        if gathered.is_empty() {
            return;
        }
        std::mem::take(&mut *gathered)
    };
    // Written without the lock held, so that other threads keep logging meanwhile. Nowhere to
    // report a failed write to: the log is stderr.
    let _ = io::Write::write_all(&mut io::stderr().lock(), &lines);
    lines.clear();
    let mut gathered = pending();
    if gathered.is_empty() {
        // Keep the allocation for the next lines.
        *gathered = lines;
    }
}

/// stderr as tracing-subscriber writes to it: see the module's doc.
#[derive(Debug, Clone, Copy)]
struct Stderr;

/// One log line's way out.
enum LineWriter {
    Gathered,
    AtOnce,
}

impl io::Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Gathered => {
                let full = {
                    let mut lines = pending();
                    lines.extend_from_slice(buf);
                    lines.len() >= PENDING_LIMIT
                };
                if full {
                    flush();
                }
                Ok(buf.len())
            }
            Self::AtOnce => {
                flush();
                io::stderr().write(buf)
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> LineWriter {
        LineWriter::AtOnce
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> LineWriter {
        // Levels compare by verbosity: INFO and the more verbose ones are gathered.
        if *meta.level() >= Level::INFO {
            LineWriter::Gathered
        } else {
            LineWriter::AtOnce
        }
    }
}

/// What one proxied request logs when its response ends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestLine<'a> {
    /// The request id (the client's or a minted one).
    pub request_id: &'a str,
    /// The backend that answered, or `-`.
    pub backend: &'a str,
    /// The model the client named, or `-`.
    pub model: &'a str,
    /// The request's class, or `none`.
    pub class: &'a str,
    /// The status the client got.
    pub status: u16,
    /// `ok`, `cancelled` or `upstream_error`.
    pub outcome: &'a str,
    /// Receipt to first content event, for a timed stream.
    pub ttft: Option<Duration>,
    /// Output tokens as the upstream's usage reported them.
    pub output_tokens: Option<u64>,
    /// Body bytes sent to the client.
    pub bytes: u64,
    /// Receipt to the end of the response.
    pub total: Duration,
    /// Why the router chose the backend: its decision's reason, as the route metric names it.
    pub route: &'a str,
}

/// The target request lines are logged under: `RUST_LOG=info,tpsgate::request=off` silences
/// them alone.
pub(crate) const REQUEST_TARGET: &str = "tpsgate::request";

/// Logs one request line at `info`, in the chosen format, with the gathered lines. It is
/// written here rather than through tracing's field-by-field dispatch, which cost about a tenth
/// of a proxied request's instructions; the line is the same as a tracing event with these
/// fields and the message `request` would give.
pub(crate) fn request_line(line: &RequestLine<'_>) {
    if !tracing::enabled!(target: REQUEST_TARGET, Level::INFO) {
        return;
    }
    let Some(&format) = FORMAT.get() else {
        // Someone else's subscriber (the crate used as a library): hand it one event.
        tracing::info!(target: REQUEST_TARGET, fields = %Readable(line), "request");
        return;
    };
    let full = {
        let mut lines = pending();
        let mut out = ByteWriter(&mut lines);
        let _ = match format {
            LogFormat::Json => line.json(&mut out),
            LogFormat::Pretty => line.pretty(&mut out),
        };
        lines.len() >= PENDING_LIMIT
    };
    if full {
        flush();
    }
}

/// One field's value in a request line.
enum Value<'a> {
    Text(&'a str),
    Count(u64),
    Millis(Duration),
}

impl Value<'_> {
    fn write(&self, out: &mut impl fmt::Write) -> fmt::Result {
        match self {
            Self::Text(s) => string(out, s),
            Self::Count(n) => out.write_str(itoa::Buffer::new().format(*n)),
            Self::Millis(d) => millis(out, *d),
        }
    }
}

impl RequestLine<'_> {
    /// The fields in the order they are written; absent ones are left out.
    fn fields(&self) -> [(&'static str, Option<Value<'_>>); 11] {
        [
            ("request_id", Some(Value::Text(self.request_id))),
            ("backend", Some(Value::Text(self.backend))),
            ("model", Some(Value::Text(self.model))),
            ("class", Some(Value::Text(self.class))),
            ("status", Some(Value::Count(u64::from(self.status)))),
            ("outcome", Some(Value::Text(self.outcome))),
            ("ttft_ms", self.ttft.map(Value::Millis)),
            ("output_tokens", self.output_tokens.map(Value::Count)),
            ("bytes", Some(Value::Count(self.bytes))),
            ("total_ms", Some(Value::Millis(self.total))),
            ("route", Some(Value::Text(self.route))),
        ]
    }

    fn json(&self, out: &mut impl fmt::Write) -> fmt::Result {
        out.write_str("{\"timestamp\":\"")?;
        timestamp(out, SystemTime::now())?;
        out.write_str("\",\"level\":\"INFO\",\"message\":\"request\"")?;
        for (name, value) in self.fields() {
            if let Some(value) = value {
                out.write_str(",\"")?;
                out.write_str(name)?;
                out.write_str("\":")?;
                value.write(out)?;
            }
        }
        out.write_str(",\"target\":\"")?;
        out.write_str(REQUEST_TARGET)?;
        out.write_str("\"}\n")
    }

    /// tracing-subscriber's own line shape, without colour.
    fn pretty(&self, out: &mut impl fmt::Write) -> fmt::Result {
        timestamp(out, SystemTime::now())?;
        out.write_str("  INFO ")?;
        out.write_str(REQUEST_TARGET)?;
        out.write_str(": request ")?;
        self.readable(out)?;
        out.write_char('\n')
    }

    /// `name=value` for each field present, space-separated.
    fn readable(&self, out: &mut impl fmt::Write) -> fmt::Result {
        let mut first = true;
        for (name, value) in self.fields() {
            if let Some(value) = value {
                if !first {
                    out.write_char(' ')?;
                }
                first = false;
                out.write_str(name)?;
                out.write_char('=')?;
                value.write(out)?;
            }
        }
        Ok(())
    }
}

/// A request line's fields as text, for a subscriber that is not ours.
struct Readable<'a>(&'a RequestLine<'a>);

impl fmt::Display for Readable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.readable(f)
    }
}

/// Milliseconds with three decimals (microseconds): `12.345`.
fn millis(out: &mut impl fmt::Write, d: Duration) -> fmt::Result {
    let micros = d.as_micros();
    out.write_str(itoa::Buffer::new().format(micros / 1000))?;
    let mut fraction = *b".000";
    write_digits(
        &mut fraction[1..],
        u64::try_from(micros % 1000).unwrap_or(0),
    );
    out.write_str(std::str::from_utf8(&fraction).map_err(|_| fmt::Error)?)
}

/// Writes `n` into `digits` as decimal, zero-padded on the left to the slice's length.
fn write_digits(digits: &mut [u8], mut n: u64) {
    for d in digits.iter_mut().rev() {
        *d = b'0' + u8::try_from(n % 10).unwrap_or(0);
        n /= 10;
    }
}

/// Text into a byte buffer.
struct ByteWriter<'a>(&'a mut Vec<u8>);

impl fmt::Write for ByteWriter<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// Formats each event as one JSON object.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        writer.write_str("{\"timestamp\":\"")?;
        timestamp(&mut writer, SystemTime::now())?;
        writer.write_str("\",\"level\":\"")?;
        writer.write_str(meta.level().as_str())?;
        writer.write_char('"')?;
        let mut fields = Fields {
            out: &mut writer,
            result: Ok(()),
        };
        event.record(&mut fields);
        fields.result?;
        writer.write_str(",\"target\":")?;
        string(&mut writer, meta.target())?;
        writer.write_str("}\n")
    }
}

/// Writes each field as `,"name":value`.
struct Fields<'a, W> {
    out: &'a mut W,
    result: fmt::Result,
}

impl<W: fmt::Write> Fields<'_, W> {
    fn field(&mut self, field: &Field, value: impl FnOnce(&mut W) -> fmt::Result) {
        if self.result.is_ok() {
            self.result = (|| {
                self.out.write_char(',')?;
                string(self.out, field.name())?;
                self.out.write_char(':')?;
                value(self.out)
            })();
        }
    }
}

impl<W: fmt::Write> Visit for Fields<'_, W> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.field(field, |out| string(out, value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.field(field, |out| {
            out.write_str(itoa::Buffer::new().format(value))
        });
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.field(field, |out| {
            out.write_str(itoa::Buffer::new().format(value))
        });
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.field(field, |out| write!(out, "{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // JSON has no NaN or infinity.
        self.field(field, |out| {
            if value.is_finite() {
                out.write_str(ryu::Buffer::new().format_finite(value))
            } else {
                out.write_str("null")
            }
        });
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.field(field, |out| {
            out.write_char('"')?;
            write!(Escaped(out), "{value}")?;
            out.write_char('"')
        });
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.field(field, |out| {
            out.write_char('"')?;
            write!(Escaped(out), "{value:?}")?;
            out.write_char('"')
        });
    }
}

/// A JSON string literal.
fn string(out: &mut impl fmt::Write, s: &str) -> fmt::Result {
    out.write_char('"')?;
    Escaped(out).write_str(s)?;
    out.write_char('"')
}

/// Escapes what it is given for the inside of a JSON string.
struct Escaped<'a, W>(&'a mut W);

impl<W: fmt::Write> fmt::Write for Escaped<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // Almost every string needs nothing: one branch-free pass (it vectorises) says so.
        let special = s.bytes().fold(false, |any, b| {
            any | (b < 0x20) | (b == b'"') | (b == b'\\') | (b == 0x7f)
        });
        if !special {
            return self.0.write_str(s);
        }
        let mut plain = 0;
        for (i, b) in s.bytes().enumerate() {
            let escape = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0..0x20 | 0x7f => "",
                _ => continue,
            };
            self.0.write_str(&s[plain..i])?;
            if escape.is_empty() {
                write!(self.0, "\\u{b:04x}")?;
            } else {
                self.0.write_str(escape)?;
            }
            plain = i + 1;
        }
        self.0.write_str(&s[plain..])
    }
}

/// `2026-11-22T23:59:01.123456Z`; the part up to the second is computed once per second per
/// thread.
/// `unix_s` as an RFC 3339 date and time in UTC to the second, without the zone
/// (`2026-11-25T12:00:00`); the epoch where out of the calendar's range.
pub(crate) fn date_time(unix_s: i64) -> String {
    let at = time::OffsetDateTime::from_unix_timestamp(unix_s)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    )
}

fn timestamp(out: &mut impl fmt::Write, now: SystemTime) -> fmt::Result {
    thread_local! {
        static SECOND: Cell<(u64, [u8; 19])> = const { Cell::new((u64::MAX, [0; 19])) };
    }
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (cached, mut text) = SECOND.get();
    if cached != secs {
        let line = date_time(i64::try_from(secs).unwrap_or(0));
        text.copy_from_slice(line.as_bytes().get(..19).ok_or(fmt::Error)?);
        SECOND.set((secs, text));
    }
    out.write_str(std::str::from_utf8(&text).map_err(|_| fmt::Error)?)?;
    let mut fraction = *b".000000Z";
    write_digits(&mut fraction[1..7], u64::from(since.subsec_micros()));
    out.write_str(std::str::from_utf8(&fraction).map_err(|_| fmt::Error)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(build: impl FnOnce()) -> serde_json::Value {
        let buffer = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = std::sync::Arc::clone(&buffer);
        let subscriber = tracing_subscriber::fmt()
            .event_format(JsonLines)
            .with_writer(move || Sink(std::sync::Arc::clone(&sink)))
            .finish();
        tracing::subscriber::with_default(subscriber, build);
        let bytes = buffer.lock().map(|b| b.clone()).unwrap_or_default();
        let text = String::from_utf8(bytes).unwrap_or_default();
        assert!(
            text.ends_with('\n') && text.matches('\n').count() == 1,
            "{text:?}"
        );
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if let Ok(mut b) = self.0.lock() {
                b.extend_from_slice(buf);
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_json_line_carries_every_field_with_its_type() {
        let v = line(|| {
            tracing::info!(
                request_id = "tg-1",
                status = 200u16,
                delta = -3i64,
                ttft_ms = 12.5,
                missing = f64::NAN,
                cached = true,
                none = None::<u64>,
                "request"
            );
        });
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["message"], "request");
        assert_eq!(v["request_id"], "tg-1");
        assert_eq!(v["status"], 200);
        assert_eq!(v["delta"], -3);
        assert_eq!(v["ttft_ms"], 12.5);
        assert!(v["missing"].is_null());
        assert_eq!(v["cached"], true);
        assert!(v.get("none").is_none(), "an absent Option is left out");
        assert_eq!(v["target"], module_path!());
        let ts = v["timestamp"].as_str().unwrap_or_default();
        assert_eq!(ts.len(), "2026-11-22T23:59:01.123456Z".len(), "{ts}");
        assert!(ts.starts_with("20") && ts.ends_with('Z'), "{ts}");
    }

    #[test]
    fn strings_with_quotes_backslashes_and_control_characters_stay_valid_json() {
        let nasty = "say \"hi\"\\ \n\t\u{1} é";
        let v = line(|| tracing::warn!(reason = nasty, "upstream said {}", nasty));
        assert_eq!(v["reason"], nasty);
        assert_eq!(v["message"], format!("upstream said {nasty}"));
    }

    #[test]
    fn info_lines_wait_for_the_next_flush_and_a_warning_takes_them_out_first() {
        let subscriber = tracing_subscriber::fmt()
            .event_format(JsonLines)
            .with_writer(Stderr)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("(logging test) an info line, gathered");
            assert!(
                String::from_utf8_lossy(&pending()).contains("an info line, gathered"),
                "info lines wait to be written together"
            );
            tracing::warn!("(logging test) a warning, written at once");
            assert!(
                pending().is_empty(),
                "a warning writes what was gathered before it, then itself"
            );
        });
    }

    fn request() -> RequestLine<'static> {
        RequestLine {
            request_id: "tg-1",
            backend: "vllm \"a\"",
            model: "m",
            class: "interactive",
            status: 200,
            outcome: "ok",
            ttft: Some(std::time::Duration::from_micros(12_345)),
            output_tokens: Some(64),
            bytes: 2048,
            total: std::time::Duration::from_micros(1_000_007),
            route: "feasible",
        }
    }

    #[test]
    fn a_request_line_in_json_has_the_fields_of_a_request_event() {
        let mut text = String::new();
        request().json(&mut text).ok();
        assert!(text.ends_with('\n') && text.matches('\n').count() == 1);
        let v: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["message"], "request");
        assert_eq!(v["request_id"], "tg-1");
        assert_eq!(v["backend"], "vllm \"a\"");
        assert_eq!(v["status"], 200);
        assert_eq!(v["ttft_ms"], 12.345);
        assert_eq!(v["output_tokens"], 64);
        assert_eq!(v["bytes"], 2048);
        assert_eq!(v["total_ms"], 1000.007);
        assert_eq!(v["route"], "feasible");
        assert_eq!(v["target"], REQUEST_TARGET);
        let mut no_timing = String::new();
        RequestLine {
            ttft: None,
            output_tokens: None,
            ..request()
        }
        .json(&mut no_timing)
        .ok();
        let v: serde_json::Value = serde_json::from_str(&no_timing).unwrap_or_default();
        assert!(v.get("ttft_ms").is_none() && v.get("output_tokens").is_none());
    }

    #[test]
    fn a_readable_request_line_names_each_field() {
        let mut text = String::new();
        request().pretty(&mut text).ok();
        let after_time = text.split_once("Z  ").map_or("", |(_, rest)| rest);
        assert_eq!(
            after_time,
            "INFO tpsgate::request: request request_id=\"tg-1\" backend=\"vllm \\\"a\\\"\" \
             model=\"m\" class=\"interactive\" status=200 outcome=\"ok\" ttft_ms=12.345 \
             output_tokens=64 bytes=2048 total_ms=1000.007 route=\"feasible\"\n"
        );
    }

    #[test]
    fn under_a_subscriber_not_ours_a_request_line_is_one_event_with_every_field() {
        // `init` never ran in unit tests: the crate is used as a library here.
        let buffer = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = std::sync::Arc::clone(&buffer);
        let theirs = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || Sink(std::sync::Arc::clone(&sink)))
            .finish();
        tracing::subscriber::with_default(theirs, || request_line(&request()));
        let text = buffer
            .lock()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        assert!(
            text.contains("tpsgate::request: request fields=request_id=\"tg-1\" backend="),
            "{text}"
        );
        assert!(text.contains("total_ms=1000.007"), "{text}");
    }

    #[test]
    fn the_timestamp_is_rfc3339_utc_with_microseconds() {
        let mut s = String::new();
        let at = UNIX_EPOCH + std::time::Duration::from_micros(1_795_391_941_000_042);
        timestamp(&mut s, at).ok();
        assert_eq!(s, "2026-11-22T23:59:01.000042Z");
        s.clear();
        timestamp(&mut s, at + std::time::Duration::from_secs(86_400)).ok();
        assert_eq!(
            s, "2026-11-23T23:59:01.000042Z",
            "the cached second is replaced"
        );
    }
}
