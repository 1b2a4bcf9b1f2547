//! What the controller's decisions remember from one batch to the next (pure): the ways each GPU
//! state can be set for the wanted resources, and each node's best change for what waits there.
//! A node whose GPUs, layout and ledger are unchanged and whose waiting pods ask the same is not
//! judged again; what no batch used is forgotten after the next one.

use super::gpu_options::GpuOption;
use std::collections::HashMap;
use std::sync::Arc;

/// A node's judgement: each GPU's options and the best picks among them.
pub(super) type Judged = (Vec<Arc<Vec<GpuOption>>>, Option<Vec<usize>>);

/// The decisions' memory, kept by the controller across batches ([`super::decide::decide_with`]).
#[derive(Debug, Default)]
pub struct Memo {
    /// The batch being decided (counts up).
    batch: u64,
    /// Per GPU state and wanted resources: the ways to set it, and the batch that last used them.
    options: HashMap<String, (u64, Arc<Vec<GpuOption>>)>,
    /// Per node state and waiting queue: each GPU's options, the best picks among them (one
    /// option per GPU; `None` when no change unblocks a pod), and the batch that last used them.
    picks: HashMap<String, (u64, Judged)>,
    /// Node judgements answered from memory, and those worked out, since the start.
    hits: u64,
    misses: u64,
}

impl Memo {
    /// An empty memory.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a batch.
    pub(super) fn begin(&mut self) {
        self.batch += 1;
    }

    /// Ends a batch: what it did not use is forgotten, so the memory holds one batch's states.
    pub(super) fn end(&mut self) {
        let b = self.batch;
        self.options.retain(|_, (used, _)| *used == b);
        self.picks.retain(|_, (used, _)| *used == b);
    }

    /// The ways to set one GPU state (`key`), worked out by `make` the first time.
    pub(super) fn options(&mut self, key: String, make: impl FnOnce() -> Vec<GpuOption>) -> Arc<Vec<GpuOption>> {
        let b = self.batch;
        let e = self.options.entry(key).or_insert_with(|| (b, Arc::new(make())));
        e.0 = b;
        e.1.clone()
    }

    /// A node's judgement for its state and waiting queue (`key`), if remembered.
    pub(super) fn recall(&mut self, key: &str) -> Option<Judged> {
        let b = self.batch;
        let e = self.picks.get_mut(key)?;
        e.0 = b;
        self.hits += 1;
        Some(e.1.clone())
    }

    /// Remembers a node's judgement for its state and waiting queue (`key`).
    pub(super) fn remember(&mut self, key: String, judged: Judged) {
        self.misses += 1;
        self.picks.insert(key, (self.batch, judged));
    }

    /// Node judgements answered from memory since the start.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// Node judgements worked out since the start.
    pub fn misses(&self) -> u64 {
        self.misses
    }

    /// Node states remembered now.
    pub fn len(&self) -> usize {
        self.picks.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.picks.is_empty()
    }
}
