//! Request mixes: what each bench request asks for. Prompt and output lengths are drawn from a
//! distribution (fixed, uniform, or normal within bounds), or prompts are taken from a file of
//! recorded conversations (ShareGPT's shape: the first user turn is the prompt), with a seed, so
//! that a sweep offers a server what its users send and two runs offer the same.

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use rand::Rng;
use rand::rngs::SmallRng;
use serde_json::Value;

use super::client::{Prompt, RequestSpec};
use super::conversation::{Conversation, SharedPrefix, words};

/// How many tokens: one length, or a distribution of them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Lengths {
    /// Always this many.
    Fixed(u32),
    /// Any of `min..=max`, equally likely.
    Uniform {
        /// Fewest.
        min: u32,
        /// Most.
        max: u32,
    },
    /// Normal with this mean and standard deviation, clamped into `min..=max`.
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        sd: f64,
        /// Fewest.
        min: u32,
        /// Most.
        max: u32,
    },
}

/// How to write a length distribution (for error messages).
const LENGTHS_FORMS: &str =
    "write N, uniform:min=N,max=N or normal:mean=N,sd=N,min=N,max=N (tokens)";

impl Lengths {
    /// One length.
    pub(crate) fn draw(&self, rng: &mut SmallRng) -> u32 {
        match *self {
            Self::Fixed(n) => n,
            Self::Uniform { min, max } => rng.random_range(min..=max),
            Self::Normal { mean, sd, min, max } => {
                // Box-Muller: a standard normal from two uniforms, u1 in (0, 1].
                let u1 = 1.0 - rng.random::<f64>();
                let u2 = rng.random::<f64>();
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                (mean + sd * z)
                    .round()
                    .clamp(f64::from(min), f64::from(max)) as u32
            }
        }
    }

    /// The typical length: the fixed one, or the distribution's middle.
    pub(crate) fn typical(&self) -> u32 {
        match *self {
            Self::Fixed(n) => n,
            Self::Uniform { min, max } => min + (max - min) / 2,
            Self::Normal { mean, min, max, .. } => {
                mean.round().clamp(f64::from(min), f64::from(max)) as u32
            }
        }
    }

    fn is_fixed(&self) -> bool {
        matches!(self, Self::Fixed(_))
    }
}

impl FromStr for Lengths {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("`{text}`: {why}; {LENGTHS_FORMS}");
        let (kind, params) = text.split_once(':').unwrap_or((text, ""));
        let mut fields = std::collections::BTreeMap::new();
        for pair in params.split(',').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| bad(&format!("`{pair}` is not KEY=VALUE")))?;
            let value: f64 = value
                .trim()
                .parse()
                .map_err(|_| bad(&format!("{key} is not a number")))?;
            if !(value.is_finite() && value >= 0.0 && value <= f64::from(u32::MAX)) {
                return Err(bad(&format!("{key} is out of range")));
            }
            fields.insert(key.trim(), value);
        }
        let take = |fields: &mut std::collections::BTreeMap<&str, f64>, key: &str| {
            fields
                .remove(key)
                .ok_or_else(|| bad(&format!("{kind} needs {key}")))
        };
        let lengths = match kind.trim() {
            "uniform" => {
                let min = take(&mut fields, "min")? as u32;
                let max = take(&mut fields, "max")? as u32;
                Self::Uniform { min, max }
            }
            "normal" => Self::Normal {
                mean: take(&mut fields, "mean")?,
                sd: take(&mut fields, "sd")?,
                min: take(&mut fields, "min")? as u32,
                max: take(&mut fields, "max")? as u32,
            },
            n => Self::Fixed(n.parse().map_err(|_| bad("not a length"))?),
        };
        if let Some(key) = fields.keys().next() {
            return Err(bad(&format!("{kind} takes no {key}")));
        }
        match lengths {
            Self::Uniform { min, max } | Self::Normal { min, max, .. } if min > max => {
                Err(bad("min is above max"))
            }
            _ => Ok(lengths),
        }
    }
}

impl fmt::Display for Lengths {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Fixed(n) => write!(f, "{n}"),
            Self::Uniform { min, max } => write!(f, "uniform:min={min},max={max}"),
            Self::Normal { mean, sd, min, max } => {
                write!(f, "normal:mean={mean},sd={sd},min={min},max={max}")
            }
        }
    }
}

/// What the requests of a run ask for.
#[derive(Debug, Clone)]
pub struct Mix {
    /// Prompt lengths (unused with `prompts`).
    pub prompt: Lengths,
    /// Output lengths (`max_tokens`).
    pub output: Lengths,
    /// Prompts to draw from, and the file they came from.
    pub prompts: Option<(Arc<[Arc<str>]>, String)>,
    /// The seed of the draws, if given.
    pub seed: Option<u64>,
    /// System prompts that requests share (`--shared-prefix`).
    pub shared: Option<SharedPrefix>,
    /// Each arrival a conversation of several turns (`--conversation`).
    pub conversation: Option<Conversation>,
}

impl Mix {
    /// Every request the same: `prompt` tokens in, `output` out.
    pub fn fixed(prompt: u32, output: u32) -> Self {
        Self {
            prompt: Lengths::Fixed(prompt),
            output: Lengths::Fixed(output),
            prompts: None,
            seed: None,
            shared: None,
            conversation: None,
        }
    }

    /// Whether every request is the same (nothing to draw).
    pub(crate) fn is_fixed(&self) -> bool {
        self.prompts.is_none()
            && self.shared.is_none()
            && self.prompt.is_fixed()
            && self.output.is_fixed()
    }

    /// The same mix with every output `max_tokens` long.
    #[must_use]
    pub(crate) fn with_output(&self, max_tokens: u32) -> Self {
        Self {
            output: Lengths::Fixed(max_tokens),
            ..self.clone()
        }
    }

    /// `spec` reshaped into the next request of the mix.
    pub(crate) fn draw(&self, spec: &RequestSpec, rng: &mut SmallRng) -> RequestSpec {
        if self.is_fixed() {
            return spec.clone();
        }
        let prompt = match (&self.shared, &self.prompts) {
            (Some(shared), _) => Prompt::Chat {
                system: Some(shared.system(shared.group(rng))),
                turns: Arc::new([Arc::from(words(shared.question_tokens, rng))]),
            },
            (None, Some((prompts, _))) => {
                Prompt::Text(Arc::clone(&prompts[rng.random_range(0..prompts.len())]))
            }
            (None, None) => Prompt::Words(self.prompt.draw(rng)),
        };
        spec.with_shape(prompt, self.output.draw(rng))
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.shared, &self.prompts) {
            (Some(shared), _) => write!(f, "shared prefix {shared}")?,
            (None, Some((prompts, file))) => {
                write!(f, "prompts from {file} ({} of them)", prompts.len())?;
            }
            (None, None) => write!(f, "prompt tokens {}", self.prompt)?,
        }
        if let Some(conversation) = &self.conversation {
            write!(f, ", conversations {conversation}")?;
        }
        write!(f, ", output tokens {}", self.output)?;
        if let Some(seed) = self.seed {
            write!(f, ", seed {seed}")?;
        }
        Ok(())
    }
}

/// The prompts of a conversation file: JSON Lines, or one JSON array (ShareGPT's own files).
/// Each record gives its first user turn: `conversations: [{from: human|user, value}]`
/// (ShareGPT), `messages: [{role: user, content}]` (OpenAI), or `prompt`. Records without one
/// are skipped; a file without any is an error.
pub(crate) fn load_prompts(file: &Path) -> Result<Arc<[Arc<str>]>, String> {
    let name = file.display();
    let text =
        std::fs::read_to_string(file).map_err(|e| format!("--prompts {name}: cannot read: {e}"))?;
    let records: Vec<Value> = if text.trim_start().starts_with('[') {
        serde_json::from_str(&text).map_err(|e| format!("--prompts {name}: {e}"))?
    } else {
        let mut records = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            records.push(
                serde_json::from_str(line)
                    .map_err(|e| format!("--prompts {name}:{}: {e}", i + 1))?,
            );
        }
        records
    };
    let prompts: Arc<[Arc<str>]> = records.iter().filter_map(first_user_turn).collect();
    if prompts.is_empty() {
        return Err(format!(
            "--prompts {name}: no prompts found: each record needs conversations[] with a turn from human (ShareGPT), messages[] with a user turn, or a prompt string"
        ));
    }
    Ok(prompts)
}

fn first_user_turn(record: &Value) -> Option<Arc<str>> {
    let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(Arc::from);
    if let Some(turns) = record["conversations"].as_array() {
        return turns
            .iter()
            .find(|t| matches!(t["from"].as_str(), Some("human" | "user")))
            .and_then(|t| text(&t["value"]));
    }
    if let Some(turns) = record["messages"].as_array() {
        return turns
            .iter()
            .find(|t| t["role"] == "user")
            .and_then(|t| text(&t["content"]));
    }
    text(&record["prompt"])
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn lengths_are_written_as_they_print() {
        for text in [
            "128",
            "uniform:min=64,max=512",
            "normal:mean=256,sd=64,min=32,max=1024",
        ] {
            let lengths: Lengths = text.parse().unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(lengths.to_string(), text);
        }
    }

    #[test]
    fn a_bad_length_says_how_to_write_one() {
        for (text, says) in [
            ("many", "not a length"),
            ("uniform:min=5", "uniform needs max"),
            ("uniform:min=9,max=5", "min is above max"),
            (
                "normal:mean=5,sd=1,min=1,max=9,skew=2",
                "normal takes no skew",
            ),
            ("uniform:min=-1,max=5", "min is out of range"),
        ] {
            let err = text.parse::<Lengths>().unwrap_err();
            assert!(
                err.contains(says) && err.contains("uniform:min=N,max=N"),
                "{text}: {err}"
            );
        }
    }

    #[test]
    fn draws_stay_in_bounds_and_centre_where_asked() {
        let mut rng = SmallRng::seed_from_u64(7);
        let uniform = Lengths::Uniform { min: 10, max: 20 };
        let normal = Lengths::Normal {
            mean: 100.0,
            sd: 30.0,
            min: 80,
            max: 200,
        };
        let u: Vec<u32> = (0..4000).map(|_| uniform.draw(&mut rng)).collect();
        let n: Vec<u32> = (0..4000).map(|_| normal.draw(&mut rng)).collect();
        assert!(u.iter().all(|x| (10..=20).contains(x)));
        assert!(u.contains(&10) && u.contains(&20));
        assert!(n.iter().all(|x| (80..=200).contains(x)));
        let mean = |v: &[u32]| v.iter().map(|x| f64::from(*x)).sum::<f64>() / v.len() as f64;
        assert!((mean(&u) - 15.0).abs() < 0.3, "{}", mean(&u));
        // Clamped below at 80 (a quarter of the draws): the mean moves up from 100 to
        // 80·Φ(−2/3) + 100·(1 − Φ(−2/3)) + 30·φ(2/3) ≈ 104.5.
        assert!((102.5..106.5).contains(&mean(&n)), "{}", mean(&n));
    }

    #[test]
    fn the_same_seed_draws_the_same_requests() {
        let spec = RequestSpec::new(
            "http://127.0.0.1:1",
            super::super::BenchDialect::Openai,
            "m",
            64,
            128,
            Vec::new(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mix = Mix {
            shared: None,
            conversation: None,
            prompt: Lengths::Uniform { min: 1, max: 1000 },
            output: Lengths::Uniform { min: 1, max: 1000 },
            prompts: None,
            seed: Some(3),
        };
        let run = |seed| {
            let mut rng = SmallRng::seed_from_u64(seed);
            (0..20)
                .map(|_| {
                    let r = mix.draw(&spec, &mut rng);
                    (r.prompt_tokens(), r.max_tokens)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(4));
    }

    #[test]
    fn a_sharegpt_file_gives_each_conversations_first_user_turn() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let lines = [
            r#"{"id":"a","conversations":[{"from":"system","value":"be brief"},{"from":"human","value":"first question"},{"from":"gpt","value":"answer"},{"from":"human","value":"second"}]}"#,
            r#"{"messages":[{"role":"user","content":"openai shaped"}]}"#,
            r#"{"prompt":"plain"}"#,
            r#"{"conversations":[{"from":"gpt","value":"no user turn"}]}"#,
            "",
        ];
        let jsonl = dir.path().join("convs.jsonl");
        std::fs::write(&jsonl, lines.join("\n")).unwrap_or_else(|e| panic!("{e}"));
        let prompts = load_prompts(&jsonl).unwrap_or_else(|e| panic!("{e}"));
        let texts: Vec<&str> = prompts.iter().map(|p| &**p).collect();
        assert_eq!(texts, ["first question", "openai shaped", "plain"]);

        let array = dir.path().join("sharegpt.json");
        std::fs::write(&array, format!("[{},{}]", lines[0], lines[2]))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(load_prompts(&array).map(|p| p.len()), Ok(2));

        let broken = dir.path().join("broken.jsonl");
        std::fs::write(&broken, "{\"prompt\":\"ok\"}\n{not json\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let err = load_prompts(&broken).unwrap_err();
        assert!(err.contains("broken.jsonl:2:"), "{err}");
        let empty = dir.path().join("empty.jsonl");
        std::fs::write(&empty, lines[3]).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            load_prompts(&empty)
                .unwrap_err()
                .contains("no prompts found")
        );
    }
}
