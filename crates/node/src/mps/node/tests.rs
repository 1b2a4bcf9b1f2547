use super::*;

fn settings(replicas: u32, pct: u32, mib: u64) -> MpsSettings {
    MpsSettings { replicas, active_thread_percentage: Some(pct), pinned_memory_limit_mib: Some(mib) }
}

fn running(pct: &str, limit: &str, clients: &[u32], recorded: Option<MpsSettings>) -> DaemonStatus {
    DaemonStatus {
        pid: Some(100),
        up: true,
        active_thread_percentage: Some(pct.into()),
        pinned_memory_limit: Some(limit.into()),
        servers: if clients.is_empty() { vec![] } else { vec![200] },
        clients: clients.to_vec(),
        settings: recorded,
        error: None,
    }
}

#[test]
fn a_matching_daemon_is_adopted_even_with_the_whole_g_readback() {
    let s = settings(4, 25, 7168);
    assert_eq!(decide(Want::Serve(s), &running("25.0", "7G", &[], Some(s)), &[], false), Ok(Action::Keep));
    // Same limits, other slot count (explicit limits): no restart, only the record changes.
    let more = MpsSettings { replicas: 5, ..s };
    assert_eq!(decide(Want::Serve(more), &running("25.0", "7168M", &[], Some(s)), &[], false), Ok(Action::Record));
}

#[test]
fn a_daemon_with_other_limits_is_restarted_unless_busy() {
    let s = settings(4, 25, 8192);
    let st = running("50.0", "8G", &[], None);
    assert!(
        matches!(decide(Want::Serve(s), &st, &[], false), Ok(Action::Restart(why)) if why.contains("percentage is 50.0"))
    );
    let busy = running("50.0", "8G", &[4242, 4243], None);
    let e = decide(Want::Serve(s), &busy, &[], false).unwrap_err();
    assert!(e.contains("connected clients (pids 4242, 4243)") && e.contains("not restarted"), "{e}");
    assert!(matches!(decide(Want::Serve(s), &busy, &[], true), Ok(Action::Restart(_))));
}

#[test]
fn stop_start_and_hung() {
    let s = settings(2, 50, 1024);
    assert_eq!(decide(Want::Serve(s), &DaemonStatus::default(), &[], false), Ok(Action::Start));
    let hung = DaemonStatus { pid: Some(7), up: false, error: Some("timeout".into()), ..DaemonStatus::default() };
    assert!(matches!(decide(Want::Serve(s), &hung, &[], false), Ok(Action::Restart(_))));
    assert_eq!(decide(Want::Off, &running("50", "1G", &[], Some(s)), &[], false), Ok(Action::Stop));
    let e = decide(Want::Off, &running("50", "1G", &[9], Some(s)), &[], false).unwrap_err();
    assert!(e.contains("pids 9") && e.contains("not stopped without --force"), "{e}");
    assert_eq!(decide(Want::Off, &DaemonStatus::default(), &[], false), Ok(Action::None));
    assert_eq!(decide(Want::Leave, &running("50", "1G", &[9], None), &[], false), Ok(Action::None));
    // A daemon that died leaves its record: stopping cleans up (compute mode back to DEFAULT).
    let dead = DaemonStatus { settings: Some(s), ..DaemonStatus::default() };
    assert_eq!(decide(Want::Off, &dead, &[], false), Ok(Action::Stop));
}

#[test]
fn a_daemon_whose_slots_are_allocated_stays() {
    let s = settings(2, 50, 1024);
    let pod = crate::observed::PodUse {
        namespace: "serving".into(),
        pod: "small".into(),
        container: "llm".into(),
        resource: "gpupart.io/mps".into(),
        device_id: "GPU-x::0".into(),
    };
    let e = decide(Want::Off, &running("50", "1G", &[], Some(s)), std::slice::from_ref(&pod), false).unwrap_err();
    assert!(
        e.contains("slots allocated to pod serving/small/llm (gpupart.io/mps)") && e.contains("not stopped"),
        "{e}"
    );
    assert_eq!(decide(Want::Off, &running("50", "1G", &[], Some(s)), &[pod], true), Ok(Action::Stop));
}
