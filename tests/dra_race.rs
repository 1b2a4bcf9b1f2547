//! `agent --dra` against a scheduler that allocates at any moment: the real binary on eight fake
//! H100s, the fake kubelet preparing every allocated claim, and the racing stand-in
//! (tests/support/racing_scheduler.rs) reading the slices one write at a time as an informer
//! does and allocating between any two writes while the plugin republishes, with at least 28
//! claims in flight and churn (random profiles, whole GPUs, releases).

mod support;

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};
use support::dra_rig::{DraRig, NODE};
use support::racing_scheduler::{RacingScheduler, Want};
use support::rng::Rng;

const MODEL: &str = "H100-SXM5-80GB";
const IN_FLIGHT: usize = 28;
const CLAIMS: usize = 220;

fn random_want(rng: &mut Rng) -> Want {
    match rng.below(100) {
        0..=39 => Want::Mig("1g.10gb".into()),
        40..=54 => Want::Mig("1g.20gb".into()),
        55..=69 => Want::Mig("2g.20gb".into()),
        70..=81 => Want::Mig("3g.40gb".into()),
        82..=89 => Want::Mig("4g.40gb".into()),
        90..=94 => Want::Mig("7g.80gb".into()),
        _ => Want::Gpu,
    }
}

#[test]
fn under_churn_no_allocation_overlaps_every_prepare_succeeds_and_no_claim_that_fits_is_refused() {
    let rig = DraRig::start(&format!("{MODEL}:8"));
    rig.kubelet.wait_registered(1);
    rig.wait_slices("the pool", |s| s.iter().any(|(_, x)| !x.devices.is_empty()));
    let table = gpupart::mig::catalog::lookup(MODEL).expect("catalog").profile_table();
    let tables: BTreeMap<u32, _> = (0..8).map(|i| (i, table.clone())).collect();
    let sched = RacingScheduler::start(rig.api.handle(), tables, NODE);
    let mut rng = Rng(0x5eed_0032);
    let (mut created, mut prepare_errors, mut unprepare_errors) = (0usize, Vec::new(), Vec::new());
    // Running claims with the step at which they end.
    let mut running: VecDeque<(String, usize)> = VecDeque::new();
    let started = Instant::now();
    let mut step = 0usize;
    let mut most_in_flight = 0usize;
    while started.elapsed() < Duration::from_secs(90) {
        step += 1;
        // Keep IN_FLIGHT claims waiting for allocation or Prepare.
        let waiting = created - sched.books.lock().unwrap().allocations;
        for _ in waiting..IN_FLIGHT {
            if created == CLAIMS {
                break;
            }
            let name = format!("c{created:03}");
            let want = random_want(&mut rng);
            match &want {
                Want::Mig(p) => rig.mig_claim(&name, p),
                Want::Gpu => rig.claim(&name, &[("gpu", "gpu.gpupart.io", "", 1)]),
            };
            sched.submit(&name, want);
            created += 1;
        }
        most_in_flight = most_in_flight.max(created - sched.books.lock().unwrap().allocations);
        // The kubelet prepares what was allocated (pods start).
        for name in sched.take_fresh() {
            match rig.prepare(&name) {
                Ok(_) => running.push_back((name, step + 1 + rng.below(12) as usize)),
                Err(e) => prepare_errors.push(format!("{name}: {e}")),
            }
        }
        // Pods end: Unprepare, then the claim is deallocated.
        let ending: Vec<String> = running.iter().filter(|(_, end)| *end <= step).map(|(n, _)| n.clone()).collect();
        running.retain(|(_, end)| *end > step);
        for name in ending {
            let e = rig.unprepare(&name);
            if !e.is_empty() {
                unprepare_errors.push(format!("{name}: {e}"));
            }
            rig.delete_claim(&name);
            sched.release(&name);
        }
        let done = created == CLAIMS && sched.books.lock().unwrap().queue.is_empty() && running.is_empty();
        if done {
            break;
        }
        if running.is_empty() && sched.books.lock().unwrap().fresh.is_empty() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let books = std::mem::take(&mut *sched.books.lock().unwrap());
    drop(sched);
    eprintln!(
        "{} allocations of {created} claims in {:.1} s, {} refusals ({} while the pool was unusable), {} slice writes ({:.2} per allocation), at most {most_in_flight} in flight",
        books.allocations,
        started.elapsed().as_secs_f64(),
        books.refusals,
        books.unusable,
        books.slice_events,
        books.slice_events as f64 / books.allocations.max(1) as f64
    );
    assert!(books.overlaps.is_empty(), "overlapping allocations: {:#?}", books.overlaps);
    assert!(prepare_errors.is_empty(), "failed Prepare calls: {prepare_errors:#?}");
    assert!(unprepare_errors.is_empty(), "failed Unprepare calls: {unprepare_errors:#?}");
    assert!(books.refused_with_room.is_empty(), "claims refused while they fit: {:#?}", books.refused_with_room);
    assert!(most_in_flight >= IN_FLIGHT, "{most_in_flight} claims in flight at most");
    assert_eq!(books.allocations, CLAIMS, "every claim allocated in the end");
}
