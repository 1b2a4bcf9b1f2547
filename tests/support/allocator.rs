//! A stand-in for kube-scheduler's structured allocator (`k8s.io/dynamic-resource-allocation/
//! structured`), following its documented semantics: pools visited sorted by driver, then pool
//! name; a pool used only when every slice of its newest generation is there; its slices sorted
//! by name, devices in listed order (a pool listing a device twice is invalid and not used); for
//! each request the first device that matches the selectors, is not allocated and whose counters (from the pool's counter sets, less what every
//! allocated device consumes) still hold it; depth-first backtracking only across one claim's
//! own requests. Selectors are attribute equalities (`type`, `profile`, …), what gpupart's
//! DeviceClasses and the tests ask; anything else is refused by the caller's parser.
//!
//! Consumable capacity (KEP-5075, `structured/internal/incubating` of
//! k8s.io/dynamic-resource-allocation as of Kubernetes 1.36.2): a device with
//! `allowMultipleAllocations` is never "in use": each request takes a share of its capacities —
//! the amount asked rounded up by the capacity's `requestPolicy` (`validRange` min and step,
//! `validValues`), its `default` when the request names none, the whole value when there is no
//! policy — as long as every capacity's shares stay within its value and the amount does not
//! violate the policy; each share gets a new `shareID`. Its counters are checked and consumed
//! only for its first share (while any share is allocated they count once), and a device with
//! shares counts as allocated when the pool's counters are rebuilt (the 1.36.2 fix; before it,
//! shared devices' counters were not counted at all). A request naming a capacity the device
//! lacks does not match it.
#![allow(dead_code)]

use gpupart::dra::slices::{Capacity, Device, Quantity, SliceSpec};
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
    /// `exactly.capacity.requests`: capacity name → amount.
    pub capacity: BTreeMap<String, u64>,
}

impl Request {
    /// A request for `count` devices with these attribute values.
    pub fn new(name: &str, selectors: &[(&str, &str)], count: usize) -> Self {
        let selectors = selectors.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Self { name: name.to_string(), driver: None, selectors, count, capacity: BTreeMap::new() }
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
    /// Its `shareID` (a device allocated to several claims).
    pub share_id: Option<String>,
    /// Its `consumedCapacity` (a shared device).
    pub consumed: BTreeMap<String, u64>,
}

/// A pick of the search: (request index, position in the visiting order, the share taken of a
/// shared device).
type Pick = (usize, usize, Option<BTreeMap<String, u64>>);

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
    /// Every device allocated whole: (driver, pool, device).
    pub allocated: BTreeSet<(String, String, String)>,
    /// Every share of a shared device: (driver, pool, device) → each share's consumed capacity.
    pub shares: BTreeMap<(String, String, String), Vec<BTreeMap<String, u64>>>,
}

type Key = (String, String, String);

fn shared(d: &Device) -> bool {
    d.allow_multiple_allocations == Some(true)
}

/// What a request takes of one capacity (`calculateConsumedCapacity`).
fn consumed(requested: Option<u64>, cap: &Capacity) -> u64 {
    let value = cap.as_u64().unwrap_or(0);
    let q = |s: &String| Quantity { value: s.clone() }.as_u64().unwrap_or(0);
    let Some(req) = requested else {
        return cap.request_policy.as_ref().and_then(|p| p.default.as_ref()).map_or(value, q);
    };
    let Some(policy) = &cap.request_policy else { return req };
    if let Some(r) = &policy.valid_range {
        let min = q(&r.min);
        if req < min {
            return min;
        }
        return match r.step.as_ref().map(q).filter(|s| *s > 0) {
            Some(step) => min + (req - min).div_ceil(step) * step,
            None => req,
        };
    }
    if !policy.valid_values.is_empty() {
        return policy.valid_values.iter().map(q).find(|v| req <= *v).unwrap_or(req);
    }
    req
}

/// Whether an amount breaks the capacity's policy (`violatesPolicy`).
fn violates(amount: u64, cap: &Capacity) -> bool {
    let q = |s: &String| Quantity { value: s.clone() }.as_u64().unwrap_or(0);
    let Some(policy) = &cap.request_policy else { return false };
    if policy.default.as_ref().map(q) == Some(amount) {
        return false;
    }
    if let Some(r) = &policy.valid_range {
        let min = q(&r.min);
        return r.max.as_ref().is_some_and(|m| amount > q(m))
            || r.step.as_ref().map(q).filter(|s| *s > 0).is_some_and(|step| (amount.saturating_sub(min)) % step != 0);
    }
    !policy.valid_values.is_empty() && !policy.valid_values.iter().any(|v| q(v) == amount)
}

/// The share `req` takes of `d`, given the shares already taken (`taken`, summed), or `None`
/// when it does not fit (`CmpRequestOverCapacity`).
fn share(d: &Device, req: &Request, taken: &BTreeMap<String, u64>) -> Option<BTreeMap<String, u64>> {
    if req.capacity.keys().any(|k| !d.capacity.contains_key(k)) {
        return None;
    }
    let mut out = BTreeMap::new();
    for (name, cap) in &d.capacity {
        let amount = consumed(req.capacity.get(name).copied(), cap);
        if violates(amount, cap) {
            return None;
        }
        let total = taken.get(name).copied().unwrap_or(0).checked_add(amount)?;
        if total > cap.as_u64().unwrap_or(0) {
            return None;
        }
        out.insert(name.clone(), amount);
    }
    Some(out)
}

fn add(into: &mut BTreeMap<String, u64>, what: &BTreeMap<String, u64>) {
    for (k, v) in what {
        *into.entry(k.clone()).or_default() += v;
    }
}

static SHARE_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A new `shareID` (a UUID, as `GenerateNewShareID`).
fn new_share_id() -> String {
    let n = SHARE_IDS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    format!("5ba2e000-0000-4000-8000-{n:012x}")
}

impl Allocator {
    /// Allocates a claim's requests, or `None` when they cannot all be satisfied. Does not record
    /// the result (see [`Allocator::commit`]).
    pub fn allocate(&self, requests: &[Request]) -> Option<Vec<Allocated>> {
        let pools = pools(&self.slices);
        // Counters used by what is allocated already: a device allocated whole, or with shares
        // (counted once).
        let mut used: Vec<BTreeMap<(String, String), u64>> = vec![BTreeMap::new(); pools.len()];
        for (i, p) in pools.iter().enumerate() {
            for d in &p.devices {
                let key = (p.driver.to_string(), p.name.to_string(), d.name.clone());
                if self.allocated.contains(&key) || self.shares.get(&key).is_some_and(|s| !s.is_empty()) {
                    consume(p, &mut used[i], d);
                }
            }
        }
        // Candidates in visiting order: (pool index, device).
        let order: Vec<(usize, &Device)> =
            pools.iter().enumerate().flat_map(|(i, p)| p.devices.iter().map(move |d| (i, *d))).collect();
        // (request index, position in `order`, the share taken of a shared device)
        let mut picked: Vec<Pick> = Vec::new();
        let ok = self.search(&pools, &order, requests, 0, 0, &mut used, &mut picked);
        ok.then(|| {
            picked
                .iter()
                .map(|(r, at, share)| {
                    let (pi, d) = order[*at];
                    Allocated {
                        request: requests[*r].name.clone(),
                        driver: pools[pi].driver.to_string(),
                        pool: pools[pi].name.to_string(),
                        device: d.name.clone(),
                        share_id: share.as_ref().map(|_| new_share_id()),
                        consumed: share.clone().unwrap_or_default(),
                    }
                })
                .collect()
        })
    }

    /// What the shares of `key` take, with those `picked` in this allocation.
    fn taken(&self, key: &Key, picked: &[Pick], order: &[(usize, &Device)], pools: &[Pool]) -> BTreeMap<String, u64> {
        let mut sum = BTreeMap::new();
        for s in self.shares.get(key).into_iter().flatten() {
            add(&mut sum, s);
        }
        for (_, at, share) in picked {
            let (pi, d) = order[*at];
            if (pools[pi].driver.to_string(), pools[pi].name.to_string(), d.name.clone()) == *key {
                if let Some(s) = share {
                    add(&mut sum, s);
                }
            }
        }
        sum
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
        picked: &mut Vec<Pick>,
    ) -> bool {
        let Some(req) = requests.get(r) else { return true };
        let nth = picked.iter().filter(|(pr, _, _)| *pr == r).count();
        if nth == req.count {
            return self.search(pools, order, requests, r + 1, 0, used, picked);
        }
        for (at, &(pi, d)) in order.iter().enumerate().skip(from) {
            let p = &pools[pi];
            let key = (p.driver.to_string(), p.name.to_string(), d.name.clone());
            let other_driver = req.driver.as_deref().is_some_and(|want| want != p.driver);
            let multi = shared(d);
            if other_driver
                || self.allocated.contains(&key)
                || (!multi && picked.iter().any(|(_, a, _)| *a == at))
                || tainted(d)
                || !matches(d, &req.selectors)
            {
                continue;
            }
            // A shared device's capacity in use: its counters are counted already.
            let taken = self.taken(&key, picked, order, pools);
            let in_use = multi && !taken.is_empty();
            let Some(share) = share(d, req, &taken) else { continue };
            if !in_use && !consume(p, &mut used[pi], d) {
                continue;
            }
            picked.push((r, at, multi.then_some(share)));
            // A shared device may serve the next device of the request too.
            let next = if multi { at } else { at + 1 };
            if self.search(pools, order, requests, r, next, used, picked) {
                return true;
            }
            picked.pop();
            if !in_use {
                release(&mut used[pi], d);
            }
        }
        false
    }

    /// Records an allocation.
    pub fn commit(&mut self, result: &[Allocated]) {
        for a in result {
            let key = (a.driver.clone(), a.pool.clone(), a.device.clone());
            if a.share_id.is_some() {
                self.shares.entry(key).or_default().push(a.consumed.clone());
            } else {
                self.allocated.insert(key);
            }
        }
    }

    /// Forgets an allocation (the claim was deallocated).
    pub fn release(&mut self, result: &[Allocated]) {
        for a in result {
            let key = (a.driver.clone(), a.pool.clone(), a.device.clone());
            if a.share_id.is_some() {
                if let Some(list) = self.shares.get_mut(&key) {
                    if let Some(i) = list.iter().position(|s| *s == a.consumed) {
                        list.remove(i);
                    }
                }
            } else {
                self.allocated.remove(&key);
            }
        }
    }
}
