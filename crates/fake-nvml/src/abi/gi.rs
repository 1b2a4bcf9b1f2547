//! MIG mode and GPU-instance calls.

use super::device::model;
use super::{call, fill_name, found, gi_of, gpu_of, put, put_list};
use crate::handle::Handle;
use crate::runtime::{read, write, Ret, INVALID_ARGUMENT, NOT_SUPPORTED, SUCCESS, VERSION_MISMATCH};
use gpupart_mig::capacity::Occupancy;
use gpupart_mig::sim::ops::Activation;
use gpupart_mig::sim::{SimGpu, SimState};
use gpupart_mig::{GiProfile, Placement, ProfileTable};
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_t,
    nvmlGpuInstanceProfileInfo_v2_t, nvmlGpuInstanceProfileInfo_v3_t, nvmlGpuInstance_t,
};
use std::os::raw::c_uint;

/// `NVML_GPU_INSTANCE_PROFILE_COUNT` in the NVML 13 header.
pub const GI_PROFILE_COUNT: c_uint = 0x12;
/// `nvmlGpuInstanceProfileInfo_v2` version word.
pub const GI_PROFILE_INFO_V2: c_uint = 0x0200_0098;
/// `nvmlGpuInstanceProfileInfo_v3` version word.
pub const GI_PROFILE_INFO_V3: c_uint = 0x0300_0098;

/// The profile table of a MIG-capable GPU (`NOT_SUPPORTED` otherwise).
pub(crate) fn mig_table(gpu: &SimGpu) -> Result<ProfileTable, Ret> {
    let m = model(gpu)?;
    if !m.mig_capable() {
        return Err(NOT_SUPPORTED);
    }
    Ok(m.profile_table())
}

/// Like [`mig_table`], but also requires MIG mode to be enabled.
pub(crate) fn enabled_table(gpu: &SimGpu) -> Result<ProfileTable, Ret> {
    let t = mig_table(gpu)?;
    if !gpu.mig_mode.current {
        return Err(NOT_SUPPORTED);
    }
    Ok(t)
}

/// `nvmlDeviceGetMigMode`.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(device: nvmlDevice_t, current: *mut c_uint, pending: *mut c_uint) -> Ret {
    call("nvmlDeviceGetMigMode", || {
        read(|s| {
            let gpu = gpu_of(s, device)?;
            mig_table(gpu)?;
            unsafe {
                put(current, c_uint::from(gpu.mig_mode.current))?;
                put(pending, c_uint::from(gpu.mig_mode.pending))
            }
        })
    })
}

/// `nvmlDeviceSetMigMode`: activation failures go to `activationStatus` (IN_USE when busy);
/// on Ampere the mode stays pending until a GPU reset.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetMigMode(device: nvmlDevice_t, mode: c_uint, status: *mut Ret) -> Ret {
    call("nvmlDeviceSetMigMode", || {
        if mode > 1 || status.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let index = read(|s| {
            let gpu = gpu_of(s, device)?;
            mig_table(gpu)?;
            Ok(gpu.index)
        })?;
        let activation = write(|s| s.set_mig_mode(index, mode == 1))?;
        let code = match activation {
            Activation::Done | Activation::PendingReset => SUCCESS,
            Activation::InUse => 19,
            Activation::RebootRequired => 16,
        };
        unsafe { put(status, code) }
    })
}

fn by_index(table: &ProfileTable, profile: c_uint) -> Result<&GiProfile, Ret> {
    if profile >= GI_PROFILE_COUNT {
        return Err(INVALID_ARGUMENT);
    }
    table.profiles.iter().find(|p| p.index == profile).ok_or(NOT_SUPPORTED)
}

fn by_id(table: &ProfileTable, id: c_uint) -> Result<&GiProfile, Ret> {
    table.by_id(id).ok_or(INVALID_ARGUMENT)
}

fn v1(p: &GiProfile) -> nvmlGpuInstanceProfileInfo_t {
    nvmlGpuInstanceProfileInfo_t {
        id: p.id,
        isP2pSupported: 0,
        sliceCount: p.slices,
        instanceCount: p.instance_count,
        multiprocessorCount: p.multiprocessors,
        copyEngineCount: p.engines.copy_engines,
        decoderCount: p.engines.decoders,
        encoderCount: p.engines.encoders,
        jpegCount: p.engines.jpeg,
        ofaCount: p.engines.ofa,
        memorySizeMB: p.memory_mib,
    }
}

/// Fills a v2 or v3 profile-info struct according to its `version` word.
///
/// # Safety
/// `info` is null or valid for reads and writes of the larger of the two structs (both are 152 bytes).
unsafe fn put_versioned(info: *mut nvmlGpuInstanceProfileInfo_v2_t, p: &GiProfile) -> Result<(), Ret> {
    if info.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null and valid per the contract; both versions start with the version word.
    let version = unsafe { (*info).version };
    let name = format!("MIG {}", p.name);
    let b = v1(p);
    match version {
        GI_PROFILE_INFO_V2 => {
            let mut v = nvmlGpuInstanceProfileInfo_v2_t {
                version,
                id: b.id,
                isP2pSupported: 0,
                sliceCount: b.sliceCount,
                instanceCount: b.instanceCount,
                multiprocessorCount: b.multiprocessorCount,
                copyEngineCount: b.copyEngineCount,
                decoderCount: b.decoderCount,
                encoderCount: b.encoderCount,
                jpegCount: b.jpegCount,
                ofaCount: b.ofaCount,
                memorySizeMB: b.memorySizeMB,
                name: [0; 96],
            };
            fill_name(&mut v.name, &name);
            unsafe { put(info, v) }
        }
        GI_PROFILE_INFO_V3 => {
            let mut v = nvmlGpuInstanceProfileInfo_v3_t {
                version,
                id: b.id,
                sliceCount: b.sliceCount,
                instanceCount: b.instanceCount,
                multiprocessorCount: b.multiprocessorCount,
                copyEngineCount: b.copyEngineCount,
                decoderCount: b.decoderCount,
                encoderCount: b.encoderCount,
                jpegCount: b.jpegCount,
                ofaCount: b.ofaCount,
                memorySizeMB: b.memorySizeMB,
                name: [0; 96],
                capabilities: 0,
            };
            fill_name(&mut v.name, &name);
            unsafe { put(info.cast::<nvmlGpuInstanceProfileInfo_v3_t>(), v) }
        }
        _ => Err(VERSION_MISMATCH),
    }
}

/// `nvmlDeviceGetGpuInstanceProfileInfo`: `profile` is the enum index; `info.id` is the
/// device-unique profile id.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> Ret {
    call("nvmlDeviceGetGpuInstanceProfileInfo", || {
        read(|s| {
            let t = mig_table(gpu_of(s, device)?)?;
            unsafe { put(info, v1(by_index(&t, profile)?)) }
        })
    })
}

/// `nvmlDeviceGetGpuInstanceProfileInfoV` (v2 or v3 struct by its version word).
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> Ret {
    call("nvmlDeviceGetGpuInstanceProfileInfoV", || {
        read(|s| {
            let t = mig_table(gpu_of(s, device)?)?;
            unsafe { put_versioned(info, by_index(&t, profile)?) }
        })
    })
}

/// `nvmlDeviceGetGpuInstanceProfileInfoByIdV`: looks the profile up by its unique id.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoByIdV(
    device: nvmlDevice_t,
    profile_id: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> Ret {
    call("nvmlDeviceGetGpuInstanceProfileInfoByIdV", || {
        read(|s| {
            let t = mig_table(gpu_of(s, device)?)?;
            unsafe { put_versioned(info, by_id(&t, profile_id)?) }
        })
    })
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`: every legal placement, MIG on or off; a null
/// buffer returns SUCCESS with the count.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> Ret {
    call("nvmlDeviceGetGpuInstancePossiblePlacements_v2", || {
        read(|s| {
            let t = mig_table(gpu_of(s, device)?)?;
            let p = by_id(&t, profile_id)?;
            let list: Vec<_> =
                p.placements.iter().map(|pl| nvmlGpuInstancePlacement_t { start: pl.start, size: pl.size }).collect();
            unsafe { put_list(placements, count, &list) }
        })
    })
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements` (legacy alias of `_v2`).
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> Ret {
    unsafe { nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, profile_id, placements, count) }
}

fn occupancy(gpu: &SimGpu, t: &ProfileTable) -> Occupancy {
    Occupancy::of(t, gpu.gpu_instances.iter().map(|g| (g.profile_id, g.placement)))
}

/// `nvmlDeviceGetGpuInstanceRemainingCapacity`.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceRemainingCapacity(
    device: nvmlDevice_t,
    profile_id: c_uint,
    count: *mut c_uint,
) -> Ret {
    call("nvmlDeviceGetGpuInstanceRemainingCapacity", || {
        read(|s| {
            let gpu = gpu_of(s, device)?;
            let t = enabled_table(gpu)?;
            let p = by_id(&t, profile_id)?;
            unsafe { put(count, occupancy(gpu, &t).remaining_capacity(&t, p)) }
        })
    })
}

fn create(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placement: Option<Placement>,
    out: *mut nvmlGpuInstance_t,
) -> Result<(), Ret> {
    if out.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    let index = read(|s| Ok(gpu_of(s, device)?.index))?;
    let gi = write(|s: &mut SimState| s.create_gpu_instance(index, profile_id, placement))?;
    unsafe { put(out, Handle::GpuInstance(index, gi).encode()) }
}

/// `nvmlDeviceCreateGpuInstance`: the simulator picks the placement.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstance(
    device: nvmlDevice_t,
    profile_id: c_uint,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> Ret {
    call("nvmlDeviceCreateGpuInstance", || create(device, profile_id, None, gpu_instance))
}

/// `nvmlDeviceCreateGpuInstanceWithPlacement`: INVALID_ARGUMENT for an illegal placement,
/// INSUFFICIENT_RESOURCES for an occupied one.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placement: *const nvmlGpuInstancePlacement_t,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> Ret {
    call("nvmlDeviceCreateGpuInstanceWithPlacement", || {
        if placement.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: non-null and valid for reads per the contract.
        let p = unsafe { placement.read() };
        create(device, profile_id, Some(Placement::new(p.start, p.size)), gpu_instance)
    })
}

/// `nvmlGpuInstanceDestroy`: IN_USE while compute instances or processes remain.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceDestroy(gpu_instance: nvmlGpuInstance_t) -> Ret {
    call("nvmlGpuInstanceDestroy", || {
        let (g, gi) = read(|s| gi_of(s, gpu_instance).map(|(g, gi)| (g.index, gi.id)))?;
        write(|s| s.destroy_gpu_instance(g, gi))
    })
}

/// `nvmlDeviceGetGpuInstances`: the GIs of one profile.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: nvmlDevice_t,
    profile_id: c_uint,
    gpu_instances: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> Ret {
    call("nvmlDeviceGetGpuInstances", || {
        read(|s| {
            let gpu = gpu_of(s, device)?;
            let t = enabled_table(gpu)?;
            by_id(&t, profile_id)?;
            if gpu_instances.is_null() {
                return Err(INVALID_ARGUMENT);
            }
            let list: Vec<nvmlGpuInstance_t> = gpu
                .gpu_instances
                .iter()
                .filter(|g| g.profile_id == profile_id)
                .map(|g| Handle::GpuInstance(gpu.index, g.id).encode())
                .collect();
            unsafe { put_list(gpu_instances, count, &list) }
        })
    })
}

/// `nvmlDeviceGetGpuInstanceById`: NOT_FOUND when no GI has that id.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    id: c_uint,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> Ret {
    call("nvmlDeviceGetGpuInstanceById", || {
        read(|s| {
            let gpu = gpu_of(s, device)?;
            enabled_table(gpu)?;
            let gi = found(gpu.gi(id))?;
            unsafe { put(gpu_instance, Handle::GpuInstance(gpu.index, gi.id).encode()) }
        })
    })
}

/// `nvmlGpuInstanceGetInfo`: parent device, id, profile id and placement.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gpu_instance: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> Ret {
    call("nvmlGpuInstanceGetInfo", || {
        read(|s| {
            let (gpu, gi) = gi_of(s, gpu_instance)?;
            let v = nvmlGpuInstanceInfo_t {
                device: Handle::Device(gpu.index).encode(),
                id: gi.id,
                profileId: gi.profile_id,
                placement: nvmlGpuInstancePlacement_t { start: gi.placement.start, size: gi.placement.size },
            };
            unsafe { put(info, v) }
        })
    })
}
