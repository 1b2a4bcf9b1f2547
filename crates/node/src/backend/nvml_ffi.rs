//! The only `unsafe` code of the NVML backend: raw NVML calls for what nvml-wrapper 0.13 does not
//! wrap (the GPU/compute-instance lifecycle) or gets wrong (`possible_placements` always returns an
//! empty list).
//!
//! Invariants relied on by every call here:
//! - `NvmlLib` comes from a live `Nvml` (initialised, not shut down), borrowed for the call.
//! - Device handles come from `Device::handle()` of that `Nvml`; GPU/compute-instance handles come
//!   from NVML calls made just before, on the same thread, and are used before any destroy.
//! - Every out-pointer points to a local of exactly the C type NVML writes (layouts from
//!   nvml-wrapper-sys), and buffers are allocated with the length passed as `count`.
//! - A symbol missing from the library is reported as `NVML_ERROR_FUNCTION_NOT_FOUND` (13) instead
//!   of calling through nvml-wrapper-sys's panicking accessor.

use nvml_wrapper::Device;
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstanceInfo_t, nvmlComputeInstancePlacement_t, nvmlComputeInstance_t, nvmlDevice_t, nvmlEventData_t,
    nvmlEventSet_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_t, nvmlGpuInstance_t,
    NvmlLib,
};
use std::mem::MaybeUninit;

/// A failed raw call: the function and its `nvmlReturn_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawError {
    /// NVML function name.
    pub function: &'static str,
    /// Return code.
    pub code: u32,
}

/// NVML_ERROR_FUNCTION_NOT_FOUND.
const FUNCTION_NOT_FOUND: u32 = 13;
/// NVML_ERROR_INSUFFICIENT_SIZE.
const INSUFFICIENT_SIZE: u32 = 7;

/// Calls a raw NVML function by field name, checking the symbol first.
macro_rules! raw {
    ($lib:expr, $name:ident ( $($arg:expr),* $(,)? )) => {{
        match $lib.$name.as_ref() {
            // SAFETY: see the module invariants; arguments are valid for this function's contract.
            Ok(f) => match unsafe { f($($arg),*) } {
                0 => Ok(()),
                code => Err(RawError { function: stringify!($name), code }),
            },
            Err(_) => Err(RawError { function: stringify!($name), code: FUNCTION_NOT_FOUND }),
        }
    }};
}

/// The raw device handle of a wrapper `Device`.
pub fn handle(device: &Device<'_>) -> nvmlDevice_t {
    // SAFETY: the handle is only passed back to NVML while `device` (and its Nvml) is alive.
    unsafe { device.handle() }
}

/// Raw NVML calls on one loaded library.
pub struct Raw<'a> {
    lib: &'a NvmlLib,
}

impl<'a> Raw<'a> {
    /// Wraps the library of a live `Nvml`.
    pub fn new(lib: &'a NvmlLib) -> Self {
        Self { lib }
    }

    /// `nvmlErrorString`.
    pub fn error_string(&self, code: u32) -> String {
        match self.lib.nvmlErrorString.as_ref() {
            Ok(f) => {
                // SAFETY: NVML returns a static NUL-terminated string (or null).
                let p = unsafe { f(code) };
                if p.is_null() {
                    return String::new();
                }
                // SAFETY: non-null, static and NUL-terminated per NVML's contract.
                unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
            Err(_) => String::new(),
        }
    }

    /// `nvmlDeviceGetGpuInstanceProfileInfo` by enum index (v1 struct).
    pub fn gi_profile_info(&self, dev: nvmlDevice_t, index: u32) -> Result<nvmlGpuInstanceProfileInfo_t, RawError> {
        let mut info = MaybeUninit::<nvmlGpuInstanceProfileInfo_t>::zeroed();
        raw!(self.lib, nvmlDeviceGetGpuInstanceProfileInfo(dev, index, info.as_mut_ptr()))?;
        // SAFETY: zero-initialised plain-old-data, filled by NVML on success.
        Ok(unsafe { info.assume_init() })
    }

    /// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`: count query, then the list.
    pub fn possible_placements(&self, dev: nvmlDevice_t, profile_id: u32) -> Result<Vec<(u32, u32)>, RawError> {
        let mut count = 0u32;
        raw!(
            self.lib,
            nvmlDeviceGetGpuInstancePossiblePlacements_v2(dev, profile_id, std::ptr::null_mut(), &mut count)
        )?;
        let mut buf = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
        raw!(self.lib, nvmlDeviceGetGpuInstancePossiblePlacements_v2(dev, profile_id, buf.as_mut_ptr(), &mut count))?;
        buf.truncate(count as usize);
        Ok(buf.into_iter().map(|p| (p.start, p.size)).collect())
    }

    /// `nvmlDeviceGetGpuInstances` for one profile (buffer of `capacity` handles).
    pub fn gpu_instances(
        &self,
        dev: nvmlDevice_t,
        profile_id: u32,
        capacity: u32,
    ) -> Result<Vec<nvmlGpuInstance_t>, RawError> {
        let mut count = capacity.max(1);
        let mut buf = vec![std::ptr::null_mut(); count as usize];
        match raw!(self.lib, nvmlDeviceGetGpuInstances(dev, profile_id, buf.as_mut_ptr(), &mut count)) {
            Err(e) if e.code == INSUFFICIENT_SIZE => {
                buf = vec![std::ptr::null_mut(); count as usize];
                raw!(self.lib, nvmlDeviceGetGpuInstances(dev, profile_id, buf.as_mut_ptr(), &mut count))?;
            }
            other => other?,
        }
        buf.truncate(count as usize);
        Ok(buf)
    }

    /// `nvmlGpuInstanceGetInfo`: (id, profile id, placement start, size).
    pub fn gi_info(&self, gi: nvmlGpuInstance_t) -> Result<(u32, u32, u32, u32), RawError> {
        let mut info = MaybeUninit::<nvmlGpuInstanceInfo_t>::zeroed();
        raw!(self.lib, nvmlGpuInstanceGetInfo(gi, info.as_mut_ptr()))?;
        // SAFETY: zero-initialised plain-old-data, filled by NVML on success.
        let i = unsafe { info.assume_init() };
        Ok((i.id, i.profileId, i.placement.start, i.placement.size))
    }

    /// `nvmlDeviceGetGpuInstanceById`.
    pub fn gi_by_id(&self, dev: nvmlDevice_t, id: u32) -> Result<nvmlGpuInstance_t, RawError> {
        let mut gi = std::ptr::null_mut();
        raw!(self.lib, nvmlDeviceGetGpuInstanceById(dev, id, &mut gi))?;
        Ok(gi)
    }

    /// `nvmlDeviceCreateGpuInstanceWithPlacement`; returns the new GI's id.
    pub fn create_gi(&self, dev: nvmlDevice_t, profile_id: u32, start: u32, size: u32) -> Result<u32, RawError> {
        let placement = nvmlGpuInstancePlacement_t { start, size };
        let mut gi = std::ptr::null_mut();
        raw!(self.lib, nvmlDeviceCreateGpuInstanceWithPlacement(dev, profile_id, &placement, &mut gi))?;
        Ok(self.gi_info(gi)?.0)
    }

    /// `nvmlGpuInstanceDestroy`.
    pub fn destroy_gi(&self, gi: nvmlGpuInstance_t) -> Result<(), RawError> {
        raw!(self.lib, nvmlGpuInstanceDestroy(gi))
    }

    /// `nvmlGpuInstanceGetComputeInstances` for one CI profile.
    pub fn compute_instances(
        &self,
        gi: nvmlGpuInstance_t,
        profile_id: u32,
        capacity: u32,
    ) -> Result<Vec<nvmlComputeInstance_t>, RawError> {
        let mut count = capacity.max(1);
        let mut buf = vec![std::ptr::null_mut(); count as usize];
        raw!(self.lib, nvmlGpuInstanceGetComputeInstances(gi, profile_id, buf.as_mut_ptr(), &mut count))?;
        buf.truncate(count as usize);
        Ok(buf)
    }

    /// `nvmlComputeInstanceGetInfo_v2`: (id, profile id, placement start, size).
    pub fn ci_info(&self, ci: nvmlComputeInstance_t) -> Result<(u32, u32, u32, u32), RawError> {
        let mut info = MaybeUninit::<nvmlComputeInstanceInfo_t>::zeroed();
        raw!(self.lib, nvmlComputeInstanceGetInfo_v2(ci, info.as_mut_ptr()))?;
        // SAFETY: zero-initialised plain-old-data, filled by NVML on success.
        let i = unsafe { info.assume_init() };
        Ok((i.id, i.profileId, i.placement.start, i.placement.size))
    }

    /// `nvmlGpuInstanceGetComputeInstanceById`.
    pub fn ci_by_id(&self, gi: nvmlGpuInstance_t, id: u32) -> Result<nvmlComputeInstance_t, RawError> {
        let mut ci = std::ptr::null_mut();
        raw!(self.lib, nvmlGpuInstanceGetComputeInstanceById(gi, id, &mut ci))?;
        Ok(ci)
    }

    /// `nvmlGpuInstanceCreateComputeInstanceWithPlacement`; returns the new CI's id.
    pub fn create_ci(&self, gi: nvmlGpuInstance_t, profile_id: u32, start: u32, size: u32) -> Result<u32, RawError> {
        let placement = nvmlComputeInstancePlacement_t { start, size };
        let mut ci = std::ptr::null_mut();
        raw!(self.lib, nvmlGpuInstanceCreateComputeInstanceWithPlacement(gi, profile_id, &placement, &mut ci))?;
        Ok(self.ci_info(ci)?.0)
    }

    /// `nvmlComputeInstanceDestroy`.
    pub fn destroy_ci(&self, ci: nvmlComputeInstance_t) -> Result<(), RawError> {
        raw!(self.lib, nvmlComputeInstanceDestroy(ci))
    }

    /// `nvmlDeviceGetGpuInstanceId` and `nvmlDeviceGetComputeInstanceId` of a MIG device handle.
    pub fn mig_ids(&self, mig: nvmlDevice_t) -> Result<(u32, u32), RawError> {
        let (mut gi, mut ci) = (0u32, 0u32);
        raw!(self.lib, nvmlDeviceGetGpuInstanceId(mig, &mut gi))?;
        raw!(self.lib, nvmlDeviceGetComputeInstanceId(mig, &mut ci))?;
        Ok((gi, ci))
    }

    /// `nvmlEventSetCreate`: a new event set (freed with [`Raw::event_set_free`]).
    pub fn event_set_create(&self) -> Result<nvmlEventSet_t, RawError> {
        let mut set: nvmlEventSet_t = std::ptr::null_mut();
        raw!(self.lib, nvmlEventSetCreate(&mut set))?;
        Ok(set)
    }

    /// `nvmlEventSetFree`.
    pub fn event_set_free(&self, set: nvmlEventSet_t) -> Result<(), RawError> {
        raw!(self.lib, nvmlEventSetFree(set))
    }

    /// The event types of `wanted` the GPU supports, registered on `set`.
    pub fn register_events(&self, dev: nvmlDevice_t, wanted: u64, set: nvmlEventSet_t) -> Result<u64, RawError> {
        let mut supported = 0u64;
        raw!(self.lib, nvmlDeviceGetSupportedEventTypes(dev, &mut supported))?;
        let types = supported & wanted;
        if types != 0 {
            raw!(self.lib, nvmlDeviceRegisterEvents(dev, types, set))?;
        }
        Ok(types)
    }

    /// `nvmlEventSetWait_v2`: the next event within `timeout_ms` (code 10 on timeout), with the
    /// NVML index of its GPU.
    pub fn event_wait(&self, set: nvmlEventSet_t, timeout_ms: u32) -> Result<(nvmlEventData_t, u32), RawError> {
        let mut data = MaybeUninit::<nvmlEventData_t>::zeroed();
        raw!(self.lib, nvmlEventSetWait_v2(set, data.as_mut_ptr(), timeout_ms))?;
        // SAFETY: zeroed is a valid nvmlEventData_t (plain integers and a pointer), and NVML wrote it.
        let data = unsafe { data.assume_init() };
        let mut index = 0u32;
        raw!(self.lib, nvmlDeviceGetIndex(data.device, &mut index))?;
        Ok((data, index))
    }
}
