//! Replaying a recorded trace (`tpsgate bench --trace FILE`): real arrival times, real prompt
//! and output lengths and, where the trace has them, real shared prefixes.
//!
//! Two formats, told apart by their first line:
//! - **Mooncake** JSON Lines (kvcache-ai/Mooncake's traces; also what NVIDIA Dynamo's replay
//!   and aiperf's `mooncake_trace` read): `timestamp` (ms), `input_length`, `output_length`
//!   (tokens) and `hash_ids`, chained hashes of 512-token blocks: two requests share a prompt
//!   prefix exactly as far as their leading hash ids agree.
//! - **Azure** LLM inference CSV (Azure/AzurePublicDataset):
//!   `TIMESTAMP,ContextTokens,GeneratedTokens`, no prefix information.
//!
//! Each request's prompt is built so that its prefixes follow the hash ids: every block is a
//! text drawn from its id alone, so requests whose leading ids agree send the same leading
//! bytes and a prefix cache (the engine's, and the gateway's index of it) sees the sharing the
//! trace recorded. Requests without ids get a prompt of their own from the first byte.
//!
//! `--time-scale` stretches the arrival times (0.5 replays twice as fast), `--token-scale`
//! every length and the block size with them, so that a trace of 15,000-token prompts can run
//! against a small simulated fleet with the same sharing.

use std::path::Path;
use std::time::Duration;

use indicatif::ProgressBar;
use serde::Deserialize;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::client::{HttpClient, Measurement, Prompt, RequestSpec};
use super::stats::{BenchSlo, LevelReport};

/// Tokens per block of a Mooncake trace's `hash_ids`.
pub(crate) const MOONCAKE_BLOCK_TOKENS: f64 = 512.0;

/// One recorded request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TraceRequest {
    /// When it arrived, seconds after the trace's first request.
    pub at_s: f64,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Output tokens.
    pub output_tokens: u32,
    /// The ids of its prompt's blocks, first to last (empty: no prefix information).
    pub blocks: Vec<u64>,
}

/// How a replay stretches the trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Scale {
    /// Arrival times are multiplied by this (0.5: twice as fast).
    pub time: f64,
    /// Prompt and output lengths, and the block size, are multiplied by this.
    pub tokens: f64,
}

/// One Mooncake line. Fields beyond these four (other Mooncake traces carry more) are left.
#[derive(Deserialize)]
struct MooncakeLine {
    timestamp: f64,
    input_length: u32,
    output_length: u32,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

/// Reads a trace; an error names the file, the line and what is wrong with it.
pub(crate) fn load(path: &Path) -> Result<Vec<TraceRequest>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("--trace {}: {e}", path.display()))?;
    parse(&text).map_err(|(line, why)| format!("{}:{line}: {why}", path.display()))
}

/// Parses a trace's text; on a bad line, its number (from 1) and why.
pub(crate) fn parse(text: &str) -> Result<Vec<TraceRequest>, (usize, String)> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty());
    let Some((first_no, first)) = lines.next() else {
        return Err((1, "the trace is empty".into()));
    };
    let mut requests = Vec::new();
    if first.starts_with('{') {
        for (no, line) in std::iter::once((first_no, first)).chain(lines) {
            requests.push(mooncake(line).map_err(|why| (no, why))?);
        }
    } else if first.eq_ignore_ascii_case("TIMESTAMP,ContextTokens,GeneratedTokens") {
        for (no, line) in lines {
            requests.push(azure(line).map_err(|why| (no, why))?);
        }
    } else {
        return Err((
            first_no,
            "not a trace this bench reads: a Mooncake JSON line (`{\"timestamp\": ..., \
             \"input_length\": ..., \"output_length\": ..., \"hash_ids\": [...]}`) or the Azure \
             CSV header `TIMESTAMP,ContextTokens,GeneratedTokens`"
                .into(),
        ));
    }
    // Times from the first request, in arrival order (the Azure trace is sorted, Mooncake's
    // too, but a replay must not depend on it).
    requests.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    let origin = requests.first().map_or(0.0, |r| r.at_s);
    for r in &mut requests {
        r.at_s -= origin;
    }
    Ok(requests)
}

fn mooncake(line: &str) -> Result<TraceRequest, String> {
    let raw: MooncakeLine = serde_json::from_str(line).map_err(|e| {
        format!(
            "not a Mooncake line ({e}): it needs `timestamp` (ms), `input_length` and \
             `output_length` (whole tokens) and may have `hash_ids` (a list of block ids)"
        )
    })?;
    if !(raw.timestamp.is_finite() && raw.timestamp >= 0.0) {
        return Err(format!(
            "`timestamp` {} is not a time: use milliseconds from 0",
            raw.timestamp
        ));
    }
    Ok(TraceRequest {
        at_s: raw.timestamp / 1e3,
        input_tokens: raw.input_length,
        output_tokens: raw.output_length,
        blocks: raw.hash_ids,
    })
}

fn azure(line: &str) -> Result<TraceRequest, String> {
    let fields: Vec<&str> = line.split(',').map(str::trim).collect();
    let [timestamp, context, generated] = fields[..] else {
        return Err(format!(
            "{} fields where the Azure CSV has 3: TIMESTAMP,ContextTokens,GeneratedTokens",
            fields.len()
        ));
    };
    let tokens = |name: &str, v: &str| {
        v.parse::<u32>()
            .map_err(|_| format!("{name} `{v}` is not a whole number of tokens"))
    };
    Ok(TraceRequest {
        at_s: azure_seconds(timestamp)?,
        input_tokens: tokens("ContextTokens", context)?,
        output_tokens: tokens("GeneratedTokens", generated)?,
        blocks: Vec::new(),
    })
}

/// Seconds since 1970 of an Azure timestamp, `YYYY-MM-DD HH:MM:SS[.fraction]` (UTC).
fn azure_seconds(timestamp: &str) -> Result<f64, String> {
    let bad = || {
        format!("TIMESTAMP `{timestamp}` is not a time: write it as `2023-11-16 18:17:03.9799600`")
    };
    let (date, time) = timestamp.split_once(' ').ok_or_else(bad)?;
    let number = |s: &str| s.parse::<i64>().map_err(|_| bad());
    let mut ymd = date.split('-');
    let (Some(y), Some(m), Some(d), None) = (ymd.next(), ymd.next(), ymd.next(), ymd.next()) else {
        return Err(bad());
    };
    let (y, m, d) = (number(y)?, number(m)?, number(d)?);
    let mut hms = time.split(':');
    let (Some(h), Some(min), Some(s), None) = (hms.next(), hms.next(), hms.next(), hms.next())
    else {
        return Err(bad());
    };
    let (h, min) = (number(h)?, number(min)?);
    let s: f64 = s.parse().map_err(|_| bad())?;
    if !(1..=12).contains(&m)
        || !(1..=31).contains(&d)
        || h > 23
        || min > 59
        || !(0.0..61.0).contains(&s)
    {
        return Err(bad());
    }
    Ok((days_from_civil(y, m, d) * 86_400 + h * 3_600 + min * 60) as f64 + s)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

impl Scale {
    /// A length of the trace's, scaled, at least one token.
    fn tokens(&self, n: u32) -> u32 {
        ((f64::from(n) * self.tokens).round() as u32).max(1)
    }
}

/// The prompt of request `index` of a trace: its blocks' texts, each of a block's tokens (four
/// bytes a token) and drawn from its id alone, cut to its scaled length; without ids, a text of
/// its own from the first byte.
pub(crate) fn prompt_of(request: &TraceRequest, index: usize, scale: Scale) -> String {
    let bytes = 4 * scale.tokens(request.input_tokens) as usize;
    let block_bytes = 4 * ((MOONCAKE_BLOCK_TOKENS * scale.tokens).round() as usize).max(1);
    let mut text = String::with_capacity(bytes + block_bytes);
    for id in &request.blocks {
        if text.len() >= bytes {
            break;
        }
        // A block's text: its id, repeated to fill the block.
        let until = (text.len() + block_bytes).min(bytes);
        repeat_until(&mut text, &format!("b{id:x} "), until);
    }
    // Lengths past the blocks the trace lists (all of it, without any): the request's own.
    repeat_until(&mut text, &format!("r{index:x} "), bytes);
    text
}

/// Appends `word` to `text` again and again until it is `len` bytes long (ASCII words only, so
/// that a cut never splits a character).
fn repeat_until(text: &mut String, word: &str, len: usize) {
    while text.len() < len {
        let room = len - text.len();
        text.push_str(&word[..word.len().min(room)]);
    }
}

/// A replay: which requests, how stretched, how scored.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Replay<'a> {
    /// The trace.
    pub requests: &'a [TraceRequest],
    /// How its times and lengths are stretched.
    pub scale: Scale,
    /// Only the arrivals before this many seconds (scaled), if given.
    pub until_s: Option<f64>,
    /// Reports per window of this many seconds of arrivals.
    pub window_s: f64,
    /// What a request must meet to count as good.
    pub slo: Option<BenchSlo>,
    /// A request not complete after this long failed.
    pub limit: Duration,
}

/// Sends every request of the replay at its scaled time, each shaped from `spec` with its
/// prompt and output length, then scores them: one report per window of arrivals (its
/// `window_s` set), then one for the whole replay.
pub(crate) async fn replay(
    client: &HttpClient,
    spec: &RequestSpec,
    replay: &Replay<'_>,
    progress: &ProgressBar,
) -> Vec<LevelReport> {
    let Replay {
        requests,
        scale,
        until_s,
        window_s,
        slo,
        limit,
    } = *replay;
    let start = Instant::now();
    let mut inflight = JoinSet::new();
    for (index, request) in requests.iter().enumerate() {
        let at = request.at_s * scale.time;
        if until_s.is_some_and(|until| at > until) {
            break;
        }
        tokio::time::sleep_until(start + Duration::from_secs_f64(at)).await;
        let prompt = Prompt::Text(prompt_of(request, index, scale).into());
        // Named by its place in the trace, so that a simulator draws it the same speed on
        // every replay (`RequestSpec::named`).
        let spec = spec
            .with_shape(prompt, scale.tokens(request.output_tokens))
            .named(&format!("trace-{index}"));
        let (client, progress) = (client.clone(), progress.clone());
        inflight.spawn(async move {
            let sample = super::timed(&client, &spec, limit).await;
            progress.inc(1);
            (at, sample)
        });
    }
    let mut samples: Vec<(f64, Measurement)> = inflight.join_all().await;
    samples.sort_by(|a, b| a.0.total_cmp(&b.0));
    let last = samples.last().map_or(0.0, |s| s.0);
    let windows = (last / window_s).floor() as usize + 1;
    let mut reports: Vec<LevelReport> = (0..windows)
        .map(|k| {
            let (from, to) = (k as f64 * window_s, (k + 1) as f64 * window_s);
            let mine: Vec<Measurement> = samples
                .iter()
                .filter(|(at, _)| (from..to).contains(at))
                .map(|(_, s)| s.clone())
                .collect();
            score(&mine, slo, window_s, Some([from, to]))
        })
        .collect();
    let all: Vec<Measurement> = samples.into_iter().map(|(_, s)| s).collect();
    reports.push(score(&all, slo, windows as f64 * window_s, None));
    reports
}

/// The report of `samples`, which arrived over `span_s` seconds (the window, if it is one).
fn score(
    samples: &[Measurement],
    slo: Option<BenchSlo>,
    span_s: f64,
    window: Option<[f64; 2]>,
) -> LevelReport {
    let tokens: f64 = samples
        .iter()
        .filter(|s| s.error.is_none())
        .map(|s| f64::from(s.output_tokens))
        .sum();
    let mut report = LevelReport::from_samples(samples, tokens / span_s.max(1e-9));
    report.window_s = window;
    if let Some(slo) = slo {
        let good = samples.iter().filter(|s| slo.met(s)).count();
        report.slo = Some(slo);
        report.slo_attainment = (!samples.is_empty()).then(|| good as f64 / samples.len() as f64);
        report.goodput_rps = Some(good as f64 / span_s.max(1e-9));
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mooncake_trace_reads_as_requests_from_its_first_arrival() {
        let text = r#"{"timestamp": 1000, "input_length": 1030, "output_length": 6, "hash_ids": [0, 1, 2]}

{"timestamp": 1500, "input_length": 600, "output_length": 4, "hash_ids": [0, 7], "extra": 1}
"#;
        let got = parse(text).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[0],
            TraceRequest {
                at_s: 0.0,
                input_tokens: 1030,
                output_tokens: 6,
                blocks: vec![0, 1, 2],
            }
        );
        assert!((got[1].at_s - 0.5).abs() < 1e-12);
    }

    #[test]
    fn an_azure_trace_reads_its_timestamps_to_the_fraction_of_a_second() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                    2023-11-16 18:17:03.9799600,4808,10\n\
                    2023-11-16 18:17:04.0319600,3180,8\n\
                    2023-11-17 00:00:00.5,1,1\n";
        let got = parse(text).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!((got[0].input_tokens, got[0].output_tokens), (4808, 10));
        assert!((got[1].at_s - 0.052).abs() < 1e-6, "{got:?}");
        // Past midnight: 5 h 42 min 56.52 s later.
        assert!((got[2].at_s - (5.0 * 3600.0 + 42.0 * 60.0 + 56.52004)).abs() < 1e-6);
        assert!(got.iter().all(|r| r.blocks.is_empty()));
    }

    #[test]
    fn a_bad_line_is_named_by_its_number_and_what_is_wrong() {
        let mooncake = "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1}\n\
                        {\"timestamp\": 10, \"input_length\": -5, \"output_length\": 1}\n";
        let (line, why) = parse(mooncake).unwrap_err();
        assert_eq!(line, 2);
        assert!(why.contains("input_length"), "{why}");
        let azure = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                     2023-11-16 18:17:03.9799600,4808,10\n\
                     2023-11-16 18:17:04,3180\n";
        let (line, why) = parse(azure).unwrap_err();
        assert_eq!(line, 3);
        assert!(
            why.contains("3: TIMESTAMP,ContextTokens,GeneratedTokens"),
            "{why}"
        );
        let (line, why) =
            parse("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n").unwrap_err();
        assert_eq!(line, 2);
        assert!(why.contains("TIMESTAMP `yesterday`"), "{why}");
        let (line, _) = parse("\nhello\n").unwrap_err();
        assert_eq!(line, 2);
        let err = load(Path::new("/nonexistent/trace.jsonl")).unwrap_err();
        assert!(err.contains("/nonexistent/trace.jsonl"), "{err}");
    }

    #[test]
    fn prompts_share_exactly_the_prefix_their_block_ids_share() {
        let scale = Scale {
            time: 1.0,
            tokens: 0.125,
        };
        let request = |blocks: Vec<u64>, input_tokens| TraceRequest {
            at_s: 0.0,
            input_tokens,
            output_tokens: 1,
            blocks,
        };
        // 512-token blocks scaled to 64 tokens, 256 bytes.
        let a = prompt_of(&request(vec![1, 2, 3], 1536), 0, scale);
        let b = prompt_of(&request(vec![1, 2, 9], 1536), 1, scale);
        assert_eq!(a.len(), 4 * 192);
        let common = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
        assert!((512..512 + 8).contains(&common), "{common}");
        // A partial last block, and lengths past the blocks listed.
        assert_eq!(prompt_of(&request(vec![1], 100), 2, scale).len(), 4 * 13);
        assert_eq!(prompt_of(&request(vec![1], 1000), 3, scale).len(), 4 * 125);
        // Without ids, requests share nothing from the first bytes.
        let (x, y) = (
            prompt_of(&request(vec![], 512), 4, scale),
            prompt_of(&request(vec![], 512), 5, scale),
        );
        assert_ne!(x[..4], y[..4]);
        assert_eq!(x.len(), 256);
    }
}
