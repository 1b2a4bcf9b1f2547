//! MIG device handles: enumeration, identity and attributes.

use super::device::model;
use super::gi::mig_table;
use super::{call, ci_of, gpu_of, mig_devices, put};
use crate::handle::Handle;
use crate::runtime::{read, Ret, INVALID_ARGUMENT, NOT_FOUND};
use nvml_wrapper_sys::bindings::{nvmlDeviceAttributes_t, nvmlDevice_t};
use std::os::raw::c_uint;

/// `nvmlDeviceIsMigDeviceHandle`.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(device: nvmlDevice_t, is_mig: *mut c_uint) -> Ret {
    call("nvmlDeviceIsMigDeviceHandle", || {
        read(|s| {
            let mig = match Handle::decode(device) {
                Some(Handle::MigDevice(..)) => ci_of(s, device).map(|_| 1)?,
                _ => gpu_of(s, device).map(|_| 0)?,
            };
            unsafe { put(is_mig, mig) }
        })
    })
}

/// `nvmlDeviceGetGpuInstanceId` on a MIG device handle.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(device: nvmlDevice_t, id: *mut c_uint) -> Ret {
    call("nvmlDeviceGetGpuInstanceId", || read(|s| unsafe { put(id, ci_of(s, device)?.1.id) }))
}

/// `nvmlDeviceGetComputeInstanceId` on a MIG device handle.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(device: nvmlDevice_t, id: *mut c_uint) -> Ret {
    call("nvmlDeviceGetComputeInstanceId", || read(|s| unsafe { put(id, ci_of(s, device)?.2.id) }))
}

/// `nvmlDeviceGetMaxMigDeviceCount`: the compute slices with MIG enabled, 0 otherwise.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(device: nvmlDevice_t, count: *mut c_uint) -> Ret {
    call("nvmlDeviceGetMaxMigDeviceCount", || {
        read(|s| {
            let gpu = gpu_of(s, device)?;
            let n = match mig_table(gpu) {
                Ok(t) if gpu.mig_mode.current => t.compute_slices,
                _ => 0,
            };
            unsafe { put(count, n) }
        })
    })
}

/// `nvmlDeviceGetMigDeviceHandleByIndex`: MIG devices ordered by GI id, then CI id.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig_device: *mut nvmlDevice_t,
) -> Ret {
    call("nvmlDeviceGetMigDeviceHandleByIndex", || {
        read(|s| {
            let gpu = gpu_of(s, device)?;
            let t = mig_table(gpu)?;
            if !gpu.mig_mode.current || index >= t.compute_slices {
                return Err(INVALID_ARGUMENT);
            }
            let (gi, ci) = *mig_devices(gpu).get(index as usize).ok_or(NOT_FOUND)?;
            unsafe { put(mig_device, Handle::MigDevice(gpu.index, gi, ci).encode()) }
        })
    })
}

/// `nvmlDeviceGetDeviceHandleFromMigDeviceHandle`.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> Ret {
    call("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", || {
        read(|s| {
            let gpu = ci_of(s, mig_device)?.0;
            unsafe { put(device, Handle::Device(gpu.index).encode()) }
        })
    })
}

/// `nvmlDeviceGetAttributes_v2`: MIG device handles only.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: nvmlDevice_t,
    attributes: *mut nvmlDeviceAttributes_t,
) -> Ret {
    call("nvmlDeviceGetAttributes_v2", || {
        read(|s| {
            if !matches!(Handle::decode(device), Some(Handle::MigDevice(..))) {
                gpu_of(s, device)?;
                return Err(crate::runtime::NOT_SUPPORTED);
            }
            let (gpu, gi, ci) = ci_of(s, device)?;
            let table = model(gpu)?.profile_table();
            let gp = table.by_id(gi.profile_id).ok_or(INVALID_ARGUMENT)?;
            let cp = gp.ci(ci.profile_id).ok_or(INVALID_ARGUMENT)?;
            let v = nvmlDeviceAttributes_t {
                multiprocessorCount: cp.multiprocessors,
                sharedCopyEngineCount: gp.engines.copy_engines,
                sharedDecoderCount: gp.engines.decoders,
                sharedEncoderCount: gp.engines.encoders,
                sharedJpegCount: gp.engines.jpeg,
                sharedOfaCount: gp.engines.ofa,
                gpuInstanceSliceCount: gp.slices,
                computeInstanceSliceCount: cp.slices,
                memorySizeMB: gp.memory_mib,
            };
            unsafe { put(attributes, v) }
        })
    })
}

/// `nvmlDeviceGetAttributes` (legacy alias of `_v2`).
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetAttributes(device: nvmlDevice_t, attributes: *mut nvmlDeviceAttributes_t) -> Ret {
    unsafe { nvmlDeviceGetAttributes_v2(device, attributes) }
}
