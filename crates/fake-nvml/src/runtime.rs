//! The library's global state: the simulated node, where it is stored, injected faults and the
//! per-operation delay. Queries re-read the state file when another process changed it; changes
//! take a cross-process file lock, re-read, apply, and rewrite the file atomically. The operation
//! delay is slept before any lock is taken, so calls on different GPUs overlap.

use gpupart_mig::sim::fault::Faults;
use gpupart_mig::sim::store::{self, SharedFile, UpdateError};
use gpupart_mig::sim::{parse_spec, SimError, SimState};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// `nvmlReturn_t`.
pub type Ret = u32;
/// NVML_SUCCESS.
pub const SUCCESS: Ret = 0;
/// NVML_ERROR_UNINITIALIZED.
pub const UNINITIALIZED: Ret = 1;
/// NVML_ERROR_INVALID_ARGUMENT.
pub const INVALID_ARGUMENT: Ret = 2;
/// NVML_ERROR_NOT_SUPPORTED.
pub const NOT_SUPPORTED: Ret = 3;
/// NVML_ERROR_NOT_FOUND.
pub const NOT_FOUND: Ret = 6;
/// NVML_ERROR_INSUFFICIENT_SIZE.
pub const INSUFFICIENT_SIZE: Ret = 7;
/// NVML_ERROR_ARGUMENT_VERSION_MISMATCH.
pub const VERSION_MISMATCH: Ret = 25;
/// NVML_ERROR_UNKNOWN.
pub const UNKNOWN: Ret = 999;

/// Default node when neither a state file nor `FAKE_NVML_GPUS` says otherwise.
pub const DEFAULT_GPUS: &str = "A100-SXM4-80GB:8";

/// The loaded node and its configuration.
pub struct Runtime {
    file: Option<SharedFile>,
    state: SimState,
    faults: Faults,
    op_delay: Duration,
    refcount: u32,
}

static RUNTIME: Mutex<Option<Runtime>> = Mutex::new(None);

fn lock() -> MutexGuard<'static, Option<Runtime>> {
    RUNTIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn complain(msg: &str) -> Ret {
    eprintln!("fake-nvml: {msg}");
    UNKNOWN
}

impl Runtime {
    fn from_env() -> Result<Self, Ret> {
        let faults = Faults::parse(&std::env::var("FAKE_NVML_FAIL").unwrap_or_default())
            .map_err(|e| complain(&format!("FAKE_NVML_FAIL: {e}")))?;
        let op_delay = match std::env::var("FAKE_NVML_OP_DELAY_MS") {
            Ok(v) => Duration::from_millis(
                v.trim().parse().map_err(|_| complain(&format!("FAKE_NVML_OP_DELAY_MS={v} is not a number")))?,
            ),
            Err(_) => Duration::ZERO,
        };
        let spec = std::env::var("FAKE_NVML_GPUS").unwrap_or_else(|_| DEFAULT_GPUS.to_string());
        let fresh = || -> Result<SimState, Ret> {
            let parsed = parse_spec(&spec).map_err(|e| complain(&format!("FAKE_NVML_GPUS: {e}")))?;
            Ok(SimState::new(&parsed))
        };
        let Some(path) = std::env::var_os("FAKE_NVML_STATE").map(PathBuf::from) else {
            return Ok(Self { file: None, state: fresh()?, faults, op_delay, refcount: 1 });
        };
        let mut file = SharedFile::new(&path);
        let mut state = fresh()?;
        if path.exists() {
            state = store::load(&path).map_err(|e| complain(&e.to_string()))?;
        } else {
            // Created under the lock; `update` keeps a file another process created meanwhile.
            file.update(&mut state, |_| Ok::<(), ()>(()))
                .map_err(|_| complain(&format!("cannot create {}", path.display())))?;
        }
        Ok(Self { file: Some(SharedFile::new(&path)), state, faults, op_delay, refcount: 1 })
    }
}

/// `nvmlInit*`: loads the node on the first call, counts later ones.
pub fn init() -> Ret {
    let mut g = lock();
    match g.as_mut() {
        Some(rt) => {
            rt.refcount += 1;
            SUCCESS
        }
        None => match Runtime::from_env() {
            Ok(rt) => {
                *g = Some(rt);
                SUCCESS
            }
            Err(code) => code,
        },
    }
}

/// `nvmlShutdown`: drops the node after the last matching init.
pub fn shutdown() -> Ret {
    let mut g = lock();
    match g.as_mut() {
        None => UNINITIALIZED,
        Some(rt) => {
            rt.refcount -= 1;
            if rt.refcount == 0 {
                *g = None;
            }
            SUCCESS
        }
    }
}

/// Counts a call of `function`: `UNINITIALIZED` before init, or an injected fault code.
pub fn enter(function: &str) -> Result<(), Ret> {
    let mut g = lock();
    let rt = g.as_mut().ok_or(UNINITIALIZED)?;
    match rt.faults.hit(function) {
        Some(code) => Err(code),
        None => Ok(()),
    }
}

/// Runs a query on the current state.
pub fn read<T>(f: impl FnOnce(&SimState) -> Result<T, Ret>) -> Result<T, Ret> {
    let mut g = lock();
    let rt = g.as_mut().ok_or(UNINITIALIZED)?;
    if let Some(file) = &mut rt.file {
        file.refresh(&mut rt.state).map_err(|e| complain(&e.to_string()))?;
    }
    f(&rt.state)
}

/// Runs a change: sleeps the operation delay, then under the locks re-reads, applies and saves.
pub fn write<T>(f: impl FnOnce(&mut SimState) -> Result<T, SimError>) -> Result<T, Ret> {
    let delay = lock().as_ref().ok_or(UNINITIALIZED)?.op_delay;
    if !delay.is_zero() {
        std::thread::sleep(delay);
    }
    let mut g = lock();
    let rt = g.as_mut().ok_or(UNINITIALIZED)?;
    match &mut rt.file {
        Some(file) => file.update(&mut rt.state, f).map_err(|e| match e {
            UpdateError::Change(e) => e.code as Ret,
            UpdateError::Store(e) => complain(&e.to_string()),
        }),
        None => {
            let mut next = rt.state.clone();
            let out = f(&mut next).map_err(|e| e.code as Ret)?;
            rt.state = next;
            Ok(out)
        }
    }
}

/// Applies a change to a state file directly (used by `fake-nvidia-smi`), under the same lock.
pub fn write_file<T>(path: &Path, f: impl FnOnce(&mut SimState) -> Result<T, SimError>) -> Result<T, String> {
    if !path.exists() {
        return Err(format!("{} does not exist", path.display()));
    }
    let mut state = SimState::new(&[]);
    SharedFile::new(path).update(&mut state, f).map_err(|e| match e {
        UpdateError::Change(e) => e.to_string(),
        UpdateError::Store(e) => e.to_string(),
    })
}
