//! The exported NVML functions. Every one goes through [`call`]: initialisation check, injected
//! faults (`FAKE_NVML_FAIL`), and panics turned into `NVML_ERROR_UNKNOWN` so none crosses the C
//! boundary.
//!
//! Safety contract of every `unsafe extern "C"` function here, as in NVML: pointer arguments are
//! either null (checked, `NVML_ERROR_INVALID_ARGUMENT`) or valid for writes of the documented type
//! (and, for buffers, of the documented length); handles are opaque values this library made.

mod ci;
mod device;
mod event;
mod gi;
mod inventory;
mod migdev;
mod system;
pub mod unsupported;

use crate::handle::Handle;
use crate::runtime::{self, Ret, INSUFFICIENT_SIZE, INVALID_ARGUMENT, NOT_FOUND, SUCCESS, UNKNOWN};
use gpupart_mig::sim::{SimCi, SimGi, SimGpu, SimState};
use std::os::raw::{c_char, c_uint};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs the body of exported function `function`.
pub(crate) fn call(function: &'static str, body: impl FnOnce() -> Result<(), Ret>) -> Ret {
    let r = catch_unwind(AssertUnwindSafe(|| {
        runtime::enter(function)?;
        body()
    }));
    match r {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => UNKNOWN,
    }
}

/// Writes `v` through an out-pointer.
///
/// # Safety
/// `p` is null or valid for a write of `T`.
pub(crate) unsafe fn put<T>(p: *mut T, v: T) -> Result<(), Ret> {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null and, by the caller's contract, valid for writes of T.
    unsafe { p.write(v) };
    Ok(())
}

/// Copies `s` and a terminating NUL into a caller's buffer of `len` bytes.
///
/// # Safety
/// `buf` is null or valid for writes of `len` bytes.
pub(crate) unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), Ret> {
    if buf.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    let bytes = s.as_bytes();
    if bytes.len() + 1 > len as usize {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: buf holds at least len >= bytes.len() + 1 bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
        buf.add(bytes.len()).write(0);
    }
    Ok(())
}

/// Copies `s` into a fixed `c_char` array field, truncating, NUL-terminated.
pub(crate) fn fill_name<const N: usize>(dst: &mut [c_char; N], s: &str) {
    for (d, b) in dst.iter_mut().zip(s.bytes().take(N - 1)) {
        *d = b as c_char;
    }
    dst[s.len().min(N - 1)] = 0;
}

/// Fills a caller's array: with a null buffer only the count is reported; a buffer smaller than
/// the items gives `NVML_ERROR_INSUFFICIENT_SIZE` with the needed count.
///
/// # Safety
/// `count` is null or valid; `buf` is null or valid for `*count` writes of `T`.
pub(crate) unsafe fn put_list<T: Copy>(buf: *mut T, count: *mut c_uint, items: &[T]) -> Result<(), Ret> {
    if count.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: count is non-null and valid per the contract.
    let cap = unsafe { count.read() } as usize;
    unsafe { count.write(items.len() as c_uint) };
    if buf.is_null() {
        return Ok(());
    }
    if cap < items.len() {
        return Err(INSUFFICIENT_SIZE);
    }
    for (i, item) in items.iter().enumerate() {
        // SAFETY: i < items.len() <= cap, and buf is valid for cap writes.
        unsafe { buf.add(i).write(*item) };
    }
    Ok(())
}

/// `NVML_ERROR_GPU_IS_LOST`: the GPU fell off the bus (`lost` in the state).
pub(crate) const GPU_IS_LOST: Ret = gpupart_mig::sim::NvmlCode::GpuIsLost as Ret;

/// GPU `g`, unless it is lost.
fn present(s: &SimState, g: u32) -> Result<&SimGpu, Ret> {
    let gpu = s.gpus.get(g as usize).ok_or(INVALID_ARGUMENT)?;
    if gpu.lost {
        return Err(GPU_IS_LOST);
    }
    Ok(gpu)
}

/// The GPU of a physical-device handle.
pub(crate) fn gpu_of<T>(s: &SimState, h: *mut T) -> Result<&SimGpu, Ret> {
    match Handle::decode(h) {
        Some(Handle::Device(g)) => present(s, g),
        _ => Err(INVALID_ARGUMENT),
    }
}

/// The GPU and GI of a GPU-instance handle (`INVALID_ARGUMENT` once destroyed).
pub(crate) fn gi_of<T>(s: &SimState, h: *mut T) -> Result<(&SimGpu, &SimGi), Ret> {
    match Handle::decode(h) {
        Some(Handle::GpuInstance(g, gi)) => {
            let gpu = present(s, g)?;
            Ok((gpu, gpu.gi(gi).ok_or(INVALID_ARGUMENT)?))
        }
        _ => Err(INVALID_ARGUMENT),
    }
}

/// The GPU, GI and CI of a compute-instance or MIG-device handle.
pub(crate) fn ci_of<T>(s: &SimState, h: *mut T) -> Result<(&SimGpu, &SimGi, &SimCi), Ret> {
    match Handle::decode(h) {
        Some(Handle::ComputeInstance(g, gi, ci) | Handle::MigDevice(g, gi, ci)) => {
            let gpu = present(s, g)?;
            let gi = gpu.gi(gi).ok_or(INVALID_ARGUMENT)?;
            let ci = gi.compute_instances.iter().find(|c| c.id == ci).ok_or(INVALID_ARGUMENT)?;
            Ok((gpu, gi, ci))
        }
        _ => Err(INVALID_ARGUMENT),
    }
}

/// MIG devices of a GPU in NVML index order (ascending GI id, then CI id).
pub(crate) fn mig_devices(gpu: &SimGpu) -> Vec<(u32, u32)> {
    let mut v: Vec<(u32, u32)> =
        gpu.gpu_instances.iter().flat_map(|g| g.compute_instances.iter().map(move |c| (g.id, c.id))).collect();
    v.sort_unstable();
    v
}

/// `NOT_FOUND` helper for lookups by id.
pub(crate) fn found<T>(v: Option<T>) -> Result<T, Ret> {
    v.ok_or(NOT_FOUND)
}
