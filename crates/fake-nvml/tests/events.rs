//! NVML's event API on the fake, called through the header's signatures as NVIDIA's go-nvml calls
//! them (the device plugin's health check: supported types, a set, registration per GPU, waits
//! with a timeout, `nvmlEventData_t` read field by field), with events injected into the state
//! file as a test or `fake-nvidia-smi` does.

mod common;

use common::fake_library;
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t, NvmlLib};
use std::time::{Duration, Instant};

const XID: u64 = 0x8;
const TIMEOUT: u32 = 10;

fn ok(r: u32, what: &str) {
    assert_eq!(r, 0, "{what} returned {r}");
}

#[test]
fn registered_gpus_get_their_injected_events_in_order_and_others_time_out() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    std::env::set_var("FAKE_NVML_GPUS", "A100-SXM4-80GB:2");
    std::env::set_var("FAKE_NVML_STATE", &state);
    let inject = |gpu: u32, kind: u64, data: u64, instance: Option<(u32, u32)>| {
        fake_nvml::runtime::write_file(&state, |s| Ok(s.inject_event(gpu, kind, data, instance))).unwrap()
    };
    // SAFETY: the fake NVML, used through the header's signatures.
    let nvml = unsafe { NvmlLib::new(fake_library()) }.unwrap();
    unsafe {
        ok(nvml.nvmlInit_v2(), "init");
        let (mut gpu0, mut gpu1): (nvmlDevice_t, nvmlDevice_t) = (std::ptr::null_mut(), std::ptr::null_mut());
        ok(nvml.nvmlDeviceGetHandleByIndex_v2(0, &mut gpu0), "gpu 0");
        ok(nvml.nvmlDeviceGetHandleByIndex_v2(1, &mut gpu1), "gpu 1");
        // Before the set exists: not delivered to it.
        inject(1, XID, 31, None);
        let mut types = 0u64;
        ok(nvml.nvmlDeviceGetSupportedEventTypes(gpu1, &mut types), "supported types");
        assert_eq!(types, 0x8 | 0x1 | 0x2, "XID and ECC events");
        let mut set: nvmlEventSet_t = std::ptr::null_mut();
        ok(nvml.nvmlEventSetCreate(&mut set), "set");
        assert_eq!(nvml.nvmlDeviceRegisterEvents(gpu1, 0x10, set), 3, "clock events: NOT_SUPPORTED");
        ok(nvml.nvmlDeviceRegisterEvents(gpu1, XID, set), "register GPU 1");
        let mut data: nvmlEventData_t = std::mem::zeroed();
        let t = Instant::now();
        assert_eq!(nvml.nvmlEventSetWait_v2(set, &mut data, 100), TIMEOUT, "nothing new yet");
        assert!(t.elapsed() >= Duration::from_millis(100) && t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        // GPU 0 is not registered; GPU 1's XID 79 and then a MIG instance's XID come in order.
        inject(0, XID, 79, None);
        inject(1, XID, 79, None);
        inject(1, XID, 94, Some((3, 0)));
        ok(nvml.nvmlEventSetWait_v2(set, &mut data, 1000), "first event");
        assert_eq!((data.device, data.eventType, data.eventData), (gpu1, XID, 79));
        assert_eq!((data.gpuInstanceId, data.computeInstanceId), (0xFFFF_FFFF, 0xFFFF_FFFF), "the whole GPU");
        // The v1 symbol (go-nvml binds it too; nvml-wrapper-sys only the v2).
        let lib = libloading::Library::new(fake_library()).unwrap();
        type Wait = unsafe extern "C" fn(nvmlEventSet_t, *mut nvmlEventData_t, u32) -> u32;
        let wait_v1: libloading::Symbol<Wait> = lib.get(b"nvmlEventSetWait\0").unwrap();
        ok(wait_v1(set, &mut data, 1000), "second event (v1)");
        assert_eq!((data.eventData, data.gpuInstanceId, data.computeInstanceId), (94, 3, 0));
        assert_eq!(nvml.nvmlEventSetWait_v2(set, &mut data, 50), TIMEOUT, "GPU 0's event is not this set's");
        // An event injected while a waiter blocks wakes it.
        let waiter = {
            let state = state.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                fake_nvml::runtime::write_file(&state, |s| Ok(s.inject_event(1, XID, 48, None))).unwrap();
            })
        };
        ok(nvml.nvmlEventSetWait_v2(set, &mut data, 5000), "woken");
        assert_eq!(data.eventData, 48);
        waiter.join().unwrap();
        ok(nvml.nvmlEventSetFree(set), "free");
        assert_eq!(nvml.nvmlEventSetWait_v2(set, &mut data, 10), 2, "a freed set: INVALID_ARGUMENT");
        assert_eq!(nvml.nvmlEventSetFree(set), 2);
        ok(nvml.nvmlShutdown(), "shutdown");
    }
}
