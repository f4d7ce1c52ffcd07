//! Which backends serve a client's model name ([`Served`], resolved when the router is built: a
//! decision walks the backends of its model, not every backend's model map), and where requests
//! naming no model go ([`Entries`]).

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::{BackendDialect, ModelMap};
use crate::fleet::Backend;

/// Backend indices by the client model names they serve, each list in config order.
#[derive(Debug, Default)]
pub(crate) struct Served {
    /// The backends naming a model among their `models` (passing names through or not).
    by_name: HashMap<Box<str>, Vec<usize>, foldhash::fast::RandomState>,
    /// The backends that pass any other name through (`models.passthrough`).
    passthrough: Vec<usize>,
}

impl Served {
    pub(crate) fn new(backends: &[Arc<Backend>]) -> Self {
        let mut served = Self::default();
        for (i, b) in backends.iter().enumerate() {
            for name in b.config.models.aliases.keys() {
                served
                    .by_name
                    .entry(name.as_str().into())
                    .or_default()
                    .push(i);
            }
            if b.config.models.passthrough {
                served.passthrough.push(i);
            }
        }
        served
    }

    /// The backends serving `model`, in config order: those naming it, merged with those
    /// passing names through (a backend doing both comes once).
    pub(crate) fn of(&self, model: &str) -> impl Iterator<Item = usize> + '_ {
        let named: &[usize] = self.by_name.get(model).map_or(&[], Vec::as_slice);
        let mut named = named.iter().copied().peekable();
        let mut through = self.passthrough.iter().copied().peekable();
        std::iter::from_fn(move || match (named.peek(), through.peek()) {
            (Some(&a), Some(&b)) if a == b => {
                through.next();
                named.next()
            }
            (Some(&a), Some(&b)) if b < a => through.next(),
            (Some(_), _) => named.next(),
            (None, _) => through.next(),
        })
    }
}

/// What the config's entries say beyond the backends themselves: where bodies naming no model
/// go (uploads, transcriptions; backends by index, each list one backend or a discovered
/// entry's members), and the discovered entries that stand for no backend at the moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entries {
    /// `default_backend`'s, if one is configured.
    pub default: Option<Vec<usize>>,
    /// A `routes[]` rule's, by exact path (first match wins).
    pub by_path: Vec<(String, Vec<usize>)>,
    /// Discovered entries whose host resolves to no address now, each with its dialect and
    /// models: their models are there, their backends are not (503, not 404).
    pub vacant: Vec<Vacant>,
}

/// A discovered entry whose host resolves to no address now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vacant {
    /// The entry's name.
    pub name: Arc<str>,
    /// Its dialect.
    pub dialect: BackendDialect,
    /// Whether it translates for clients of the other dialect.
    pub translate: bool,
    /// Its models.
    pub models: ModelMap,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(named: &[(&str, &[usize])], passthrough: &[usize]) -> Served {
        Served {
            by_name: named
                .iter()
                .map(|(n, list)| ((*n).into(), list.to_vec()))
                .collect(),
            passthrough: passthrough.to_vec(),
        }
    }

    #[test]
    fn a_model_is_served_by_the_backends_naming_it_and_those_passing_names_through_in_order() {
        let s = served(&[("m", &[0, 3, 5])], &[1, 3, 6]);
        assert_eq!(s.of("m").collect::<Vec<_>>(), [0, 1, 3, 5, 6]);
        assert_eq!(s.of("other").collect::<Vec<_>>(), [1, 3, 6]);
        let none = served(&[("m", &[2])], &[]);
        assert_eq!(none.of("other").count(), 0);
        assert_eq!(none.of("m").collect::<Vec<_>>(), [2]);
    }
}
