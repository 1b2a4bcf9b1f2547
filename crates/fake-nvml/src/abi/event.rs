//! NVML's event API on the simulated node: event sets, registration, and waiting for the events
//! injected into the state (`events`, docs/sim-state.md), as NVIDIA's device plugin uses them
//! through go-nvml. A set returns, in injection order, the events injected after it was created
//! for the GPUs and types registered on it; `nvmlEventData_t` carries the GPU's handle, the type
//! bit, the XID number and the GPU and compute instance ids (`0xFFFFFFFF` when the event is about
//! the whole GPU). Waiting polls the state file without holding the library's lock, so other
//! calls go on meanwhile.

use super::{call, gpu_of, put};
use crate::handle::Handle;
use crate::runtime::{self, Ret, INVALID_ARGUMENT, NOT_SUPPORTED};
use gpupart_mig::sim::state::{EVENT_DOUBLE_BIT_ECC, EVENT_SINGLE_BIT_ECC, EVENT_XID};
use std::os::raw::{c_uint, c_ulonglong};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// NVML_ERROR_TIMEOUT.
const TIMEOUT: Ret = 10;
/// The event types the fake serves.
pub const SUPPORTED: u64 = EVENT_XID | EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC;
/// "No instance" in `nvmlEventData_t`.
const NO_INSTANCE: c_uint = 0xFFFF_FFFF;

/// `nvmlEventData_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlEventData {
    /// The physical GPU's handle.
    pub device: *mut std::ffi::c_void,
    /// The event type bit.
    pub event_type: c_ulonglong,
    /// The XID number of an XID event.
    pub event_data: c_ulonglong,
    /// The GPU instance id, or `0xFFFFFFFF`.
    pub gpu_instance_id: c_uint,
    /// The compute instance id, or `0xFFFFFFFF`.
    pub compute_instance_id: c_uint,
}

/// One event set: the GPUs and types registered, and the last event it returned.
#[derive(Debug, Clone, Default)]
struct Set {
    registered: Vec<(u32, u64)>,
    after: u64,
    freed: bool,
}

static SETS: Mutex<Vec<Set>> = Mutex::new(Vec::new());

fn sets() -> std::sync::MutexGuard<'static, Vec<Set>> {
    SETS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The set behind a handle (index + 1 as a pointer value).
fn index_of<T>(set: *mut T) -> Result<usize, Ret> {
    let i = (set as usize).checked_sub(1).ok_or(INVALID_ARGUMENT)?;
    match sets().get(i) {
        Some(s) if !s.freed => Ok(i),
        _ => Err(INVALID_ARGUMENT),
    }
}

/// `nvmlDeviceGetSupportedEventTypes`: XID and ECC events, on a physical GPU.
///
/// # Safety
/// See the module contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: *mut std::ffi::c_void,
    event_types: *mut c_ulonglong,
) -> Ret {
    call("nvmlDeviceGetSupportedEventTypes", || {
        runtime::read(|s| gpu_of(s, device).map(|_| ()))?;
        // SAFETY: by the module contract.
        unsafe { put(event_types, SUPPORTED) }
    })
}

/// `nvmlEventSetCreate`.
///
/// # Safety
/// See the module contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut *mut std::ffi::c_void) -> Ret {
    call("nvmlEventSetCreate", || {
        let after = runtime::read(|s| Ok(s.events.last().map_or(0, |e| e.seq)))?;
        let mut all = sets();
        all.push(Set { registered: Vec::new(), after, freed: false });
        let handle = all.len() as *mut std::ffi::c_void;
        drop(all);
        // SAFETY: by the module contract.
        unsafe { put(set, handle) }
    })
}

/// `nvmlDeviceRegisterEvents`: types beyond [`SUPPORTED`] are `NVML_ERROR_NOT_SUPPORTED`.
///
/// # Safety
/// See the module contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: *mut std::ffi::c_void,
    event_types: c_ulonglong,
    set: *mut std::ffi::c_void,
) -> Ret {
    call("nvmlDeviceRegisterEvents", || {
        let gpu = runtime::read(|s| gpu_of(s, device).map(|g| g.index))?;
        if event_types & !SUPPORTED != 0 {
            return Err(NOT_SUPPORTED);
        }
        let i = index_of(set)?;
        sets()[i].registered.push((gpu, event_types));
        Ok(())
    })
}

/// `nvmlEventSetWait_v2`: the next event for the set within `timeout_ms`, else
/// `NVML_ERROR_TIMEOUT`.
///
/// # Safety
/// See the module contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: *mut std::ffi::c_void,
    data: *mut NvmlEventData,
    timeout_ms: c_uint,
) -> Ret {
    call("nvmlEventSetWait_v2", || {
        if data.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let i = index_of(set)?;
        let until = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
        loop {
            let (registered, after) = {
                let all = sets();
                (all[i].registered.clone(), all[i].after)
            };
            // A registered GPU that fell off the bus ends every wait, as the driver does.
            let lost =
                runtime::read(|s| Ok(registered.iter().any(|(g, _)| s.gpus.get(*g as usize).is_some_and(|x| x.lost))))?;
            if lost {
                return Err(super::GPU_IS_LOST);
            }
            let next = runtime::read(|s| {
                Ok(s.events
                    .iter()
                    .find(|e| e.seq > after && registered.iter().any(|(g, m)| *g == e.gpu && m & e.event_type != 0))
                    .cloned())
            })?;
            if let Some(e) = next {
                sets()[i].after = e.seq;
                let d = NvmlEventData {
                    device: Handle::Device(e.gpu).encode(),
                    event_type: e.event_type,
                    event_data: e.data,
                    gpu_instance_id: e.gpu_instance_id.unwrap_or(NO_INSTANCE),
                    compute_instance_id: e.compute_instance_id.unwrap_or(NO_INSTANCE),
                };
                // SAFETY: non-null (checked) and valid for a write by the module contract.
                return unsafe { put(data, d) };
            }
            if Instant::now() >= until {
                return Err(TIMEOUT);
            }
            std::thread::sleep(Duration::from_millis(5).min(until.saturating_duration_since(Instant::now())));
        }
    })
}

/// `nvmlEventSetWait`: as [`nvmlEventSetWait_v2`].
///
/// # Safety
/// See the module contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait(
    set: *mut std::ffi::c_void,
    data: *mut NvmlEventData,
    timeout_ms: c_uint,
) -> Ret {
    // SAFETY: the same contract.
    unsafe { nvmlEventSetWait_v2(set, data, timeout_ms) }
}

/// `nvmlEventSetFree`.
#[no_mangle]
pub extern "C" fn nvmlEventSetFree(set: *mut std::ffi::c_void) -> Ret {
    call("nvmlEventSetFree", || {
        let i = index_of(set)?;
        sets()[i].freed = true;
        Ok(())
    })
}
