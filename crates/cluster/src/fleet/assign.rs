//! Which nodes of one GPU model host which pool (pure): whole nodes per pool first, a pool's
//! remainder on a node of its own while free nodes last, and only then beside another pool
//! (a node touched outside its pool), preferring nodes already mixed. A pool that fits on one
//! free node takes the smallest such node; a larger one takes the largest free nodes whole.

use super::choose::Pool;
use std::collections::{BTreeMap, BTreeSet};

/// GPUs of a pool on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// Index of the node in the caller's list.
    pub node: usize,
    /// The pool.
    pub pool: Pool,
    /// GPUs of that node given to the pool.
    pub gpus: u32,
}

/// Assigns `requests` (pool, GPUs) to nodes with `caps` free GPUs each; the requests must fit
/// in total. Returns the allocations in node order, each pool's GPUs contiguous on a node.
pub fn assign(caps: &[u32], requests: &[(Pool, u32)]) -> Vec<Allocation> {
    let mut used = vec![0u32; caps.len()];
    let mut pools: Vec<Vec<Pool>> = vec![Vec::new(); caps.len()];
    let mut out = Vec::new();
    let mut order: Vec<(Pool, u32)> = requests.iter().copied().filter(|(_, n)| *n > 0).collect();
    order.sort_by_key(|&(p, n)| (std::cmp::Reverse(n), p));
    // Empty nodes by capacity (each set in node order), and nodes partly used: every choice is
    // a lookup, so a fleet of 100,000 nodes is assigned in linear-logarithmic time.
    let mut empty: BTreeMap<u32, BTreeSet<usize>> = BTreeMap::new();
    for (i, &c) in caps.iter().enumerate().filter(|(_, c)| **c > 0) {
        empty.entry(c).or_default().insert(i);
    }
    let mut partial: BTreeSet<usize> = BTreeSet::new();
    for (pool, mut left) in order {
        while left > 0 {
            // The largest empty node the pool fills whole (the first of equal ones), or the
            // smallest empty node that holds the rest of it.
            let whole = empty.range(..=left).next_back().and_then(|(_, s)| s.first().copied());
            let own = empty.range(left..).next().and_then(|(_, s)| s.first().copied());
            // No empty node is left when both are none: then beside another pool.
            let shared = || {
                partial.iter().copied().max_by_key(|&i| {
                    (pools[i].contains(&pool), pools[i].len() > 1, caps[i] - used[i], std::cmp::Reverse(i))
                })
            };
            let Some(i) = own.or(whole).or_else(shared) else { break };
            if used[i] == 0 {
                if let Some(set) = empty.get_mut(&caps[i]) {
                    set.remove(&i);
                    if set.is_empty() {
                        empty.remove(&caps[i]);
                    }
                }
            }
            let n = left.min(caps[i] - used[i]);
            used[i] += n;
            left -= n;
            if used[i] < caps[i] {
                partial.insert(i);
            } else {
                partial.remove(&i);
            }
            if !pools[i].contains(&pool) {
                pools[i].push(pool);
            }
            out.push(Allocation { node: i, pool, gpus: n });
        }
    }
    out.sort_by_key(|a| a.node);
    out
}

/// Nodes holding more than one pool.
pub fn mixed_nodes(allocations: &[Allocation]) -> usize {
    let mut by_node: Vec<(usize, Vec<Pool>)> = Vec::new();
    for a in allocations {
        match by_node.iter_mut().find(|(n, _)| *n == a.node) {
            Some((_, p)) if !p.contains(&a.pool) => p.push(a.pool),
            Some(_) => {}
            None => by_node.push((a.node, vec![a.pool])),
        }
    }
    by_node.iter().filter(|(_, p)| p.len() > 1).count()
}
