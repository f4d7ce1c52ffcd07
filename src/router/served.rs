//! Which backends serve a client's model name ([`Served`], resolved when the router is built: a
//! decision walks the backends of its model, not every backend's model map), and where requests
//! naming no model go ([`Entries`]).

use std::collections::HashMap;
use std::sync::Arc;

use super::predictor::Fitted;
use crate::config::{BackendDialect, ModelMap};
use crate::curve::Model;
use crate::fleet::Backend;

/// Backend indices by the client model names they serve, each list in config order.
#[derive(Debug, Default)]
pub(crate) struct Served {
    /// The backends naming a model among their `models` (passing names through or not), each
    /// with the name's place among them ([`Backend::fitted`]).
    by_name: HashMap<Box<str>, Vec<(usize, usize)>, foldhash::fast::RandomState>,
    /// The backends that pass any other name through (`models.passthrough`).
    passthrough: Vec<usize>,
}

impl Served {
    pub(crate) fn new(backends: &[Arc<Backend>]) -> Self {
        let mut served = Self::default();
        for (i, b) in backends.iter().enumerate() {
            for (slot, name) in b.config.models.aliases.keys().enumerate() {
                served
                    .by_name
                    .entry(name.as_str().into())
                    .or_default()
                    .push((i, slot));
            }
            if b.config.models.passthrough {
                served.passthrough.push(i);
            }
        }
        served
    }

    /// The backends serving `model`, in config order, each with the name's place among those
    /// it names: those naming it, merged with those passing names through (a backend doing
    /// both comes once, as naming it).
    pub(crate) fn of(&self, model: &str) -> impl Iterator<Item = (usize, Option<usize>)> + '_ {
        let named: &[(usize, usize)] = self.by_name.get(model).map_or(&[], Vec::as_slice);
        let mut named = named.iter().map(|&(i, slot)| (i, Some(slot))).peekable();
        let mut through = self.passthrough.iter().map(|&i| (i, None)).peekable();
        std::iter::from_fn(move || match (named.peek(), through.peek()) {
            (Some(&(a, _)), Some(&(b, _))) if a == b => {
                through.next();
                named.next()
            }
            (Some(&(a, _)), Some(&(b, _))) if b < a => through.next(),
            (Some(_), _) => named.next(),
            (None, _) => through.next(),
        })
    }
}

/// A backend serving a request's model, as a decision walks them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Server<'r> {
    /// Its index in the router's backend list.
    pub index: usize,
    /// The backend.
    pub backend: &'r Arc<Backend>,
    /// The model's place among the names it serves, where it names it.
    slot: Option<usize>,
}

impl<'r> Server<'r> {
    pub(crate) fn new(index: usize, backend: &'r Arc<Backend>, slot: Option<usize>) -> Self {
        Self {
            index,
            backend,
            slot,
        }
    }

    /// Its fitted model of `model`, the name it was found serving
    /// ([`Backend::model`], without the curves' map where the backend names it).
    pub(crate) fn model(&self, model: &str) -> Option<Arc<Model>> {
        match self.slot {
            Some(slot) => self.backend.fitted(slot),
            None => self.backend.model(model),
        }
    }

    /// The same model as a [`Fitted`] to read when a prediction is drawn: where the name is a
    /// configured one, its published slot, with no count taken on the model.
    pub(crate) fn fitted(&self, model: &str) -> Fitted<'r> {
        match self.slot.and_then(|slot| self.backend.published(slot)) {
            Some(slot) => Fitted::Published(slot),
            None => Fitted::Held(self.model(model)),
        }
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
                .map(|(n, list)| ((*n).into(), list.iter().map(|&i| (i, 0)).collect()))
                .collect(),
            passthrough: passthrough.to_vec(),
        }
    }

    #[test]
    fn a_model_is_served_by_the_backends_naming_it_and_those_passing_names_through_in_order() {
        let s = served(&[("m", &[0, 3, 5])], &[1, 3, 6]);
        let of = |s: &Served, m: &str| s.of(m).map(|(i, _)| i).collect::<Vec<_>>();
        assert_eq!(of(&s, "m"), [0, 1, 3, 5, 6]);
        assert_eq!(of(&s, "other"), [1, 3, 6]);
        assert_eq!(
            s.of("m").filter(|(_, slot)| slot.is_none()).count(),
            2,
            "1 and 6 pass the name through; 3 names it too"
        );
        let none = served(&[("m", &[2])], &[]);
        assert_eq!(none.of("other").count(), 0);
        assert_eq!(of(&none, "m"), [2]);
    }
}
