//! A whole (not streamed) answer's usage: its frames kept by reference as they go by (a `Bytes`
//! clone, no copy) and read once, when the body is done, so that a key pays for the tokens the
//! backend reported rather than an estimate. Nothing is parsed on the way out; a body larger
//! than the backend's `max_event_bytes` is not kept, and its estimate stands.

use bytes::{Bytes, BytesMut};

use crate::sse::MAX_PLAUSIBLE_TOKENS;
use crate::sse::events::{StreamDialect, Usage, whole_usage};

/// The frames of one whole answer, until its end.
#[derive(Debug)]
pub(crate) struct WholeUsage {
    dialect: StreamDialect,
    frames: Vec<Bytes>,
    kept: usize,
    max: usize,
}

impl WholeUsage {
    /// For an answer of `dialect` (as the backend sends it) of up to `max` bytes.
    pub(crate) fn new(dialect: StreamDialect, max: usize) -> Self {
        Self {
            dialect,
            frames: Vec::new(),
            kept: 0,
            max,
        }
    }

    /// A frame went by.
    pub(crate) fn frame(&mut self, data: &Bytes) {
        self.kept = self.kept.saturating_add(data.len());
        if self.kept > self.max {
            self.frames = Vec::new();
        } else {
            self.frames.push(data.clone());
        }
    }

    /// The usage the answer reported, if it was whole, within the size and reported one a
    /// generation can reach.
    pub(crate) fn usage(self) -> Option<Usage> {
        if self.kept > self.max {
            return None;
        }
        let body = match self.frames.as_slice() {
            [one] => one.clone(),
            frames => {
                let mut joined = BytesMut::with_capacity(self.kept);
                frames.iter().for_each(|f| joined.extend_from_slice(f));
                joined.freeze()
            }
        };
        let plausible = |n: &u64| *n <= MAX_PLAUSIBLE_TOKENS;
        let u = whole_usage(self.dialect, &body)?;
        Some(Usage {
            prompt_tokens: u.prompt_tokens.filter(plausible),
            output_tokens: Some(u.output_tokens.filter(plausible)?),
            cached_tokens: u.cached_tokens.filter(plausible),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(dialect: StreamDialect, frames: &[&str], max: usize) -> Option<Usage> {
        let mut whole = WholeUsage::new(dialect, max);
        for f in frames {
            whole.frame(&Bytes::copy_from_slice(f.as_bytes()));
        }
        whole.usage()
    }

    #[test]
    fn every_dialect_s_whole_answer_reports_both_counts_even_split_across_frames() {
        let counts = |p, o| {
            Some(Usage {
                prompt_tokens: Some(p),
                output_tokens: Some(o),
                cached_tokens: None,
            })
        };
        let chat = r#"{"id":"c","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":3}}"#;
        let (a, b) = chat.split_at(40);
        assert_eq!(read(StreamDialect::OpenAi, &[a, b], 1 << 20), counts(12, 3));
        let messages = r#"{"type":"message","content":[],"usage":{"input_tokens":5,"cache_read_input_tokens":7,"output_tokens":9}}"#;
        let read_messages = read(StreamDialect::Anthropic, &[messages], 1 << 20);
        assert_eq!(
            read_messages,
            Some(Usage {
                prompt_tokens: Some(12),
                output_tokens: Some(9),
                cached_tokens: Some(7),
            }),
            "Anthropic's input leaves out what the cache served"
        );
        let responses =
            r#"{"object":"response","output":[],"usage":{"input_tokens":4,"output_tokens":2}}"#;
        assert_eq!(
            read(StreamDialect::Responses, &[responses], 1 << 20),
            counts(4, 2)
        );
    }

    #[test]
    fn no_usage_a_cut_body_an_oversized_body_or_an_implausible_count_is_no_usage() {
        let chat = r#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#;
        assert_eq!(
            read(StreamDialect::OpenAi, &[r#"{"choices":[]}"#], 1 << 20),
            None
        );
        assert_eq!(read(StreamDialect::OpenAi, &[&chat[..30]], 1 << 20), None);
        assert_eq!(read(StreamDialect::OpenAi, &[chat], 20), None);
        let huge = r#"{"usage":{"prompt_tokens":1,"completion_tokens":18446744073709551615}}"#;
        assert_eq!(read(StreamDialect::OpenAi, &[huge], 1 << 20), None);
    }
}
