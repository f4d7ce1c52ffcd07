//! Derived concurrency caps: per backend, model and latency class, the largest concurrency the
//! curve predicts still meets the class's SLO (for `/admin/curves` and the
//! `tpsgate_concurrency_cap` gauge).

use std::sync::Arc;

use super::Router;

/// A derived concurrency cap.
#[derive(Debug, Clone)]
pub struct Cap {
    /// Backend name.
    pub backend: Arc<str>,
    /// Client model name.
    pub model: Arc<str>,
    /// Class name.
    pub class: Arc<str>,
    /// Largest concurrency predicted to meet the class's SLO (0: not even one request).
    pub cap: u32,
}

impl Router {
    /// Per backend, model and class with an SLO: the largest concurrency its curve predicts
    /// meets the SLO (for `/admin/curves` and the `tpsgate_concurrency_cap` gauge). Admission
    /// tests the same predictions at in-flight + 1, which for a curve that only falls with load
    /// is the test `in_flight + 1 <= cap`.
    pub fn caps(&self) -> Vec<Cap> {
        let mut caps = Vec::new();
        for b in &self.backends {
            let limit = b.config.max_concurrency.unwrap_or(4096).min(4096);
            for entry in &b.curves {
                let Some(model) = entry.value().model().cloned() else {
                    continue;
                };
                for class in self.classes.iter().filter(|c| !c.slo.is_batch()) {
                    caps.push(Cap {
                        backend: Arc::clone(&b.config.name),
                        model: Arc::clone(entry.key()),
                        class: Arc::clone(&class.name),
                        cap: class.slo.derived_cap(limit, |n| model.predict(n, 0)),
                    });
                }
            }
        }
        caps
    }
}
