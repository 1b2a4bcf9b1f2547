//! A stand-in for kube-scheduler's structured allocator (`k8s.io/dynamic-resource-allocation/
//! structured`), following its documented semantics: pools visited sorted by driver, then pool
//! name; a pool used only when every slice of its newest generation is there; its slices sorted
//! by name, devices in listed order (a pool listing a device twice is invalid and not used); for
//! each request the first device that matches the selectors, is not allocated and whose counters (from the pool's counter sets, less what every
//! allocated device consumes) still hold it; depth-first backtracking only across one claim's
//! own requests. Selectors are attribute equalities (`type`, `profile`, …), what gpupart's
//! DeviceClasses and the tests ask; anything else is refused by the caller's parser.
#![allow(dead_code)]

use gpupart::dra::slices::{Device, SliceSpec};
use std::collections::{BTreeMap, BTreeSet};

/// One request of a claim: `count` devices (of `driver`, when given) whose attributes equal
/// `selectors`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The request's name in the claim.
    pub name: String,
    /// Only devices of this driver.
    pub driver: Option<String>,
    /// (attribute, value) pairs every device must have.
    pub selectors: Vec<(String, String)>,
    /// How many devices (`exactly.count`).
    pub count: usize,
}

impl Request {
    /// A request for `count` devices with these attribute values.
    pub fn new(name: &str, selectors: &[(&str, &str)], count: usize) -> Self {
        let selectors = selectors.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Self { name: name.to_string(), driver: None, selectors, count }
    }
}

/// A device handed to a request.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Allocated {
    /// The request it serves.
    pub request: String,
    /// Its driver.
    pub driver: String,
    /// Its pool.
    pub pool: String,
    /// Its name.
    pub device: String,
}

/// A complete pool: its devices in visiting order and its counters.
struct Pool<'a> {
    driver: &'a str,
    name: &'a str,
    devices: Vec<&'a Device>,
    counters: BTreeMap<(String, String), u64>,
}

fn pools<'a>(slices: &'a [(String, SliceSpec)]) -> Vec<Pool<'a>> {
    let mut by_pool: BTreeMap<(&str, &str), Vec<&(String, SliceSpec)>> = BTreeMap::new();
    for s in slices {
        by_pool.entry((s.1.driver.as_str(), s.1.pool.name.as_str())).or_default().push(s);
    }
    let mut out = Vec::new();
    for ((driver, name), mut list) in by_pool {
        let newest = list.iter().map(|s| s.1.pool.generation).max().unwrap_or(0);
        list.retain(|s| s.1.pool.generation == newest);
        let complete = list.iter().all(|s| s.1.pool.resource_slice_count == list.len() as i64);
        if !complete {
            continue;
        }
        list.sort_by(|a, b| a.0.cmp(&b.0));
        let mut counters = BTreeMap::new();
        for s in &list {
            for set in &s.1.shared_counters {
                for (c, q) in &set.counters {
                    counters.insert((set.name.clone(), c.clone()), q.as_u64().unwrap_or(0));
                }
            }
        }
        let devices: Vec<&Device> = list.iter().flat_map(|s| s.1.devices.iter()).collect();
        let mut names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            // A device listed twice makes the pool invalid: kube-scheduler refuses to allocate.
            continue;
        }
        out.push(Pool { driver, name, devices, counters });
    }
    out
}

/// A device taint the request does not tolerate (these requests tolerate none): `NoSchedule` and
/// `NoExecute` keep the allocator off the device.
fn tainted(d: &Device) -> bool {
    d.taints.iter().any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
}

fn matches(d: &Device, selectors: &[(String, String)]) -> bool {
    selectors.iter().all(|(k, v)| d.attributes.get(k).and_then(|a| a.text()).as_deref() == Some(v.as_str()))
}

/// Whether `d` fits the pool's counters given `used`; adds its consumption when it does.
fn consume(pool: &Pool, used: &mut BTreeMap<(String, String), u64>, d: &Device) -> bool {
    let mut want: Vec<((String, String), u64)> = Vec::new();
    for c in &d.consumes_counters {
        for (name, q) in &c.counters {
            want.push(((c.counter_set.clone(), name.clone()), q.as_u64().unwrap_or(u64::MAX)));
        }
    }
    let fits = want.iter().all(|(k, v)| {
        let total = pool.counters.get(k).copied().unwrap_or(0);
        used.get(k).copied().unwrap_or(0).checked_add(*v).is_some_and(|u| u <= total)
    });
    if fits {
        for (k, v) in want {
            *used.entry(k).or_default() += v;
        }
    }
    fits
}

fn release(used: &mut BTreeMap<(String, String), u64>, d: &Device) {
    for c in &d.consumes_counters {
        for (name, q) in &c.counters {
            if let Some(u) = used.get_mut(&(c.counter_set.clone(), name.clone())) {
                *u = u.saturating_sub(q.as_u64().unwrap_or(0));
            }
        }
    }
}

/// The allocator's view: the published slices (object name, spec) and what is allocated.
#[derive(Debug, Default, Clone)]
pub struct Allocator {
    /// Every ResourceSlice: (metadata.name, spec).
    pub slices: Vec<(String, SliceSpec)>,
    /// Every allocated device: (driver, pool, device).
    pub allocated: BTreeSet<(String, String, String)>,
}

impl Allocator {
    /// Allocates a claim's requests, or `None` when they cannot all be satisfied. Does not record
    /// the result (see [`Allocator::commit`]).
    pub fn allocate(&self, requests: &[Request]) -> Option<Vec<Allocated>> {
        let pools = pools(&self.slices);
        // Counters used by what is allocated already.
        let mut used: Vec<BTreeMap<(String, String), u64>> = vec![BTreeMap::new(); pools.len()];
        for (i, p) in pools.iter().enumerate() {
            for d in &p.devices {
                if self.allocated.contains(&(p.driver.to_string(), p.name.to_string(), d.name.clone())) {
                    consume(p, &mut used[i], d);
                }
            }
        }
        // Candidates in visiting order: (pool index, device).
        let order: Vec<(usize, &Device)> =
            pools.iter().enumerate().flat_map(|(i, p)| p.devices.iter().map(move |d| (i, *d))).collect();
        let mut picked: Vec<(usize, usize)> = Vec::new(); // (request index, position in `order`)
        let ok = self.search(&pools, &order, requests, 0, 0, &mut used, &mut picked);
        ok.then(|| {
            picked
                .iter()
                .map(|&(r, at)| {
                    let (pi, d) = order[at];
                    Allocated {
                        request: requests[r].name.clone(),
                        driver: pools[pi].driver.to_string(),
                        pool: pools[pi].name.to_string(),
                        device: d.name.clone(),
                    }
                })
                .collect()
        })
    }

    /// Depth-first: the `nth` device of request `r` from position `from` on.
    #[allow(clippy::too_many_arguments)]
    fn search(
        &self,
        pools: &[Pool],
        order: &[(usize, &Device)],
        requests: &[Request],
        r: usize,
        from: usize,
        used: &mut [BTreeMap<(String, String), u64>],
        picked: &mut Vec<(usize, usize)>,
    ) -> bool {
        let Some(req) = requests.get(r) else { return true };
        let nth = picked.iter().filter(|(pr, _)| *pr == r).count();
        if nth == req.count {
            return self.search(pools, order, requests, r + 1, 0, used, picked);
        }
        for (at, &(pi, d)) in order.iter().enumerate().skip(from) {
            let p = &pools[pi];
            let key = (p.driver.to_string(), p.name.to_string(), d.name.clone());
            let other_driver = req.driver.as_deref().is_some_and(|want| want != p.driver);
            if other_driver
                || self.allocated.contains(&key)
                || picked.iter().any(|&(_, a)| a == at)
                || tainted(d)
                || !matches(d, &req.selectors)
            {
                continue;
            }
            if !consume(p, &mut used[pi], d) {
                continue;
            }
            picked.push((r, at));
            if self.search(pools, order, requests, r, at + 1, used, picked) {
                return true;
            }
            picked.pop();
            release(&mut used[pi], d);
        }
        false
    }

    /// Records an allocation.
    pub fn commit(&mut self, result: &[Allocated]) {
        for a in result {
            self.allocated.insert((a.driver.clone(), a.pool.clone(), a.device.clone()));
        }
    }

    /// Forgets an allocation (the claim was deallocated).
    pub fn release(&mut self, result: &[Allocated]) {
        for a in result {
            self.allocated.remove(&(a.driver.clone(), a.pool.clone(), a.device.clone()));
        }
    }
}
