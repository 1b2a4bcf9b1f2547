//! Inventory calls NVIDIA's clients make (mig-parted, the device plugin, GPU feature discovery,
//! dcgm-exporter): handles by PCI bus id and serial, serial, board part number, persistence mode.

use super::device::model;
use super::{call, gpu_of, put, put_str};
use crate::handle::Handle;
use crate::ident;
use crate::runtime::{read, Ret, INVALID_ARGUMENT, NOT_FOUND};
use nvml_wrapper_sys::bindings::nvmlDevice_t;
use std::ffi::CStr;
use std::os::raw::{c_char, c_uint};

/// # Safety
/// `s` is null or NUL-terminated.
unsafe fn text(s: *const c_char) -> Result<String, Ret> {
    if s.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null and NUL-terminated per the contract.
    Ok(unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
}

fn by(device: *mut nvmlDevice_t, matches: impl Fn(&gpupart_mig::sim::SimGpu) -> bool) -> Result<(), Ret> {
    read(|s| {
        let g = s.gpus.iter().find(|g| matches(g)).ok_or(NOT_FOUND)?;
        unsafe { put(device, Handle::Device(g.index).encode()) }
    })
}

/// `nvmlDeviceGetHandleByPciBusId_v2`: every bus id form NVML accepts.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(bus_id: *const c_char, device: *mut nvmlDevice_t) -> Ret {
    call("nvmlDeviceGetHandleByPciBusId_v2", || {
        let want = ident::bus_id(&unsafe { text(bus_id) }?).ok_or(INVALID_ARGUMENT)?;
        by(device, |g| ident::bus_id(&g.bus_id) == Some(want))
    })
}

/// `nvmlDeviceGetHandleByPciBusId` (the v1 name).
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(bus_id: *const c_char, device: *mut nvmlDevice_t) -> Ret {
    unsafe { nvmlDeviceGetHandleByPciBusId_v2(bus_id, device) }
}

/// `nvmlDeviceGetHandleBySerial`.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleBySerial(serial: *const c_char, device: *mut nvmlDevice_t) -> Ret {
    call("nvmlDeviceGetHandleBySerial", || {
        let want = unsafe { text(serial) }?;
        by(device, |g| ident::serial(g) == want.trim())
    })
}

/// `nvmlDeviceGetSerial`: 13 digits derived from the UUID (physical devices only).
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSerial(device: nvmlDevice_t, serial: *mut c_char, length: c_uint) -> Ret {
    call("nvmlDeviceGetSerial", || read(|s| unsafe { put_str(serial, length, &ident::serial(gpu_of(s, device)?)) }))
}

/// `nvmlDeviceGetBoardPartNumber` (synthetic, from the PCI device id).
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetBoardPartNumber(device: nvmlDevice_t, part: *mut c_char, length: c_uint) -> Ret {
    call("nvmlDeviceGetBoardPartNumber", || {
        read(|s| {
            let m = model(gpu_of(s, device)?)?;
            unsafe { put_str(part, length, &ident::board_part_number(m.pci_device_id)) }
        })
    })
}

/// `nvmlDeviceGetPersistenceMode`: enabled, as on a node running nvidia-persistenced.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(device: nvmlDevice_t, mode: *mut c_uint) -> Ret {
    call("nvmlDeviceGetPersistenceMode", || {
        read(|s| {
            gpu_of(s, device)?;
            unsafe { put(mode, 1) }
        })
    })
}
