//! Prompts that share prefixes, as real traffic does: a few system prompts that many requests
//! start with (`--shared-prefix`, the shape of SGLang's `generated-shared-prefix` dataset), and
//! conversations that re-send their whole history each turn (`--conversation`).
//!
//! Texts are made of four-byte words (a token each, as the simulator and the gateway count),
//! drawn so that two groups' system prompts, and two questions, share no leading block. A
//! reply re-sent in the history is a placeholder of the length the server produced: what
//! matters to a prefix cache is that the next turn re-sends the same bytes.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use rand::rngs::SmallRng;

/// Four-byte words texts are made of.
const WORDS: [&str; 16] = [
    "alfa", "brav", "char", "delt", "echo", "foxt", "golf", "hote", "indi", "juli", "kilo", "lima",
    "mike", "nove", "osca", "papa",
];

/// `tokens` words drawn from `rng`.
pub(crate) fn words(tokens: u32, rng: &mut SmallRng) -> String {
    (0..tokens)
        .map(|_| WORDS[rng.random_range(0..WORDS.len())])
        .collect()
}

/// `--shared-prefix groups=G,system=S,question=Q[,hot=H]`: each request opens with one of `G`
/// system prompts of `S` tokens, then asks a question of `Q` tokens of its own; with `hot`,
/// group 0 takes that share of requests (a hot spot) and the rest spread evenly.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedPrefix {
    /// Number of system prompts.
    pub groups: u32,
    /// Tokens of each system prompt.
    pub system_tokens: u32,
    /// Tokens of each question.
    pub question_tokens: u32,
    /// Share of requests in group 0, if it is hot.
    pub hot: Option<f64>,
    systems: Arc<[Arc<str>]>,
}

impl SharedPrefix {
    /// The group of the next request.
    pub(crate) fn group(&self, rng: &mut SmallRng) -> usize {
        match self.hot {
            Some(hot) if rng.random::<f64>() < hot => 0,
            Some(_) if self.groups > 1 => rng.random_range(1..self.groups as usize),
            _ => rng.random_range(0..self.groups as usize),
        }
    }

    /// The system prompt of `group`.
    pub(crate) fn system(&self, group: usize) -> Arc<str> {
        Arc::clone(&self.systems[group % self.systems.len()])
    }
}

impl FromStr for SharedPrefix {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let fields = fields(
            text,
            &["groups", "system", "question", "hot"],
            "groups=G,system=S,question=Q[,hot=H]",
        )?;
        let count = |name: &str, min: f64| -> Result<u32, String> {
            let v = fields.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
            match v {
                Some(v) if v >= min && v.fract() == 0.0 && v <= 1e6 => Ok(v as u32),
                Some(v) => Err(format!(
                    "--shared-prefix: {name}={v}: give a whole number of at least {min}"
                )),
                None => Err(format!(
                    "--shared-prefix: `{name}=` is missing; write groups=G,system=S,question=Q[,hot=H]"
                )),
            }
        };
        let hot = match fields.iter().find(|(k, _)| k == "hot") {
            Some((_, h)) if (0.0..=1.0).contains(h) => Some(*h),
            Some((_, h)) => {
                return Err(format!(
                    "--shared-prefix: hot={h}: give the hot group's share, 0 to 1"
                ));
            }
            None => None,
        };
        let (groups, system_tokens, question_tokens) = (
            count("groups", 1.0)?,
            count("system", 1.0)?,
            count("question", 0.0)?,
        );
        // The same system prompts for every run with these numbers.
        let mut rng = rand::SeedableRng::seed_from_u64(0x7379_7374_656d);
        let systems = (0..groups)
            .map(|_| Arc::from(words(system_tokens, &mut rng)))
            .collect();
        Ok(Self {
            groups,
            system_tokens,
            question_tokens,
            hot,
            systems,
        })
    }
}

impl fmt::Display for SharedPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "groups={},system={},question={}",
            self.groups, self.system_tokens, self.question_tokens
        )?;
        if let Some(hot) = self.hot {
            write!(f, ",hot={hot}")?;
        }
        Ok(())
    }
}

/// `--conversation turns=T,think_s=X`: each arrival is a conversation of `T` turns, each sent
/// `X` seconds after the previous one ended, re-sending the whole history.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Conversation {
    /// Turns per conversation.
    pub turns: u32,
    /// Pause between a reply and the next question.
    pub think: Duration,
}

impl FromStr for Conversation {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let fields = fields(text, &["turns", "think_s"], "turns=T,think_s=X")?;
        let get = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
        let turns = match get("turns") {
            Some(t) if (1.0..=1000.0).contains(&t) && t.fract() == 0.0 => t as u32,
            Some(t) => return Err(format!("--conversation: turns={t}: give 1 to 1000")),
            None => {
                return Err(
                    "--conversation: `turns=` is missing; write turns=T,think_s=X".to_owned(),
                );
            }
        };
        let think = match get("think_s").unwrap_or(0.0) {
            s if (0.0..=3600.0).contains(&s) => Duration::from_secs_f64(s),
            s => {
                return Err(format!(
                    "--conversation: think_s={s}: give 0 to 3600 seconds"
                ));
            }
        };
        Ok(Self { turns, think })
    }
}

impl fmt::Display for Conversation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "turns={},think_s={}",
            self.turns,
            self.think.as_secs_f64()
        )
    }
}

/// `key=value` pairs of numbers, each key one of `known`.
fn fields(text: &str, known: &[&str], form: &str) -> Result<Vec<(String, f64)>, String> {
    text.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|pair| {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| format!("`{pair}` is not key=value; write {form}"))?;
            let k = k.trim();
            if !known.contains(&k) {
                return Err(format!("unknown key `{k}`; write {form}"));
            }
            let v: f64 = v
                .trim()
                .parse()
                .map_err(|_| format!("{k}=`{v}` is not a number; write {form}"))?;
            Ok((k.to_owned(), v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn shared_prefixes_parse_and_draw_their_groups_with_the_hot_share() {
        let shared: SharedPrefix = "groups=16,system=2000,question=100,hot=0.5"
            .parse()
            .unwrap();
        assert_eq!(shared.system(3).len(), 8000);
        assert_ne!(shared.system(3)[..8], shared.system(4)[..8]);
        let again: SharedPrefix = "groups=16,system=2000,question=100".parse().unwrap();
        assert_eq!(
            shared.system(5),
            again.system(5),
            "the same prompts every run"
        );
        let mut rng = SmallRng::seed_from_u64(1);
        let zeros = (0..4000).filter(|_| shared.group(&mut rng) == 0).count();
        assert!((1800..2200).contains(&zeros), "{zeros}");
    }

    #[test]
    fn bad_shapes_say_how_to_write_them() {
        let err = "groups=4,system=10".parse::<SharedPrefix>().unwrap_err();
        assert!(err.contains("`question=` is missing"), "{err}");
        let err = "groups=4,sys=10,question=1"
            .parse::<SharedPrefix>()
            .unwrap_err();
        assert!(err.contains("unknown key `sys`"), "{err}");
        let err = "turns=0".parse::<Conversation>().unwrap_err();
        assert!(err.contains("give 1 to 1000"), "{err}");
        let c: Conversation = "turns=4,think_s=0.5".parse().unwrap();
        assert_eq!((c.turns, c.think), (4, Duration::from_millis(500)));
    }
}
