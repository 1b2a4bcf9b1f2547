//! Fault injection shared by the simulator backends: `FUNCTION:NTH:CODE[,…]` makes the NTH call
//! (1-based) of an NVML function return CODE (a number or a name like `NVML_ERROR_UNKNOWN`).

use std::collections::HashMap;

/// Every `nvmlReturn_t` name and value.
pub const CODES: &[(&str, u32)] = &[
    ("NVML_SUCCESS", 0),
    ("NVML_ERROR_UNINITIALIZED", 1),
    ("NVML_ERROR_INVALID_ARGUMENT", 2),
    ("NVML_ERROR_NOT_SUPPORTED", 3),
    ("NVML_ERROR_NO_PERMISSION", 4),
    ("NVML_ERROR_ALREADY_INITIALIZED", 5),
    ("NVML_ERROR_NOT_FOUND", 6),
    ("NVML_ERROR_INSUFFICIENT_SIZE", 7),
    ("NVML_ERROR_INSUFFICIENT_POWER", 8),
    ("NVML_ERROR_DRIVER_NOT_LOADED", 9),
    ("NVML_ERROR_TIMEOUT", 10),
    ("NVML_ERROR_IRQ_ISSUE", 11),
    ("NVML_ERROR_LIBRARY_NOT_FOUND", 12),
    ("NVML_ERROR_FUNCTION_NOT_FOUND", 13),
    ("NVML_ERROR_CORRUPTED_INFOROM", 14),
    ("NVML_ERROR_GPU_IS_LOST", 15),
    ("NVML_ERROR_RESET_REQUIRED", 16),
    ("NVML_ERROR_OPERATING_SYSTEM", 17),
    ("NVML_ERROR_LIB_RM_VERSION_MISMATCH", 18),
    ("NVML_ERROR_IN_USE", 19),
    ("NVML_ERROR_MEMORY", 20),
    ("NVML_ERROR_NO_DATA", 21),
    ("NVML_ERROR_VGPU_ECC_NOT_SUPPORTED", 22),
    ("NVML_ERROR_INSUFFICIENT_RESOURCES", 23),
    ("NVML_ERROR_FREQ_NOT_SUPPORTED", 24),
    ("NVML_ERROR_ARGUMENT_VERSION_MISMATCH", 25),
    ("NVML_ERROR_DEPRECATED", 26),
    ("NVML_ERROR_NOT_READY", 27),
    ("NVML_ERROR_GPU_NOT_FOUND", 28),
    ("NVML_ERROR_INVALID_STATE", 29),
    ("NVML_ERROR_RESET_TYPE_NOT_SUPPORTED", 30),
    ("NVML_ERROR_UNKNOWN", 999),
];

/// The name of an NVML return code (`NVML_ERROR_UNKNOWN` for values not in the header).
pub fn code_name(code: u32) -> &'static str {
    CODES.iter().find(|(_, c)| *c == code).map_or("NVML_ERROR_UNKNOWN", |(n, _)| n)
}

/// A malformed fault specification.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid fault '{0}': expected FUNCTION:NTH:CODE, e.g. nvmlDeviceCreateGpuInstanceWithPlacement:1:NVML_ERROR_UNKNOWN")]
pub struct FaultError(pub String);

/// Planned failures and per-function call counters.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    planned: Vec<(String, u64, u32)>,
    calls: HashMap<String, u64>,
}

impl Faults {
    /// Parses `FUNCTION:NTH:CODE[,…]`; an empty string plans nothing.
    pub fn parse(spec: &str) -> Result<Self, FaultError> {
        let mut planned = Vec::new();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let parts: Vec<&str> = item.split(':').collect();
            let [func, nth, code] = parts.as_slice() else {
                return Err(FaultError(item.to_string()));
            };
            let nth: u64 = nth.parse().ok().filter(|n| *n > 0).ok_or_else(|| FaultError(item.to_string()))?;
            let code = code
                .parse::<u32>()
                .ok()
                .or_else(|| CODES.iter().find(|(n, _)| n.eq_ignore_ascii_case(code)).map(|(_, c)| *c))
                .ok_or_else(|| FaultError(item.to_string()))?;
            if func.is_empty() {
                return Err(FaultError(item.to_string()));
            }
            planned.push((func.to_string(), nth, code));
        }
        Ok(Self { planned, calls: HashMap::new() })
    }

    /// Counts a call of `function`; returns the code to fail with when one is planned.
    pub fn hit(&mut self, function: &str) -> Option<u32> {
        if self.planned.is_empty() {
            return None;
        }
        let n = self.calls.entry(function.to_string()).or_insert(0);
        *n += 1;
        let n = *n;
        self.planned.iter().find(|(f, nth, _)| f == function && *nth == n).map(|(_, _, c)| *c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fails_the_nth_call_only() {
        let mut f = Faults::parse("nvmlGpuInstanceDestroy:2:NVML_ERROR_IN_USE, nvmlDeviceSetMigMode:1:999").unwrap();
        assert_eq!(f.hit("nvmlGpuInstanceDestroy"), None);
        assert_eq!(f.hit("nvmlGpuInstanceDestroy"), Some(19));
        assert_eq!(f.hit("nvmlGpuInstanceDestroy"), None);
        assert_eq!(f.hit("nvmlDeviceSetMigMode"), Some(999));
        assert!(Faults::parse("x:0:1").is_err());
        assert!(Faults::parse("x:1:NOPE").is_err());
        assert!(Faults::parse("x:1").is_err());
        assert_eq!(code_name(23), "NVML_ERROR_INSUFFICIENT_RESOURCES");
    }
}
