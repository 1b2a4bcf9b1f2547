//! MPS on GPUs without MIG: one `nvidia-cuda-mps-control` daemon per GPU, configured per GPU
//! from the layout's `mps` block. [`settings`] resolves the block on a GPU (pure), [`control`] is
//! the effect edge (the control program), [`daemon`] one daemon's lifecycle, [`node`] the
//! decisions and execution phases for a whole node, [`process`] pid liveness.

pub mod control;
pub mod daemon;
pub mod node;
pub mod process;
pub mod settings;
pub mod shm;
pub mod supervise;

pub use control::{ControlProgram, DaemonPaths, MpsControl};
pub use node::{Action, GpuMps, Mps, MpsReport, Want};
pub use settings::MpsSettings;
