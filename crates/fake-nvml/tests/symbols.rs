//! Every function of the NVML API header resolves in the built fake (NVIDIA's clients resolve
//! their symbols at load time), and the inventory calls they make answer. The header's function
//! list is read from nvml-wrapper-sys's generated bindings, found with `cargo metadata`.

mod common;

use common::fake_library;
use nvml_wrapper_sys::bindings::{nvmlDevice_t, NvmlLib};
use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::process::Command;

/// The function names of nvml-wrapper-sys's bindings (NVIDIA's header as it binds it).
fn header_functions() -> Vec<String> {
    // Only the host's packages: those are the ones a build has fetched.
    let host = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--offline", "--filter-platform", &host])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata");
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let manifest = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "nvml-wrapper-sys")
        .and_then(|p| p["manifest_path"].as_str())
        .expect("nvml-wrapper-sys in the metadata")
        .to_string();
    let bindings = std::path::Path::new(&manifest).with_file_name("src").join("bindings.rs");
    let text = std::fs::read_to_string(&bindings).unwrap_or_else(|e| panic!("{}: {e}", bindings.display()));
    let mut names: Vec<String> = text
        .split("pub unsafe fn ")
        .skip(1)
        .filter_map(|rest| rest.split(|c: char| !(c.is_alphanumeric() || c == '_')).next())
        .filter(|n| n.starts_with("nvml"))
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn every_header_function_resolves() {
    let names = header_functions();
    assert!(names.len() >= 396, "only {} functions read from the bindings", names.len());
    // SAFETY: loading the fake runs no initialiser with side effects beyond its own statics.
    let lib = unsafe { libloading::Library::new(fake_library()) }.unwrap();
    let missing: Vec<&String> =
        names.iter().filter(|n| unsafe { lib.get::<*const ()>(format!("{n}\0").as_bytes()) }.is_err()).collect();
    assert!(missing.is_empty(), "{} of {} header functions missing: {missing:?}", missing.len(), names.len());
    // The stubs are exactly what the fake does not serve, named in its list.
    assert!(fake_nvml::abi::unsupported::NOT_SERVED.len() < names.len());
}

fn ok(r: u32, what: &str) {
    assert_eq!(r, 0, "{what} returned {r}");
}

#[test]
fn inventory_calls_answer_and_unserved_ones_say_not_supported() {
    let dir = tempfile::tempdir().unwrap();
    std::env::set_var("FAKE_NVML_GPUS", "A100-SXM4-80GB:2");
    std::env::set_var("FAKE_NVML_STATE", dir.path().join("state.json"));
    // SAFETY: the fake NVML, used through the header's signatures.
    let nvml = unsafe { NvmlLib::new(fake_library()) }.unwrap();
    unsafe {
        ok(nvml.nvmlInit_v2(), "init");
        let mut by_index: nvmlDevice_t = std::ptr::null_mut();
        ok(nvml.nvmlDeviceGetHandleByIndex_v2(1, &mut by_index), "by index");
        let mut pci = std::mem::zeroed();
        ok(nvml.nvmlDeviceGetPciInfo_v3(by_index, &mut pci), "pci info");
        let bus = CStr::from_ptr(pci.busId.as_ptr()).to_string_lossy().into_owned();
        // Every bus id form NVML accepts finds the same GPU.
        let short = bus.trim_start_matches('0').trim_start_matches(':').to_string();
        for form in [bus.clone(), bus[4..].to_string(), bus.to_lowercase(), short] {
            let mut h: nvmlDevice_t = std::ptr::null_mut();
            let c = CString::new(form.clone()).unwrap();
            ok(nvml.nvmlDeviceGetHandleByPciBusId_v2(c.as_ptr(), &mut h), &form);
            assert_eq!(h, by_index, "{form}");
        }
        let mut h: nvmlDevice_t = std::ptr::null_mut();
        let none = CString::new("0000:99:00.0").unwrap();
        assert_eq!(nvml.nvmlDeviceGetHandleByPciBusId_v2(none.as_ptr(), &mut h), 6, "NOT_FOUND");
        let mut buf = [0 as c_char; 64];
        ok(nvml.nvmlDeviceGetSerial(by_index, buf.as_mut_ptr(), 64), "serial");
        let serial = CStr::from_ptr(buf.as_ptr()).to_owned();
        assert_eq!(serial.to_bytes().len(), 13);
        ok(nvml.nvmlDeviceGetHandleBySerial(serial.as_ptr(), &mut h), "by serial");
        assert_eq!(h, by_index);
        ok(nvml.nvmlDeviceGetBoardPartNumber(by_index, buf.as_mut_ptr(), 64), "part number");
        let mut mode = 9;
        ok(nvml.nvmlDeviceGetPersistenceMode(by_index, &mut mode), "persistence");
        assert_eq!(mode, 1);
        // A function the simulator has no data for answers NOT_SUPPORTED, not a crash.
        let mut speed = 0;
        assert_eq!(nvml.nvmlDeviceGetFanSpeed(by_index, &mut speed), 3);
        let mut temp = 0;
        assert_eq!(nvml.nvmlDeviceGetTemperature(by_index, 0, &mut temp), 3);
        ok(nvml.nvmlShutdown(), "shutdown");
    }
}

/// Functions of the newer NVML header (13.x) that NVIDIA's go-nvml vendors and nvml-wrapper-sys
/// does not bind yet (read from go-nvml's `pkg/nvml/nvml.h`, 2026-12).
const NEWER_HEADER: [&str; 17] = [
    "nvmlDeviceGetAccountingStats_v2",
    "nvmlDeviceGetBBXTimeData_v1",
    "nvmlDeviceGetHostname_v1",
    "nvmlDeviceGetRemappedRows_v2",
    "nvmlDeviceGetUnrepairableMemoryFlag_v1",
    "nvmlDeviceGetVgpuSchedulerLog_v2",
    "nvmlDeviceGetVgpuSchedulerState_v2",
    "nvmlDeviceReadPRMCounters_v1",
    "nvmlDeviceSetHostname_v1",
    "nvmlDeviceSetRusdSettings_v1",
    "nvmlDeviceSetVgpuSchedulerState_v2",
    "nvmlDeviceVgpuForceGspUnload",
    "nvmlDeviceWorkloadPowerProfileUpdateProfiles_v1",
    "nvmlGpuInstanceGetVgpuSchedulerLog_v2",
    "nvmlGpuInstanceGetVgpuSchedulerState_v2",
    "nvmlGpuInstanceSetVgpuSchedulerState_v2",
    "nvmlSystemGetCPER_v1",
];

#[test]
fn newer_header_functions_resolve_too() {
    // SAFETY: as above.
    let lib = unsafe { libloading::Library::new(fake_library()) }.unwrap();
    let missing: Vec<&str> = NEWER_HEADER
        .iter()
        .copied()
        .filter(|n| unsafe { lib.get::<*const ()>(format!("{n}\0").as_bytes()) }.is_err())
        .collect();
    assert!(missing.is_empty(), "missing: {missing:?}");
    assert!(NEWER_HEADER.iter().all(|n| fake_nvml::abi::unsupported::NOT_SERVED.contains(n)));
}
