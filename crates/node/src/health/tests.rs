use super::*;

fn xid(gpu: u32, x: u64, at: i64) -> GpuEvent {
    GpuEvent { gpu, kind: EventKind::Xid(x), instance: None, at }
}

#[test]
fn device_faults_fence_and_application_xids_do_not() {
    let p = XidPolicy::default();
    for x in APPLICATION_XIDS {
        assert_eq!(fault(EventKind::Xid(x), &p), None, "XID {x} is an application's");
    }
    assert_eq!(fault(EventKind::Xid(79), &p).as_deref(), Some("XID 79"));
    assert_eq!(fault(EventKind::Xid(48), &p).as_deref(), Some("XID 48"));
    assert_eq!(fault(EventKind::DoubleBitEcc, &p).as_deref(), Some("double-bit ECC error"));
    assert_eq!(fault(EventKind::SingleBitEcc, &p), None, "corrected");
    assert_eq!(fault(EventKind::GpuLost, &p).as_deref(), Some("GPU is lost"));
    // The flag ignores more XIDs, or fences on an application one.
    let q = XidPolicy::parse("48, -43").unwrap();
    assert_eq!(fault(EventKind::Xid(48), &q), None);
    assert_eq!(fault(EventKind::Xid(43), &q).as_deref(), Some("XID 43"));
    assert_eq!(fault(EventKind::Xid(13), &q), None, "the rest of NVIDIA's list stays");
    assert_eq!(XidPolicy::parse("79,x9").unwrap_err().item, "x9");
    assert_eq!(XidPolicy::parse("--4").unwrap_err().item, "--4");
    assert_eq!(XidPolicy::parse(""), Ok(XidPolicy::default()));
}

#[test]
fn the_first_fault_marks_a_gpu_until_it_is_recovered_and_unknown_gpus_are_refused() {
    let p = XidPolicy::default();
    let mut book = HealthBook::default();
    let known = [0, 1];
    assert_eq!(book.record(&xid(1, 43, 10), &known, &p), Ok(None), "an application XID");
    assert!(!book.is_unhealthy(1));
    let first = book.record(&xid(1, 79, 11), &known, &p).unwrap().cloned().expect("fenced now");
    assert_eq!((first.reason.as_str(), first.xid, first.since, first.faults), ("XID 79", Some(79), 11, 1));
    let mig = GpuEvent { gpu: 1, kind: EventKind::Xid(94), instance: Some((3, 0)), at: 12 };
    assert_eq!(book.record(&mig, &known, &p), Ok(None), "already unhealthy: no new change");
    assert_eq!(book.unhealthy()[&1].faults, 2);
    assert_eq!(book.unhealthy()[&1].reason, "XID 79", "the first fault is kept");
    assert!(!book.is_unhealthy(0));
    let e = book.record(&xid(7, 79, 13), &known, &p).unwrap_err();
    assert!(e.contains("GPU 7"), "{e}");
    assert!(book.recover(1));
    assert!(!book.is_unhealthy(1) && !book.recover(1));
    // Only a recovery brings it back: no timer.
    let again = book.record(&mig, &known, &p).unwrap().cloned().expect("fenced again");
    assert_eq!(again.instance, Some((3, 0)));
}

#[test]
fn the_record_file_reads_back_and_names_what_is_wrong() {
    let p = XidPolicy::default();
    let mut book = HealthBook::default();
    book.record(&xid(1, 79, 11), &[0, 1], &p).unwrap();
    let mig = GpuEvent { gpu: 0, kind: EventKind::DoubleBitEcc, instance: Some((3, 0)), at: 12 };
    book.record(&mig, &[0, 1], &p).unwrap();
    let text = book.to_file();
    assert_eq!(HealthBook::from_file(&text), Ok(book.clone()));
    assert!(text.contains("\"reason\": \"XID 79\""), "{text}");
    assert!(HealthBook::from_file(r#"{"version": 2}"#).unwrap_err().contains("version 2"));
    assert!(HealthBook::from_file(r#"{"version": 1, "gpus": {}}"#).unwrap_err().contains("gpus"));
    assert_eq!(parse_gpus("all", &book), Ok(vec![0, 1]));
    assert_eq!(parse_gpus(" 3, 1,1", &book), Ok(vec![1, 3]));
    assert!(parse_gpus("1,x", &book).unwrap_err().contains("'x'"));
    assert!(parse_gpus(" ", &book).is_err());
}

#[test]
fn a_fault_naming_a_mig_device_fences_its_slices_once_and_a_gpu_fault_takes_over() {
    let p = XidPolicy::default();
    let mut book = HealthBook::default();
    let at = |gi, x| GpuEvent { gpu: 1, kind: EventKind::Xid(x), instance: Some((gi, 0)), at: 7 };
    let place = crate::mig::Placement::new(4, 1);
    assert_eq!(book.record_mig(&at(3, 43), "1g.10gb", place, &[0, 1], &p), Ok(None), "an application's");
    let f = book.record_mig(&at(3, 94), "1g.10gb", place, &[0, 1], &p).unwrap().cloned().expect("new");
    assert_eq!((f.device(), f.fault.reason.as_str(), f.fault.instance), ("1g.10gb@4".into(), "XID 94", Some((3, 0))));
    assert_eq!(book.record_mig(&at(3, 94), "1g.10gb", place, &[0, 1], &p), Ok(None), "counted there");
    assert_eq!(book.mig_faults(1).next().map(|m| m.fault.faults), Some(2));
    assert!(!book.is_unhealthy(1), "the rest of the GPU serves on");
    assert!(book.record_mig(&at(3, 94), "1g.10gb", place, &[0], &p).is_err(), "a GPU the node lacks");
    let text = book.to_file();
    assert_eq!(HealthBook::from_file(&text), Ok(book.clone()));
    assert_eq!(parse_gpus("all", &book), Ok(vec![1]));
    book.record(&xid(1, 79, 8), &[0, 1], &p).unwrap();
    assert_eq!(book.record_mig(&at(5, 94), "2g.20gb", place, &[0, 1], &p), Ok(None), "the GPU is fenced whole");
    assert!(book.recover(1) && book.mig_faults(1).next().is_none() && !book.is_unhealthy(1));
    assert!(!book.recover(1));
}
