//! Device enumeration and queries that work on physical and MIG device handles.

use super::{call, ci_of, gpu_of, mig_devices, put, put_list, put_str};
use crate::handle::Handle;
use crate::runtime::{read, write, Ret, INSUFFICIENT_SIZE, INVALID_ARGUMENT, NOT_FOUND, VERSION_MISMATCH};
use gpupart_mig::catalog::{Arch, Model};
use gpupart_mig::sim::{ComputeMode, SimGpu, SimProcess, SimState};
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlPciInfo_t, nvmlProcessInfo_t};
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_uint};

/// PCI subsystem id the fake reports for every GPU.
pub const PCI_SUBSYSTEM_ID: u32 = 0x1463_10DE;
/// `nvmlMemory_v2` version word.
pub const MEMORY_V2: c_uint = 0x0200_0028;
const NO_ID: c_uint = 0xFFFF_FFFF;

/// The catalog model of a GPU (the state file was validated on load).
pub(crate) fn model(gpu: &SimGpu) -> Result<&'static Model, Ret> {
    gpu.catalog_model().ok_or(INVALID_ARGUMENT)
}

/// `nvmlDeviceGetCount_v2`.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    call("nvmlDeviceGetCount_v2", || read(|s| unsafe { put(count, s.gpus.len() as c_uint) }))
}

/// `nvmlDeviceGetCount` (legacy alias).
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> Ret {
    unsafe { nvmlDeviceGetCount_v2(count) }
}

/// `nvmlDeviceGetHandleByIndex_v2`.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) -> Ret {
    call("nvmlDeviceGetHandleByIndex_v2", || {
        read(|s| {
            if index as usize >= s.gpus.len() {
                return Err(INVALID_ARGUMENT);
            }
            unsafe { put(device, Handle::Device(index).encode()) }
        })
    })
}

/// `nvmlDeviceGetHandleByIndex` (legacy alias).
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut nvmlDevice_t) -> Ret {
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

/// `nvmlDeviceGetHandleByUUID`: `GPU-…` gives the GPU, `MIG-…` the MIG device.
///
/// # Safety
/// `uuid` is null or a NUL-terminated string; see the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t) -> Ret {
    call("nvmlDeviceGetHandleByUUID", || {
        if uuid.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: non-null and NUL-terminated per the contract.
        let want = unsafe { CStr::from_ptr(uuid) }.to_string_lossy().into_owned();
        read(|s| {
            for g in &s.gpus {
                if g.uuid == want {
                    return unsafe { put(device, Handle::Device(g.index).encode()) };
                }
                for gi in &g.gpu_instances {
                    if let Some(ci) = gi.compute_instances.iter().find(|c| c.uuid == want) {
                        return unsafe { put(device, Handle::MigDevice(g.index, gi.id, ci.id).encode()) };
                    }
                }
            }
            Err(NOT_FOUND)
        })
    })
}

/// `nvmlDeviceGetName`: the product name, or `<product> MIG <profile>` for a MIG device.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(device: nvmlDevice_t, name: *mut c_char, length: c_uint) -> Ret {
    call("nvmlDeviceGetName", || {
        read(|s| {
            let text = match Handle::decode(device) {
                Some(Handle::MigDevice(..)) => {
                    let (gpu, gi, ci) = ci_of(s, device)?;
                    let m = model(gpu)?;
                    let table = m.profile_table();
                    let p = table.by_id(gi.profile_id).ok_or(INVALID_ARGUMENT)?;
                    format!("{} MIG {}", m.nvml_name, p.device_name(ci.profile_id))
                }
                _ => model(gpu_of(s, device)?)?.nvml_name.to_string(),
            };
            unsafe { put_str(name, length, &text) }
        })
    })
}

/// `nvmlDeviceGetUUID`: `GPU-…`, or the MIG device's `MIG-…`.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) -> Ret {
    call("nvmlDeviceGetUUID", || {
        read(|s| {
            let text = match Handle::decode(device) {
                Some(Handle::MigDevice(..)) => ci_of(s, device)?.2.uuid.clone(),
                _ => gpu_of(s, device)?.uuid.clone(),
            };
            unsafe { put_str(uuid, length, &text) }
        })
    })
}

/// The physical GPU behind a physical or MIG device handle.
pub(crate) fn parent(s: &SimState, device: nvmlDevice_t) -> Result<&SimGpu, Ret> {
    match Handle::decode(device) {
        Some(Handle::MigDevice(..)) => Ok(ci_of(s, device)?.0),
        _ => gpu_of(s, device),
    }
}

fn pci_info(gpu: &SimGpu, m: &Model) -> nvmlPciInfo_t {
    // SAFETY: nvmlPciInfo_t is plain old data; all-zero is a valid value.
    let mut p: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
    let bus = u32::from_str_radix(gpu.bus_id.get(9..11).unwrap_or("0"), 16).unwrap_or(0);
    super::fill_name(&mut p.busIdLegacy, gpu.bus_id.get(4..).unwrap_or(&gpu.bus_id));
    super::fill_name(&mut p.busId, &gpu.bus_id);
    p.domain = 0;
    p.bus = bus;
    p.device = 0;
    p.pciDeviceId = m.pci_device_id;
    p.pciSubSystemId = PCI_SUBSYSTEM_ID;
    p
}

/// `nvmlDeviceGetPciInfo_v3`.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) -> Ret {
    call("nvmlDeviceGetPciInfo_v3", || {
        read(|s| {
            let gpu = parent(s, device)?;
            unsafe { put(pci, pci_info(gpu, model(gpu)?)) }
        })
    })
}

/// `nvmlDeviceGetPciInfo` (legacy alias of `_v3`).
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) -> Ret {
    unsafe { nvmlDeviceGetPciInfo_v3(device, pci) }
}

fn processes_of(gpu: &SimGpu) -> u64 {
    gpu.all_processes().map(|p| p.used_memory_mib).sum::<u64>() * 1024 * 1024
}

/// (total, used) bytes of a physical or MIG device.
fn memory(s: &SimState, device: nvmlDevice_t) -> Result<(u64, u64), Ret> {
    match Handle::decode(device) {
        Some(Handle::MigDevice(..)) => {
            let (gpu, gi, ci) = ci_of(s, device)?;
            let table = model(gpu)?.profile_table();
            let p = table.by_id(gi.profile_id).ok_or(INVALID_ARGUMENT)?;
            let used: u64 = gi.processes.iter().chain(&ci.processes).map(|p| p.used_memory_mib).sum();
            Ok((p.memory_mib * 1024 * 1024, used * 1024 * 1024))
        }
        _ => {
            let gpu = gpu_of(s, device)?;
            Ok((model(gpu)?.memory_bytes(), processes_of(gpu)))
        }
    }
}

/// `nvmlDeviceGetMemoryInfo` (v1 struct).
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, mem: *mut nvmlMemory_t) -> Ret {
    call("nvmlDeviceGetMemoryInfo", || {
        read(|s| {
            let (total, used) = memory(s, device)?;
            unsafe { put(mem, nvmlMemory_t { total, free: total.saturating_sub(used), used }) }
        })
    })
}

/// `nvmlDeviceGetMemoryInfo_v2`: checks `version` (0x02000028).
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, mem: *mut nvmlMemory_v2_t) -> Ret {
    call("nvmlDeviceGetMemoryInfo_v2", || {
        if mem.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: non-null, valid for reads per the contract.
        if unsafe { (*mem).version } != MEMORY_V2 {
            return Err(VERSION_MISMATCH);
        }
        read(|s| {
            let (total, used) = memory(s, device)?;
            let v = nvmlMemory_v2_t { version: MEMORY_V2, total, reserved: 0, free: total.saturating_sub(used), used };
            unsafe { put(mem, v) }
        })
    })
}

/// `nvmlDeviceGetArchitecture`.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(device: nvmlDevice_t, arch: *mut c_uint) -> Ret {
    call("nvmlDeviceGetArchitecture", || {
        read(|s| {
            let v = match model(parent(s, device)?)?.arch {
                Arch::Pascal => 4,
                Arch::Volta => 5,
                Arch::Turing => 6,
                Arch::Ampere => 7,
                Arch::Ada => 8,
                Arch::Hopper => 9,
                Arch::Blackwell => 10,
            };
            unsafe { put(arch, v) }
        })
    })
}

/// `nvmlDeviceGetCudaComputeCapability`.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> Ret {
    call("nvmlDeviceGetCudaComputeCapability", || {
        read(|s| {
            let (a, b) = model(parent(s, device)?)?.compute_capability;
            unsafe {
                put(major, a as c_int)?;
                put(minor, b as c_int)
            }
        })
    })
}

/// `nvmlDeviceGetIndex`: the GPU index, or a MIG device's index on its parent.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> Ret {
    call("nvmlDeviceGetIndex", || {
        read(|s| {
            let v = match Handle::decode(device) {
                Some(Handle::MigDevice(_, gi, ci)) => {
                    let gpu = ci_of(s, device)?.0;
                    mig_devices(gpu).iter().position(|d| *d == (gi, ci)).ok_or(INVALID_ARGUMENT)? as c_uint
                }
                _ => gpu_of(s, device)?.index,
            };
            unsafe { put(index, v) }
        })
    })
}

/// `nvmlDeviceGetMinorNumber` (the index).
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(device: nvmlDevice_t, minor: *mut c_uint) -> Ret {
    call("nvmlDeviceGetMinorNumber", || read(|s| unsafe { put(minor, gpu_of(s, device)?.index) }))
}

fn info(p: &SimProcess, gi: c_uint, ci: c_uint) -> nvmlProcessInfo_t {
    nvmlProcessInfo_t {
        pid: p.pid,
        usedGpuMemory: p.used_memory_mib * 1024 * 1024,
        gpuInstanceId: gi,
        computeInstanceId: ci,
    }
}

/// Processes visible through a handle, with their GI/CI ids.
fn processes(s: &SimState, device: nvmlDevice_t) -> Result<Vec<nvmlProcessInfo_t>, Ret> {
    if let Some(Handle::MigDevice(..)) = Handle::decode(device) {
        let (_, gi, ci) = ci_of(s, device)?;
        return Ok(ci.processes.iter().map(|p| info(p, gi.id, ci.id)).collect());
    }
    let gpu = gpu_of(s, device)?;
    let mut out: Vec<_> = gpu.processes.iter().map(|p| info(p, NO_ID, NO_ID)).collect();
    for gi in &gpu.gpu_instances {
        out.extend(gi.processes.iter().map(|p| info(p, gi.id, NO_ID)));
        for ci in &gi.compute_instances {
            out.extend(ci.processes.iter().map(|p| info(p, gi.id, ci.id)));
        }
    }
    Ok(out)
}

/// `nvmlDeviceGetComputeRunningProcesses_v3`.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> Ret {
    call("nvmlDeviceGetComputeRunningProcesses_v3", || {
        read(|s| {
            let list = processes(s, device)?;
            let r = unsafe { put_list(infos, count, &list) };
            // A count query on a busy device answers INSUFFICIENT_SIZE, as NVML does.
            if infos.is_null() && !list.is_empty() {
                return Err(INSUFFICIENT_SIZE);
            }
            r
        })
    })
}

/// `nvmlDeviceGetComputeRunningProcesses` (legacy alias of `_v3`).
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> Ret {
    unsafe { nvmlDeviceGetComputeRunningProcesses_v3(device, count, infos) }
}

/// `nvmlDeviceGetComputeMode` (physical GPUs only).
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(device: nvmlDevice_t, mode: *mut c_uint) -> Ret {
    call("nvmlDeviceGetComputeMode", || read(|s| unsafe { put(mode, gpu_of(s, device)?.compute_mode.nvml_value()) }))
}

/// `nvmlDeviceSetComputeMode`: an unknown value is `INVALID_ARGUMENT`, the removed
/// EXCLUSIVE_THREAD mode `NOT_SUPPORTED`.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetComputeMode(device: nvmlDevice_t, mode: c_uint) -> Ret {
    call("nvmlDeviceSetComputeMode", || {
        let wanted = ComputeMode::from_nvml(mode).ok_or(INVALID_ARGUMENT)?;
        let index = read(|s| Ok(gpu_of(s, device)?.index))?;
        write(|s| s.set_compute_mode(index, wanted))
    })
}
