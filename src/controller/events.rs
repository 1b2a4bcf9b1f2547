//! Events off the leader's path, as client-go's event broadcaster keeps them: [`EventQueue::push`]
//! returns at once; a task of its own posts them. Repeats of an Event still queued (same object
//! and reason) fold into it with a count; a batch queues at most `per_batch` new Events; the queue
//! holds at most [`CAPACITY`]. What does not fit is dropped and counted
//! (`gpupart_controller_events_dropped_total`) once per object and reason, however many batches
//! push it again before it is queued; so is what is queued when this replica stops leading: a
//! standby writes nothing.

use super::lease::Leadership;
use super::metrics::ControllerMetrics;
use k8s_openapi::api::core::v1::ObjectReference;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// The most Events waiting to be posted.
pub const CAPACITY: usize = 1000;

/// One Event to post.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    /// What it is about.
    pub regarding: ObjectReference,
    /// `Warning` rather than `Normal`.
    pub warning: bool,
    /// Its reason (`NotServed`).
    pub reason: String,
    /// Its action (`Repartition`).
    pub action: String,
    /// Its note.
    pub note: String,
    /// How many times it was pushed while queued.
    pub count: u32,
}

impl Pending {
    /// The note as posted: with the count when it was pushed more than once.
    pub fn note_with_count(&self) -> String {
        if self.count > 1 {
            format!("{} (x{})", self.note, self.count)
        } else {
            self.note.clone()
        }
    }

    /// Object and reason: Events with the same one fold.
    fn key(&self) -> EventKey {
        let r = &self.regarding;
        (r.kind.clone(), r.namespace.clone(), r.name.clone(), self.reason.clone())
    }

    fn same(&self, other: &Pending) -> bool {
        self.key() == other.key()
    }
}

/// An Event's object (kind, namespace, name) and reason.
type EventKey = (Option<String>, Option<String>, Option<String>, String);

/// What pushing did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Queued as a new Event.
    Queued,
    /// Folded into the same Event still queued.
    Folded,
    /// Dropped: the batch's cap or the queue's capacity was reached.
    Dropped,
}

/// The queue (pure: no I/O; [`EventQueue::serve`] starts the task that posts).
#[derive(Clone)]
pub struct EventQueue {
    inner: Arc<Mutex<Queue>>,
    wake: Arc<Notify>,
}

struct Queue {
    items: VecDeque<Pending>,
    per_batch: usize,
    this_batch: usize,
    dropped: u64,
    /// Object and reason of each Event dropped and not queued since (counted once).
    lost: std::collections::HashSet<EventKey>,
}

/// The most dropped Events remembered as such; beyond, a repeat may be counted again.
const LOST_REMEMBERED: usize = 100_000;

impl Queue {
    fn drop_one(&mut self, e: &Pending) {
        if self.lost.len() >= LOST_REMEMBERED {
            self.lost.clear();
        }
        if self.lost.insert(e.key()) {
            self.dropped += 1;
        }
    }
}

impl EventQueue {
    /// A queue admitting at most `per_batch` new Events per batch.
    pub fn new(per_batch: usize) -> Self {
        let q = Queue { items: VecDeque::new(), per_batch, this_batch: 0, dropped: 0, lost: Default::default() };
        Self { inner: Arc::new(Mutex::new(q)), wake: Arc::new(Notify::new()) }
    }

    /// A new batch starts: its cap counts from zero.
    pub fn new_batch(&self) {
        self.lock().this_batch = 0;
    }

    /// Queues an Event (never waits).
    pub fn push(&self, e: Pending) -> Pushed {
        let mut q = self.lock();
        if let Some(same) = q.items.iter_mut().find(|x| x.same(&e)) {
            same.count += e.count.max(1);
            same.note = e.note;
            return Pushed::Folded;
        }
        if q.this_batch >= q.per_batch || q.items.len() >= CAPACITY {
            q.drop_one(&e);
            return Pushed::Dropped;
        }
        q.lost.remove(&e.key());
        q.this_batch += 1;
        q.items.push_back(Pending { count: e.count.max(1), ..e });
        drop(q);
        self.wake.notify_one();
        Pushed::Queued
    }

    /// The next Event to post, if any.
    pub fn pop(&self) -> Option<Pending> {
        self.lock().items.pop_front()
    }

    /// Drops everything queued (this replica stopped leading); returns how many.
    pub fn clear(&self) -> usize {
        let mut q = self.lock();
        let items: Vec<Pending> = q.items.drain(..).collect();
        for e in &items {
            q.drop_one(e);
        }
        items.len()
    }

    /// Events queued now.
    pub fn len(&self) -> usize {
        self.lock().items.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Events dropped so far (each object and reason once until it is queued again).
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// Starts the task that posts the queued Events with `post`, one at a time, while
    /// `leadership` leads; the counts go to `metrics`.
    pub fn serve<F, Fut>(&self, leadership: Leadership, metrics: Arc<ControllerMetrics>, post: F)
    where
        F: Fn(Pending) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = bool> + Send,
    {
        let me = self.clone();
        tokio::spawn(async move {
            let mut reported = 0;
            loop {
                if me.is_empty() {
                    me.wake.notified().await;
                }
                if !leadership.leads() {
                    me.clear();
                } else if let Some(e) = me.pop() {
                    metrics.event_posted(post(e).await);
                }
                let dropped = me.dropped();
                if dropped > reported {
                    metrics.events_dropped(dropped - reported);
                    reported = dropped;
                }
            }
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(name: &str, reason: &str, note: &str) -> Pending {
        Pending {
            regarding: ObjectReference {
                kind: Some("Pod".into()),
                namespace: Some("ml".into()),
                name: Some(name.into()),
                ..Default::default()
            },
            warning: true,
            reason: reason.into(),
            action: "Repartition".into(),
            note: note.into(),
            count: 1,
        }
    }

    #[test]
    fn repeats_fold_the_batch_is_capped_and_what_is_dropped_is_counted() {
        let q = EventQueue::new(3);
        assert_eq!(q.push(ev("a", "NotServed", "no room")), Pushed::Queued);
        assert_eq!(q.push(ev("a", "NotServed", "still no room")), Pushed::Folded);
        assert_eq!(q.push(ev("a", "Repartitioning", "x")), Pushed::Queued, "another reason is another Event");
        assert_eq!(q.push(ev("b", "NotServed", "no room")), Pushed::Queued);
        assert_eq!(q.push(ev("c", "NotServed", "no room")), Pushed::Dropped, "the batch's cap");
        assert_eq!(q.push(ev("c", "NotServed", "no room")), Pushed::Dropped);
        assert_eq!(q.push(ev("b", "NotServed", "again")), Pushed::Folded, "a repeat still folds");
        assert_eq!((q.len(), q.dropped()), (3, 1), "one Event lost, however often it is pushed");
        let first = q.pop().unwrap();
        assert_eq!((first.count, first.note_with_count().as_str()), (2, "still no room (x2)"));
        q.new_batch();
        assert_eq!(q.push(ev("c", "NotServed", "no room")), Pushed::Queued, "a new batch, a new cap");
        assert_eq!(q.clear(), 3);
        assert_eq!((q.len(), q.dropped()), (0, 4), "c was queued since it was lost: lost again, counted again");
    }

    #[test]
    fn the_queue_holds_at_most_its_capacity() {
        let q = EventQueue::new(usize::MAX);
        for k in 0..CAPACITY + 5 {
            q.push(ev(&format!("p{k}"), "NotServed", "n"));
        }
        assert_eq!((q.len(), q.dropped()), (CAPACITY, 5));
    }
}
