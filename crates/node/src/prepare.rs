//! Desired vs. observed for a whole node: selects the config entry of each GPU, resolves its
//! profile names and plans it. Pure; every problem on every GPU is collected before anything is
//! touched, so a bad config never leaves a node half-changed.

use crate::config::{select, GpuIdent, MigConfig, Selection};
use crate::layout::DesiredDevices;
use crate::observed::GpuState;
use crate::plan::{plan_for_mix, Plan, PlanError};
use std::fmt;

/// What a config asks of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Leave the GPU alone (not selected, or `mig-enabled: true` on a GPU without MIG).
    Leave {
        /// Why.
        reason: String,
    },
    /// MIG disabled, with an MPS daemon when the entry has an `mps` block.
    MigDisabled {
        /// The MPS settings resolved on this GPU.
        mps: Option<crate::mps::MpsSettings>,
    },
    /// MIG enabled with these devices.
    MigEnabled {
        /// The wanted devices.
        devices: DesiredDevices,
    },
}

/// The work for one GPU.
#[derive(Debug, Clone)]
pub struct Job {
    /// The GPU as observed when planning.
    pub state: GpuState,
    /// What the config wants.
    pub target: Target,
    /// The MIG mode to set first (enable) or last (disable), when it must change.
    pub mode_change: Option<bool>,
    /// Instances to keep, destroy and create (`None` when instances are not touched).
    pub plan: Option<Plan>,
}

impl Job {
    /// Whether nothing needs doing.
    pub fn is_noop(&self) -> bool {
        self.mode_change.is_none() && self.plan.as_ref().is_none_or(Plan::is_noop)
    }
}

/// Everything wrong with applying a config to a node, one line per problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct PrepareError {
    /// The problems.
    pub problems: Vec<String>,
    /// Whether the only problems are busy instances (so `--force` would help).
    pub blocked: bool,
    /// Whether the one problem is that the config selects none of the node's GPUs (mig-parted
    /// then succeeds doing nothing).
    pub selects_nothing: bool,
}

impl fmt::Display for PrepareError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.problems.join("\n"))
    }
}

/// The selection identity of an observed GPU.
pub fn ident(s: &GpuState) -> GpuIdent {
    GpuIdent {
        index: s.info.index,
        device_id: s.info.pci_device_id,
        subsystem_id: s.info.pci_subsystem_id,
        mig_capable: s.info.mig_capable,
        model: s.info.model.clone(),
    }
}

/// Resolves what `config` wants of each GPU (names resolved on each GPU's own profile table).
pub fn targets(states: &[GpuState], config: &MigConfig) -> Result<Vec<Target>, PrepareError> {
    let resolved = resolve(states, config)?;
    if resolved.problems.is_empty() {
        Ok(resolved.targets)
    } else {
        Err(PrepareError { problems: resolved.problems, blocked: false, selects_nothing: resolved.selects_nothing })
    }
}

/// What `config` wants of each GPU's MIG mode, and nothing else (`--mode-only`): the GPUs it
/// selects with MIG on or off. What it asks of their devices or MPS daemons is not judged: a
/// GPU whose entry names devices it cannot hold, or a config that selects none of the GPUs,
/// passes, and the second value says what was let pass. A config that cannot be read against
/// the node at all (a device index the node lacks) is still an error.
pub fn mode_targets(states: &[GpuState], config: &MigConfig) -> Result<(Vec<Target>, Vec<String>), PrepareError> {
    let resolved = resolve(states, config)?;
    Ok((resolved.targets, resolved.problems))
}

/// Every GPU's target, and the problems found resolving them: a GPU with a problem gets its
/// entry's MIG mode with nothing else (no devices, no MPS daemon).
struct Resolved {
    targets: Vec<Target>,
    problems: Vec<String>,
    selects_nothing: bool,
}

fn resolve(states: &[GpuState], config: &MigConfig) -> Result<Resolved, PrepareError> {
    let idents: Vec<GpuIdent> = states.iter().map(ident).collect();
    let selections = select(config, &idents).map_err(|e| PrepareError {
        problems: vec![e.to_string()],
        blocked: false,
        selects_nothing: false,
    })?;
    if let Some(reason) = crate::config::no_mig_reason(config, &idents, &selections) {
        let targets =
            states.iter().map(|s| Target::Leave { reason: format!("{} does not support MIG", s.info.model) }).collect();
        return Ok(Resolved { targets, problems: vec![reason], selects_nothing: true });
    }
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for (s, sel) in states.iter().zip(selections) {
        out.push(match sel {
            Selection::Unselected => Target::Leave { reason: format!("not selected by config '{}'", config.name) },
            Selection::SkippedNoMig { .. } => {
                Target::Leave { reason: format!("{} does not support MIG", s.info.model) }
            }
            Selection::Disabled { entry, mps } => match mps.map(|m| crate::mps::settings::resolve(&m, &s.info)) {
                None => Target::MigDisabled { mps: None },
                Some(Ok(settings)) => Target::MigDisabled { mps: Some(settings) },
                Some(Err(e)) => {
                    problems.push(format!(
                        "GPU {} ({}): config '{}', entry {entry}, {e}",
                        s.info.index, s.info.model, config.name
                    ));
                    Target::MigDisabled { mps: None }
                }
            },
            Selection::Enabled { entry, devices } => match DesiredDevices::resolve(&s.profiles, &devices) {
                Ok(devices) => Target::MigEnabled { devices },
                Err(e) => {
                    problems.push(format!(
                        "GPU {} ({}): config '{}', entry {entry}, key 'mig-devices': {e}",
                        s.info.index, s.info.model, config.name
                    ));
                    Target::MigEnabled { devices: DesiredDevices::default() }
                }
            },
        });
    }
    let selects_nothing =
        !out.is_empty() && problems.is_empty() && out.iter().all(|t| matches!(t, Target::Leave { .. }));
    if selects_nothing {
        let models: Vec<&str> = states.iter().map(|s| s.info.model.as_str()).collect();
        problems.push(format!(
            "config '{}' has no entry for this node's GPUs ({}): it would change nothing",
            config.name,
            models.join(", ")
        ));
    }
    Ok(Resolved { targets: out, problems, selects_nothing })
}

/// The config's workload mix as this GPU's GPU-instance profile ids (names it lacks drop out).
fn mix(state: &GpuState, config: &MigConfig) -> Vec<(u32, f64)> {
    let table = &state.profiles;
    let mut missing = Vec::new();
    let mix = config
        .workload
        .iter()
        .filter_map(|(name, w)| match table.resolve(name) {
            Ok((gi, _)) => Some((gi.id, *w)),
            Err(_) => {
                missing.push(name.to_string());
                None
            }
        })
        .collect();
    if !missing.is_empty() {
        tracing::warn!(
            gpu = state.info.index,
            model = %state.info.model,
            profiles = %missing.join(", "),
            "the workload mix names profiles this GPU does not have; they are left out of its mix"
        );
    }
    mix
}

/// Plans every GPU. `mode_only` changes MIG modes but leaves instances of enabled GPUs alone, and
/// judges nothing but the modes ([`mode_targets`]; what it let pass is logged as a warning).
pub fn prepare(
    states: Vec<GpuState>,
    config: &MigConfig,
    force: bool,
    mode_only: bool,
) -> Result<Vec<Job>, PrepareError> {
    let targets = if mode_only {
        let (targets, let_pass) = mode_targets(&states, config)?;
        for note in let_pass {
            tracing::warn!("mode only, not judged: {note}");
        }
        targets
    } else {
        targets(&states, config)?
    };
    let mut jobs = Vec::new();
    let mut problems = Vec::new();
    let mut all_blocked = true;
    for (state, target) in states.into_iter().zip(targets) {
        let (mode_change, desired) = match &target {
            Target::Leave { .. } => (None, None),
            Target::MigDisabled { .. } if !state.info.mig_capable => (None, None),
            Target::MigDisabled { .. } => {
                let change = (state.mig_mode.current || state.mig_mode.pending).then_some(false);
                (change, Some(DesiredDevices::default()))
            }
            Target::MigEnabled { devices } => {
                let change = (!state.mig_mode.current || !state.mig_mode.pending).then_some(true);
                (change, (!mode_only).then(|| devices.clone()))
            }
        };
        if mode_change.is_some() && !state.pods.is_empty() {
            let pods: Vec<String> = state.pods.iter().map(ToString::to_string).collect();
            problems.push(format!(
                "GPU {} ({}): allocated to pod {}; a GPU a pod holds is never switched between MIG and non-MIG",
                state.info.index,
                state.info.model,
                pods.join(", ")
            ));
            jobs.push(Job { state, target, mode_change, plan: None });
            continue;
        }
        let plan = match desired {
            None => None,
            Some(d) => match plan_for_mix(&state.profiles, &state.instances, &d, force, &mix(&state, config)) {
                Ok(p) => Some(p),
                Err(e) => {
                    all_blocked &= matches!(e, PlanError::Blocked { .. });
                    problems.push(format!("GPU {} ({}): {e}", state.info.index, state.info.model));
                    None
                }
            },
        };
        jobs.push(Job { state, target, mode_change, plan });
    }
    if problems.is_empty() {
        Ok(jobs)
    } else {
        Err(PrepareError { problems, blocked: all_blocked, selects_nothing: false })
    }
}

/// The GPU instances `config` does not hold, by GPU index (their placement starts): those the
/// change to it would destroy, in use or not (made by hand or by another tool, or kept because
/// they are in use). GPUs it leaves alone or cannot plan have none; so has a config that cannot
/// apply to this node.
pub fn foreign(states: &[GpuState], config: &MigConfig) -> std::collections::BTreeMap<u32, Vec<u32>> {
    let Ok(targets) = targets(states, config) else { return Default::default() };
    let mut out = std::collections::BTreeMap::new();
    for (s, t) in states.iter().zip(targets) {
        let starts: Vec<u32> = match t {
            Target::MigEnabled { devices } => plan_for_mix(&s.profiles, &s.instances, &devices, true, &[])
                .map(|p| p.destroy.iter().map(|d| d.placement.start).collect())
                .unwrap_or_default(),
            Target::MigDisabled { .. } => s.instances.iter().map(|g| g.placement.start).collect(),
            Target::Leave { .. } => Vec::new(),
        };
        if !starts.is_empty() {
            out.insert(s.info.index, starts);
        }
    }
    out
}
