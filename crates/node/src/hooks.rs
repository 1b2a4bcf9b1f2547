//! mig-parted hooks files (`version: v1`, `hooks:`): commands run at `apply-start`,
//! `pre-apply-mode`, `pre-apply-config` and `apply-exit`. As in mig-parted, a hook does not inherit
//! the caller's environment: it sees its own `envs` plus the `MIG_PARTED_*` settings of the run.

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

/// The hook names, in the order an apply runs them.
pub const HOOK_NAMES: [&str; 4] = ["apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit"];

/// One command of a hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookSpec {
    /// Program (absolute path recommended: PATH is not inherited).
    pub command: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Environment of the command (besides the `MIG_PARTED_*` settings).
    pub envs: BTreeMap<String, String>,
    /// Working directory.
    pub workdir: Option<PathBuf>,
}

/// A parsed hooks file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hooks {
    /// Hook name → commands, run in order; the first failure stops the hook.
    pub hooks: BTreeMap<String, Vec<HookSpec>>,
}

/// A malformed hooks file or a failed hook.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HookError(pub String);

fn strings(v: &Value, at: &str) -> Result<Vec<String>, HookError> {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|i| {
                i.as_str().map(str::to_string).ok_or_else(|| HookError(format!("{at}: expected strings, found {i}")))
            })
            .collect(),
        other => Err(HookError(format!("{at}: expected a list of strings, found {other}"))),
    }
}

fn spec(v: &Value, at: &str) -> Result<HookSpec, HookError> {
    let Value::Object(m) = v else { return Err(HookError(format!("{at}: expected a mapping, found {v}"))) };
    for key in m.keys() {
        if !matches!(key.as_str(), "command" | "args" | "envs" | "workdir") {
            return Err(HookError(format!("{at}: unexpected field: {key}")));
        }
    }
    let command = m
        .get("command")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
        .ok_or_else(|| HookError(format!("{at}: missing required field 'command'")))?
        .to_string();
    let args = m.get("args").map(|a| strings(a, &format!("{at}.args"))).transpose()?.unwrap_or_default();
    let envs = match m.get("envs") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Object(e)) => e
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => Ok((k.clone(), other.to_string())),
            })
            .collect::<Result<_, HookError>>()?,
        Some(other) => return Err(HookError(format!("{at}.envs: expected a mapping, found {other}"))),
    };
    let workdir = m.get("workdir").and_then(Value::as_str).map(PathBuf::from);
    Ok(HookSpec { command, args, envs, workdir })
}

/// Parses a hooks file.
pub fn parse(text: &str) -> Result<Hooks, HookError> {
    let root: Value = crate::config::yaml::from_str(text).map_err(|e| HookError(format!("invalid YAML: {e}")))?;
    let Value::Object(top) = root else {
        return Err(HookError("expected a mapping with 'version' and 'hooks'".into()));
    };
    for key in top.keys() {
        if key != "version" && key != "hooks" {
            return Err(HookError(format!("unexpected field: {key}")));
        }
    }
    match top.get("version") {
        Some(Value::String(v)) if v == "v1" => {}
        Some(v) => return Err(HookError(format!("unknown version: {v}"))),
        None => return Err(HookError("missing required field 'version'".into())),
    }
    let mut hooks = BTreeMap::new();
    match top.get("hooks") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (name, list) in m {
                if !HOOK_NAMES.contains(&name.as_str()) {
                    return Err(HookError(format!("unknown hook '{name}'; hooks are {}", HOOK_NAMES.join(", "))));
                }
                let Value::Array(items) = list else {
                    return Err(HookError(format!("hooks.{name}: expected a list of commands")));
                };
                let specs = items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| spec(v, &format!("hooks.{name}[{i}]")))
                    .collect::<Result<Vec<_>, _>>()?;
                hooks.insert(name.clone(), specs);
            }
        }
        Some(other) => return Err(HookError(format!("hooks: expected a mapping, found {other}"))),
    }
    Ok(Hooks { hooks })
}

/// Lines of a failing hook's output shown in its error.
const OUTPUT_TAIL_LINES: usize = 20;

/// The last `n` lines of `bytes`, as text.
fn tail(bytes: &[u8], n: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl HookSpec {
    /// Why this command cannot start, checked before starting it: a working directory or a
    /// program (given as a path) that does not exist. The OS would say only "No such file".
    fn cannot_start(&self) -> Option<String> {
        if let Some(dir) = &self.workdir {
            if !dir.is_dir() {
                return Some(format!("its working directory {} does not exist", dir.display()));
            }
        }
        let program = match &self.workdir {
            Some(dir) if !self.command.starts_with('/') && self.command.contains('/') => dir.join(&self.command),
            _ => PathBuf::from(&self.command),
        };
        (self.command.contains('/') && !program.exists())
            .then(|| format!("the program {} does not exist", program.display()))
    }
}

/// The `MIG_PARTED_*` environment an apply's hooks see (mig-parted passes every flag that has an
/// environment source).
pub fn apply_env(
    config_file: &str,
    selected: &str,
    hooks_file: &str,
    skip_reset: bool,
    mode_only: bool,
    debug: bool,
) -> Vec<(String, String)> {
    vec![
        ("MIG_PARTED_CONFIG_FILE".into(), config_file.to_string()),
        ("MIG_PARTED_SELECTED_CONFIG".into(), selected.to_string()),
        ("MIG_PARTED_HOOKS_FILE".into(), hooks_file.to_string()),
        ("MIG_PARTED_SKIP_RESET".into(), skip_reset.to_string()),
        ("MIG_PARTED_MODE_CHANGE_ONLY".into(), mode_only.to_string()),
        ("MIG_PARTED_DEBUG".into(), debug.to_string()),
    ]
}

impl Hooks {
    /// Runs the hooks due right before `jobs` are carried out: `pre-apply-mode` when a MIG mode
    /// changes, `pre-apply-config` when instances change (as mig-parted decides them).
    pub fn before_change(
        &self,
        jobs: &[crate::prepare::Job],
        settings: &[(String, String)],
        verbose: bool,
    ) -> Result<(), HookError> {
        if jobs.iter().any(|j| j.mode_change.is_some()) {
            self.run("pre-apply-mode", settings, verbose)?;
        }
        if jobs.iter().any(|j| j.plan.as_ref().is_some_and(|p| !p.is_noop())) {
            self.run("pre-apply-config", settings, verbose)?;
        }
        Ok(())
    }

    /// Runs hook `name` (nothing if absent) with `settings` (`MIG_PARTED_*`) as the environment
    /// besides each command's own `envs`. A failing command's error ends with the last lines of
    /// its output; with `verbose` every command's output is shown.
    pub fn run(&self, name: &str, settings: &[(String, String)], verbose: bool) -> Result<(), HookError> {
        for (i, h) in self.hooks.get(name).into_iter().flatten().enumerate() {
            let at = format!("hook {name}[{i}] ({})", h.command);
            if let Some(why) = h.cannot_start() {
                return Err(HookError(format!("{at} cannot run: {why}")));
            }
            let mut c = Command::new(&h.command);
            c.args(&h.args).env_clear().envs(settings.iter().map(|(k, v)| (k, v))).envs(&h.envs);
            if let Some(dir) = &h.workdir {
                c.current_dir(dir);
            }
            c.stdin(std::process::Stdio::null());
            tracing::info!(hook = name, index = i, command = %h.command, "running hook");
            let out = c.output().map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => HookError(format!("{at} cannot run: no program {} on PATH", h.command)),
                _ => HookError(format!("{at} cannot run: {e}")),
            })?;
            if verbose {
                use std::io::Write as _;
                let _ = std::io::stderr().write_all(&out.stdout);
                let _ = std::io::stderr().write_all(&out.stderr);
            }
            if !out.status.success() {
                let mut shown = tail(&out.stderr, OUTPUT_TAIL_LINES);
                if shown.trim().is_empty() {
                    shown = tail(&out.stdout, OUTPUT_TAIL_LINES);
                }
                let output = if shown.trim().is_empty() {
                    " (no output)".to_string()
                } else {
                    format!("; its output ends:\n{shown}")
                };
                return Err(HookError(format!("{at} failed: {}{output}", out.status)));
            }
        }
        Ok(())
    }
}

/// Parses a mig-manager GPU-clients file (`version: v1`, `systemd-services: [...]`).
pub fn parse_gpu_clients(text: &str) -> Result<Vec<String>, HookError> {
    let root: Value = crate::config::yaml::from_str(text).map_err(|e| HookError(format!("invalid YAML: {e}")))?;
    let Value::Object(top) = root else { return Err(HookError("expected a mapping".into())) };
    for key in top.keys() {
        if key != "version" && key != "systemd-services" {
            return Err(HookError(format!("unexpected field: {key}")));
        }
    }
    if top.get("version").and_then(Value::as_str) != Some("v1") {
        return Err(HookError("unknown or missing version (expected v1)".into()));
    }
    top.get("systemd-services").map_or(Ok(Vec::new()), |v| strings(v, "systemd-services"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn reference(name: &str) -> String {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference/nvidia-configs").join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn nvidia_hooks_and_clients_files_parse() {
        let h = parse(&reference("mig-parted-systemd-hooks-default.yaml")).unwrap();
        assert_eq!(h.hooks.len(), 4);
        assert_eq!(h.hooks["apply-exit"].len(), 2);
        assert_eq!(h.hooks["apply-start"][0].workdir.as_deref(), Some(Path::new("/etc/nvidia-mig-manager")));
        assert_eq!(parse(&reference("mig-parted-systemd-hooks-minimal.yaml")).unwrap().hooks.len(), 1);
        let cm: Value = serde_saphyr::from_str(&reference("gpu-operator-default-gpu-clients-configmap.yaml")).unwrap();
        let clients = parse_gpu_clients(cm["data"]["clients.yaml"].as_str().unwrap()).unwrap();
        assert_eq!(clients.len(), 9);
        assert!(clients.contains(&"dcgm-exporter.service".to_string()));
    }

    #[test]
    fn bad_hooks_are_named() {
        let e = parse("version: v1\nhooks:\n  before-apply:\n  - command: /bin/true\n").unwrap_err().0;
        assert!(e.contains("unknown hook 'before-apply'"), "{e}");
        let e = parse("version: v1\nhooks:\n  apply-start:\n  - args: [x]\n").unwrap_err().0;
        assert_eq!(e, "hooks.apply-start[0]: missing required field 'command'");
        let e = parse("version: v1\nhooks:\n  apply-start:\n  - command: /bin/true\n    shell: yes\n").unwrap_err().0;
        assert_eq!(e, "hooks.apply-start[0]: unexpected field: shell");
    }

    #[test]
    fn hooks_see_only_their_env_and_stop_at_the_first_failure() {
        let dir = std::env::temp_dir().join(format!("gpupart-hooks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("env.txt");
        let text = format!(
            "version: v1\nhooks:\n  apply-start:\n  - command: /bin/sh\n    args: [\"-c\", \"env > {}\"]\n    envs: {{FOO: bar}}\n  - command: /bin/false\n  - command: /bin/sh\n    args: [\"-c\", \"touch {}/never\"]\n",
            out.display(),
            dir.display()
        );
        let h = parse(&text).unwrap();
        let e = h.run("apply-start", &[("MIG_PARTED_SELECTED_CONFIG".into(), "all".into())], false).unwrap_err().0;
        assert!(e.contains("hook apply-start[1] (/bin/false) failed"), "{e}");
        let env = std::fs::read_to_string(&out).unwrap();
        assert!(env.contains("FOO=bar") && env.contains("MIG_PARTED_SELECTED_CONFIG=all"), "{env}");
        assert!(!env.contains("CARGO"), "the caller's environment leaked: {env}");
        assert!(!dir.join("never").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
