//! Library lifecycle and system queries.

use super::{call, put, put_str};
use crate::runtime::{self, Ret};
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_uint};

/// Driver version the fake reports.
pub const DRIVER_VERSION: &str = gpupart_mig::sim::DRIVER_VERSION;
/// NVML version the fake reports.
pub const NVML_VERSION: &str = "13.580.65.06";
/// CUDA driver version (`major * 1000 + minor * 10`).
pub const CUDA_DRIVER_VERSION: c_int = 13000;

/// `nvmlInit_v2`.
#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> Ret {
    runtime::init()
}

/// `nvmlInit` (legacy alias of `nvmlInit_v2`).
#[no_mangle]
pub extern "C" fn nvmlInit() -> Ret {
    runtime::init()
}

/// `nvmlInitWithFlags`; flags are accepted and ignored.
#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    runtime::init()
}

/// `nvmlShutdown`.
#[no_mangle]
pub extern "C" fn nvmlShutdown() -> Ret {
    runtime::shutdown()
}

fn error_text(code: Ret) -> &'static CStr {
    match code {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt request issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        17 => c"The operating system has blocked the request.",
        18 => c"RM has detected an NVML/RM version mismatch.",
        19 => c"In use by another client",
        20 => c"Insufficient Memory",
        21 => c"No data",
        22 => c"The requested vgpu operation is not available on target device, because ECC is enabled",
        23 => c"Insufficient resources",
        24 => c"Frequency not supported",
        25 => c"Argument version mismatch",
        26 => c"Deprecated",
        27 => c"Not ready",
        28 => c"GPU not found",
        29 => c"Invalid state",
        30 => c"Reset type not supported",
        _ => c"Unknown Error",
    }
}

/// `nvmlErrorString`: a static, NUL-terminated description.
#[no_mangle]
pub extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    error_text(result).as_ptr()
}

/// `nvmlSystemGetDriverVersion`.
///
/// # Safety
/// See the module contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    call("nvmlSystemGetDriverVersion", || unsafe { put_str(version, length, DRIVER_VERSION) })
}

/// `nvmlSystemGetNVMLVersion`.
///
/// # Safety
/// See the module contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    call("nvmlSystemGetNVMLVersion", || unsafe { put_str(version, length, NVML_VERSION) })
}

/// `nvmlSystemGetCudaDriverVersion`.
///
/// # Safety
/// See the module contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> Ret {
    call("nvmlSystemGetCudaDriverVersion", || unsafe { put(v, CUDA_DRIVER_VERSION) })
}

/// `nvmlSystemGetCudaDriverVersion_v2`.
///
/// # Safety
/// See the module contract.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> Ret {
    call("nvmlSystemGetCudaDriverVersion_v2", || unsafe { put(v, CUDA_DRIVER_VERSION) })
}
