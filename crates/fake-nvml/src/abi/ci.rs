//! Compute-instance calls.

use super::gi::enabled_table;
use super::{call, ci_of, fill_name, found, gi_of, put, put_list};
use crate::handle::Handle;
use crate::runtime::{read, write, Ret, INVALID_ARGUMENT, NOT_SUPPORTED, VERSION_MISMATCH};
use gpupart_mig::sim::{SimGi, SimGpu};
use gpupart_mig::{CiProfile, GiProfile, Placement};
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstanceInfo_t, nvmlComputeInstancePlacement_t, nvmlComputeInstanceProfileInfo_t,
    nvmlComputeInstanceProfileInfo_v2_t, nvmlComputeInstanceProfileInfo_v3_t, nvmlComputeInstance_t, nvmlGpuInstance_t,
};
use std::os::raw::c_uint;

/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT`.
pub const CI_PROFILE_COUNT: c_uint = 0x9;
/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT`.
pub const CI_ENGINE_PROFILE_COUNT: c_uint = 0x1;
/// `nvmlComputeInstanceProfileInfo_v2` version word.
pub const CI_PROFILE_INFO_V2: c_uint = 0x0200_0088;
/// `nvmlComputeInstanceProfileInfo_v3` version word.
pub const CI_PROFILE_INFO_V3: c_uint = 0x0300_008C;

/// The GI's profile and, when `id` names one, its CI profile.
fn profiles(gpu: &SimGpu, gi: &SimGi) -> Result<GiProfile, Ret> {
    let t = enabled_table(gpu)?;
    t.by_id(gi.profile_id).cloned().ok_or(INVALID_ARGUMENT)
}

fn ci_profile(gp: &GiProfile, profile: c_uint) -> Result<CiProfile, Ret> {
    if profile >= CI_PROFILE_COUNT {
        return Err(INVALID_ARGUMENT);
    }
    gp.ci(profile).cloned().ok_or(NOT_SUPPORTED)
}

fn v1(c: &CiProfile, gp: &GiProfile) -> nvmlComputeInstanceProfileInfo_t {
    let e = gp.engines;
    nvmlComputeInstanceProfileInfo_t {
        id: c.id,
        sliceCount: c.slices,
        instanceCount: c.instance_count,
        multiprocessorCount: c.multiprocessors,
        sharedCopyEngineCount: e.copy_engines,
        sharedDecoderCount: e.decoders,
        sharedEncoderCount: e.encoders,
        sharedJpegCount: e.jpeg,
        sharedOfaCount: e.ofa,
    }
}

/// `nvmlGpuInstanceGetComputeInstanceProfileInfo` (v1 struct).
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gpu_instance: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> Ret {
    call("nvmlGpuInstanceGetComputeInstanceProfileInfo", || {
        if eng_profile >= CI_ENGINE_PROFILE_COUNT {
            return Err(INVALID_ARGUMENT);
        }
        read(|s| {
            let (gpu, gi) = gi_of(s, gpu_instance)?;
            let gp = profiles(gpu, gi)?;
            unsafe { put(info, v1(&ci_profile(&gp, profile)?, &gp)) }
        })
    })
}

/// `nvmlGpuInstanceGetComputeInstanceProfileInfoV` (v2 or v3 by version word).
///
/// # Safety
/// See the module contract in `abi`; `info` is valid for the larger (v3, 140-byte) struct when
/// its version says v3.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    gpu_instance: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_v2_t,
) -> Ret {
    call("nvmlGpuInstanceGetComputeInstanceProfileInfoV", || {
        if eng_profile >= CI_ENGINE_PROFILE_COUNT || info.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: non-null and valid for reads per the contract.
        let version = unsafe { (*info).version };
        read(|s| {
            let (gpu, gi) = gi_of(s, gpu_instance)?;
            let gp = profiles(gpu, gi)?;
            let c = ci_profile(&gp, profile)?;
            let b = v1(&c, &gp);
            let name = format!("MIG {}", gp.name.with_ci(c.slices));
            let mut v2 = nvmlComputeInstanceProfileInfo_v2_t {
                version,
                id: b.id,
                sliceCount: b.sliceCount,
                instanceCount: b.instanceCount,
                multiprocessorCount: b.multiprocessorCount,
                sharedCopyEngineCount: b.sharedCopyEngineCount,
                sharedDecoderCount: b.sharedDecoderCount,
                sharedEncoderCount: b.sharedEncoderCount,
                sharedJpegCount: b.sharedJpegCount,
                sharedOfaCount: b.sharedOfaCount,
                name: [0; 96],
            };
            fill_name(&mut v2.name, &name);
            match version {
                CI_PROFILE_INFO_V2 => unsafe { put(info, v2) },
                CI_PROFILE_INFO_V3 => {
                    let v3 = nvmlComputeInstanceProfileInfo_v3_t {
                        version,
                        id: v2.id,
                        sliceCount: v2.sliceCount,
                        instanceCount: v2.instanceCount,
                        multiprocessorCount: v2.multiprocessorCount,
                        sharedCopyEngineCount: v2.sharedCopyEngineCount,
                        sharedDecoderCount: v2.sharedDecoderCount,
                        sharedEncoderCount: v2.sharedEncoderCount,
                        sharedJpegCount: v2.sharedJpegCount,
                        sharedOfaCount: v2.sharedOfaCount,
                        name: v2.name,
                        capabilities: 0,
                    };
                    unsafe { put(info.cast::<nvmlComputeInstanceProfileInfo_v3_t>(), v3) }
                }
                _ => Err(VERSION_MISMATCH),
            }
        })
    })
}

fn free_starts(gi: &SimGi, c: &CiProfile) -> Vec<u32> {
    let used = gi.compute_instances.iter().fold(0u32, |m, x| m | x.placement.mask());
    c.placements.iter().copied().filter(|s| Placement::new(*s, c.slices).mask() & used == 0).collect()
}

/// `nvmlGpuInstanceGetComputeInstanceRemainingCapacity`.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    count: *mut c_uint,
) -> Ret {
    call("nvmlGpuInstanceGetComputeInstanceRemainingCapacity", || {
        read(|s| {
            let (gpu, gi) = gi_of(s, gpu_instance)?;
            let gp = profiles(gpu, gi)?;
            let c = gp.ci(profile_id).cloned().ok_or(INVALID_ARGUMENT)?;
            let existing = gi.compute_instances.iter().filter(|x| x.profile_id == c.id).count() as u32;
            // Greedy over free starts: CI placements of one profile never overlap each other.
            let mut used = gi.compute_instances.iter().fold(0u32, |m, x| m | x.placement.mask());
            let mut n = 0;
            for &st in &c.placements {
                let m = Placement::new(st, c.slices).mask();
                if m & used == 0 && existing + n < c.instance_count {
                    used |= m;
                    n += 1;
                }
            }
            unsafe { put(count, n) }
        })
    })
}

/// `nvmlGpuInstanceGetComputeInstancePossiblePlacements`: a null buffer returns the count.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstancePossiblePlacements(
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    placements: *mut nvmlComputeInstancePlacement_t,
    count: *mut c_uint,
) -> Ret {
    call("nvmlGpuInstanceGetComputeInstancePossiblePlacements", || {
        read(|s| {
            let (gpu, gi) = gi_of(s, gpu_instance)?;
            let gp = profiles(gpu, gi)?;
            let c = gp.ci(profile_id).cloned().ok_or(INVALID_ARGUMENT)?;
            let list: Vec<_> = free_starts(gi, &c)
                .into_iter()
                .map(|start| nvmlComputeInstancePlacement_t { start, size: c.slices })
                .collect();
            unsafe { put_list(placements, count, &list) }
        })
    })
}

fn create(
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    start: Option<u32>,
    out: *mut nvmlComputeInstance_t,
) -> Result<(), Ret> {
    if out.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    let (g, gi) = read(|s| {
        let (gpu, gi) = gi_of(s, gpu_instance)?;
        profiles(gpu, gi)?.ci(profile_id).ok_or(INVALID_ARGUMENT)?;
        Ok((gpu.index, gi.id))
    })?;
    let ci = write(|s| s.create_compute_instance(g, gi, profile_id, start))?;
    unsafe { put(out, Handle::ComputeInstance(g, gi, ci).encode()) }
}

/// `nvmlGpuInstanceCreateComputeInstance`.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    compute_instance: *mut nvmlComputeInstance_t,
) -> Ret {
    call("nvmlGpuInstanceCreateComputeInstance", || create(gpu_instance, profile_id, None, compute_instance))
}

/// `nvmlGpuInstanceCreateComputeInstanceWithPlacement`.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstanceWithPlacement(
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    placement: *const nvmlComputeInstancePlacement_t,
    compute_instance: *mut nvmlComputeInstance_t,
) -> Ret {
    call("nvmlGpuInstanceCreateComputeInstanceWithPlacement", || {
        if placement.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: non-null and valid for reads per the contract.
        let p = unsafe { placement.read() };
        create(gpu_instance, profile_id, Some(p.start), compute_instance)
    })
}

/// `nvmlComputeInstanceDestroy`: IN_USE while processes run on it.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlComputeInstanceDestroy(compute_instance: nvmlComputeInstance_t) -> Ret {
    call("nvmlComputeInstanceDestroy", || {
        let (g, gi, ci) = read(|s| ci_of(s, compute_instance).map(|(g, gi, ci)| (g.index, gi.id, ci.id)))?;
        write(|s| s.destroy_compute_instance(g, gi, ci))
    })
}

/// `nvmlGpuInstanceGetComputeInstances`: the CIs of one CI profile.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    compute_instances: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> Ret {
    call("nvmlGpuInstanceGetComputeInstances", || {
        read(|s| {
            let (gpu, gi) = gi_of(s, gpu_instance)?;
            profiles(gpu, gi)?.ci(profile_id).ok_or(INVALID_ARGUMENT)?;
            if compute_instances.is_null() {
                return Err(INVALID_ARGUMENT);
            }
            let list: Vec<nvmlComputeInstance_t> = gi
                .compute_instances
                .iter()
                .filter(|c| c.profile_id == profile_id)
                .map(|c| Handle::ComputeInstance(gpu.index, gi.id, c.id).encode())
                .collect();
            unsafe { put_list(compute_instances, count, &list) }
        })
    })
}

/// `nvmlGpuInstanceGetComputeInstanceById`: NOT_FOUND when absent.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gpu_instance: nvmlGpuInstance_t,
    id: c_uint,
    compute_instance: *mut nvmlComputeInstance_t,
) -> Ret {
    call("nvmlGpuInstanceGetComputeInstanceById", || {
        read(|s| {
            let (gpu, gi) = gi_of(s, gpu_instance)?;
            let ci = found(gi.compute_instances.iter().find(|c| c.id == id))?;
            unsafe { put(compute_instance, Handle::ComputeInstance(gpu.index, gi.id, ci.id).encode()) }
        })
    })
}

/// `nvmlComputeInstanceGetInfo_v2`: parent device, GI handle, id, profile id, placement.
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    compute_instance: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> Ret {
    call("nvmlComputeInstanceGetInfo_v2", || {
        read(|s| {
            let (gpu, gi, ci) = ci_of(s, compute_instance)?;
            let v = nvmlComputeInstanceInfo_t {
                device: Handle::Device(gpu.index).encode(),
                gpuInstance: Handle::GpuInstance(gpu.index, gi.id).encode(),
                id: ci.id,
                profileId: ci.profile_id,
                placement: nvmlComputeInstancePlacement_t { start: ci.placement.start, size: ci.placement.size },
            };
            unsafe { put(info, v) }
        })
    })
}

/// `nvmlComputeInstanceGetInfo` (legacy alias of `_v2`).
///
/// # Safety
/// See the module contract in `abi`.
#[no_mangle]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo(
    compute_instance: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> Ret {
    unsafe { nvmlComputeInstanceGetInfo_v2(compute_instance, info) }
}
