//! Label and annotation keys: NVIDIA's where users and the GPU Operator expect them, the rest
//! under `gpupart.io/`.

/// Default label holding the layout name.
pub const LAYOUT_LABEL: &str = "nvidia.com/mig.config";
/// Label the agent sets: pending | rebooting | success | failed.
pub const STATE_LABEL: &str = "nvidia.com/mig.config.state";
/// Annotation with the reason of the current state.
pub const STATE_REASON: &str = "gpupart.io/state-reason";
/// Annotation with the layout the state refers to.
pub const STATE_LAYOUT: &str = "gpupart.io/state-layout";
/// Label set to `"true"` while the agent drives simulated GPUs (never on a real node).
pub const SIMULATED: &str = "gpupart.io/simulated";
/// Annotation a user sets to let the next change destroy busy instances; removed after use.
pub const FORCE: &str = "gpupart.io/force-reconfigure";
/// Annotation an operator sets to bring unhealthy GPUs back (`1,3` or `all`); the agent removes
/// it once read.
pub const RECOVER_GPUS: &str = "gpupart.io/recover-gpus";
/// Label an operator sets to `"true"` on the nodes that run `gpupart agent --dra`.
pub const DRA_LABEL: &str = "gpupart.io/dra";
/// Annotation (after the summary prefix, `gpupart.io/` by default) in which `gpupart agent --dra`
/// names its driver: devices are made per claim on that node, never by layout.
pub const DRA_DRIVER_SUFFIX: &str = "dra-driver";
/// [`DRA_DRIVER_SUFFIX`] under the default prefix, as the controller reads it.
pub const DRA_DRIVER: &str = "gpupart.io/dra-driver";
/// Field manager of every agent write.
pub const FIELD_MANAGER: &str = "gpupart";
/// Annotation listing the GPU-client labels this agent paused (so a restarted agent restores them).
pub const PAUSED_CLIENTS: &str = "gpupart.io/paused-clients";
