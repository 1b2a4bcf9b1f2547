//! `gpupart validate`: offline check of a config file; lists every problem.

use super::read_config;
use crate::cli::ValidateArgs;
use crate::mig::catalog::Model;
use crate::mig::sim::parse_spec;
use std::process::ExitCode;

/// Runs `validate`.
pub fn run(simulate: Option<&str>, a: &ValidateArgs) -> anyhow::Result<ExitCode> {
    let file = read_config(&a.config_file)?;
    let spec = a.gpu.as_deref().or(simulate);
    let node: Option<Vec<&'static Model>> = match spec {
        Some(s) => Some(parse_spec(s)?.into_iter().flat_map(|(m, n)| std::iter::repeat_n(m, n as usize)).collect()),
        None => None,
    };
    let found =
        crate::validate::validate(&file, a.selected_config.as_deref(), node.as_deref()).map_err(anyhow::Error::msg)?;
    for w in &found.warnings {
        outln!("warning: {w}");
    }
    let mut problems = found.problems;
    if a.strict {
        problems.extend(found.warnings.iter().cloned());
    }
    let checked = a.selected_config.as_ref().map_or(file.configs.len(), |_| 1);
    let against = match &node {
        Some(n) => format!("a node of {} GPU(s)", n.len()),
        None => "every catalog model".to_string(),
    };
    if problems.is_empty() {
        outln!("OK: {checked} config(s) checked against {against}, {} warning(s)", found.warnings.len());
        return Ok(ExitCode::SUCCESS);
    }
    for p in &problems {
        outln!("{p}");
    }
    eprintln!("error: {} problem(s) in {checked} config(s) checked against {against}", problems.len());
    Ok(ExitCode::FAILURE)
}
