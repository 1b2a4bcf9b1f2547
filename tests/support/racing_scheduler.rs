//! kube-scheduler's DRA allocation as it runs beside a busy driver: a thread that sees the
//! ResourceSlices the way its informer does, one write at a time in the API server's order
//! (the store's change log), and allocates between any two of them, concurrently with the
//! plugin's republications. Its assume cache holds every claim it allocated (in flight or
//! bound) until the test releases it; as the structured allocator, it counts a claim's devices
//! against the counters only while the pool lists them, refuses a pool that lists a device twice
//! or is incomplete, and skips tainted devices (tests/support/allocator.rs). A claim it cannot
//! allocate waits for the next slice change or release, as the scheduler requeues it.
//!
//! It also keeps the books the test checks: every allocation against the ones before it (no two
//! may share a memory slice or a GPU taken whole), and every refusal against the GPUs' geometry
//! (a claim refused while a placement for it was free is a refusal "with room").
#![allow(dead_code)]

use super::allocator::{Allocated, Allocator, Request};
use super::apiserver::StoreHandle;
use gpupart::dra::devices::{DeviceKind, DeviceRef};
use gpupart::dra::slices::SliceSpec;
use gpupart::mig::capacity::Occupancy;
use gpupart::mig::ProfileTable;
use serde_json::json;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What a claim asks: a MIG profile, or a whole GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    /// One MIG device of this profile.
    Mig(String),
    /// One whole GPU.
    Gpu,
}

impl Want {
    fn request(&self) -> Request {
        match self {
            Want::Mig(p) => Request::new("gpu", &[("type", "mig"), ("profile", p)], 1),
            Want::Gpu => Request::new("gpu", &[("type", "gpu")], 1),
        }
    }
}

/// The books.
#[derive(Debug, Default)]
pub struct Books {
    /// Claims waiting to be allocated, in order.
    pub queue: VecDeque<(String, Want)>,
    /// The assume cache: claim → its devices (in flight or bound).
    pub assumed: BTreeMap<String, Vec<Allocated>>,
    /// Claims allocated since the test last took them.
    pub fresh: Vec<String>,
    /// Allocations made.
    pub allocations: usize,
    /// Refusals (each attempt that found no device).
    pub refusals: usize,
    /// Refusals while a placement for the claim was free, with the moment.
    pub refused_with_room: Vec<String>,
    /// Allocations that overlap an earlier one still held.
    pub overlaps: Vec<String>,
    /// ResourceSlice writes seen (created, replaced, deleted).
    pub slice_events: usize,
    /// Attempts made while the pool was unusable (incomplete, or a device listed twice).
    pub unusable: usize,
    /// Waiting claims not tried since the last change (a slice write, a new claim, a release).
    pub untried: usize,
}

/// The stand-in, running until dropped.
pub struct RacingScheduler {
    /// Its books.
    pub books: Arc<Mutex<Books>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for RacingScheduler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether `d` can be created beside `held` (devices on the same GPUs), by the GPUs' geometry.
fn fits(tables: &BTreeMap<u32, ProfileTable>, held: &[DeviceRef], d: DeviceRef) -> bool {
    let mine: Vec<&DeviceRef> = held.iter().filter(|h| h.gpu == d.gpu).collect();
    match d.kind {
        DeviceKind::Gpu => mine.is_empty(),
        DeviceKind::Mps => mine.iter().all(|h| h.kind == DeviceKind::Mps),
        DeviceKind::Mig { profile_id, placement } => {
            let Some(t) = tables.get(&d.gpu) else { return false };
            let Some(p) = t.by_id(profile_id) else { return false };
            let mut occ = Occupancy::empty();
            for h in &mine {
                match h.kind {
                    DeviceKind::Gpu | DeviceKind::Mps => return false,
                    DeviceKind::Mig { profile_id, placement } => match t.by_id(profile_id) {
                        Some(hp) => occ.add(hp, placement),
                        None => return false,
                    },
                }
            }
            occ.can_add(t, p, placement)
        }
    }
}

impl RacingScheduler {
    /// Starts following `api`'s change log from now (the slices written so far form its first
    /// view); `tables` are the node's GPUs' profile tables by index, `pool` the node's pool.
    pub fn start(api: StoreHandle, tables: BTreeMap<u32, ProfileTable>, pool: &str) -> Self {
        let books: Arc<Mutex<Books>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (b, s, pool) = (books.clone(), stop.clone(), pool.to_string());
        let (mut cache, mut cursor) = {
            let store = api.store();
            let mut cache = BTreeMap::new();
            for c in store.changes.iter().filter(|c| c.key.0 == "resourceslices") {
                apply(&mut cache, c.kind, &c.key.2, &c.object["spec"]);
            }
            (cache, store.changes.len())
        };
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                // One slice write, as the informer delivers it.
                let next = {
                    let store = api.store();
                    let mut found = None;
                    while cursor < store.changes.len() {
                        let c = &store.changes[cursor];
                        cursor += 1;
                        if c.key.0 == "resourceslices" {
                            found = Some((c.kind, c.key.2.clone(), c.object["spec"].clone()));
                            break;
                        }
                    }
                    found
                };
                if let Some((kind, name, spec)) = &next {
                    apply(&mut cache, kind, name, spec);
                    let mut bk = b.lock().unwrap();
                    bk.slice_events += 1;
                    bk.untried = bk.queue.len();
                }
                let attempt = {
                    let mut bk = b.lock().unwrap();
                    if bk.untried == 0 || bk.queue.is_empty() {
                        None
                    } else {
                        bk.untried -= 1;
                        bk.queue.pop_front()
                    }
                };
                let Some((claim, want)) = attempt else {
                    if next.is_none() {
                        std::thread::sleep(Duration::from_micros(300));
                    }
                    continue;
                };
                let mut bk = b.lock().unwrap();
                let held: Vec<Allocated> = bk.assumed.values().flatten().cloned().collect();
                let alloc = Allocator {
                    slices: cache.iter().map(|(n, s)| (n.clone(), s.clone())).collect(),
                    allocated: held.iter().map(|a| (a.driver.clone(), a.pool.clone(), a.device.clone())).collect(),
                    shares: Default::default(),
                };
                let parse = |n: &str| DeviceRef::parse(n, |g| tables.get(&g));
                let held_refs: Vec<DeviceRef> =
                    held.iter().filter(|a| a.pool == pool).filter_map(|a| parse(&a.device)).collect();
                match alloc.allocate(&[want.request()]) {
                    Some(got) => {
                        for a in &got {
                            match parse(&a.device) {
                                Some(d) if fits(&tables, &held_refs, d) => {}
                                _ => {
                                    let line = format!(
                                        "{claim} got {} while {:?} are held (slice write {})",
                                        a.device,
                                        held.iter().map(|h| h.device.as_str()).collect::<Vec<_>>(),
                                        bk.slice_events
                                    );
                                    bk.overlaps.push(line);
                                }
                            }
                        }
                        bk.assumed.insert(claim.clone(), got.clone());
                        bk.allocations += 1;
                        drop(bk);
                        let results: Vec<serde_json::Value> = got
                            .iter()
                            .map(|a| json!({"request": a.request, "driver": a.driver, "pool": a.pool, "device": a.device}))
                            .collect();
                        api.change(|s| {
                            let key = ("resourceclaims".to_string(), "ml".to_string(), claim.clone());
                            if let Some(mut c) = s.objects.get(&key).cloned() {
                                c["status"] = json!({"allocation": {"devices": {"results": results}}});
                                s.put(key, c);
                            }
                        });
                        // Bound: the kubelet may prepare it now.
                        b.lock().unwrap().fresh.push(claim);
                    }
                    None => {
                        bk.refusals += 1;
                        let usable = usable(&cache);
                        if !usable {
                            bk.unusable += 1;
                        }
                        let room = every_device(&tables)
                            .into_iter()
                            .filter(|d| wanted(&tables, &want, *d))
                            .find(|d| fits(&tables, &held_refs, *d));
                        if let Some(d) = room {
                            let name = d.name(&tables[&d.gpu]);
                            let listed = cache.values().flat_map(|s| s.devices.iter()).find(|x| x.name == name);
                            let taints: Vec<String> = listed
                                .map(|x| x.taints.iter().map(|t| format!("{}={:?}", t.key, t.value)).collect())
                                .unwrap_or_default();
                            let line = format!(
                                "{claim} ({want:?}) refused at slice write {} while {name} was free (listed: {}, taints: {taints:?}, pool usable: {usable}; held on its GPU: {:?})",
                                bk.slice_events,
                                listed.is_some(),
                                held_refs.iter().filter(|h| h.gpu == d.gpu).map(|h| h.name(&tables[&h.gpu])).collect::<Vec<_>>()
                            );
                            bk.refused_with_room.push(line);
                        }
                        // Unschedulable: back in the queue, tried again after the next change.
                        bk.queue.push_back((claim, want));
                    }
                }
            }
        });
        Self { books, stop, thread: Some(thread) }
    }

    /// Queues a claim (already created in the API) for allocation.
    pub fn submit(&self, claim: &str, want: Want) {
        let mut b = self.books.lock().unwrap();
        b.queue.push_back((claim.to_string(), want));
        b.untried = b.queue.len();
    }

    /// Forgets a claim's allocation (the claim was deallocated), so its devices are free again;
    /// the waiting claims are tried again.
    pub fn release(&self, claim: &str) {
        let mut b = self.books.lock().unwrap();
        b.assumed.remove(claim);
        b.untried = b.queue.len();
    }

    /// The claims allocated since the last call.
    pub fn take_fresh(&self) -> Vec<String> {
        std::mem::take(&mut self.books.lock().unwrap().fresh)
    }
}

/// Applies one ResourceSlice event to the informer's cache.
fn apply(cache: &mut BTreeMap<String, SliceSpec>, kind: &str, name: &str, spec: &serde_json::Value) {
    if kind == "DELETED" {
        cache.remove(name);
    } else if let Ok(spec) = serde_json::from_value::<SliceSpec>(spec.clone()) {
        cache.insert(name.to_string(), spec);
    }
}

/// Whether device `d` is what `want` asks for.
fn wanted(tables: &BTreeMap<u32, ProfileTable>, want: &Want, d: DeviceRef) -> bool {
    match (want, d.kind) {
        (Want::Gpu, DeviceKind::Gpu) => true,
        (Want::Mig(p), DeviceKind::Mig { profile_id, .. }) => {
            tables.get(&d.gpu).and_then(|t| t.by_id(profile_id)).is_some_and(|x| x.name.to_string() == *p)
        }
        _ => false,
    }
}

/// Whether the cached pool is usable: complete in its newest generation, no device twice.
fn usable(cache: &BTreeMap<String, SliceSpec>) -> bool {
    let Some(newest) = cache.values().map(|s| s.pool.generation).max() else { return false };
    let current: Vec<&SliceSpec> = cache.values().filter(|s| s.pool.generation == newest).collect();
    let complete = current.iter().all(|s| s.pool.resource_slice_count == current.len() as i64);
    let mut names: Vec<&str> = current.iter().flat_map(|s| s.devices.iter().map(|d| d.name.as_str())).collect();
    names.sort_unstable();
    complete && names.windows(2).all(|w| w[0] != w[1])
}

/// Every device the GPUs could have.
fn every_device(tables: &BTreeMap<u32, ProfileTable>) -> Vec<DeviceRef> {
    tables.iter().flat_map(|(&gpu, t)| gpupart::dra::devices::every_device(gpu, t)).collect()
}
