//! `gpupart validate`: offline check of a config file; lists every problem.

use super::io::read_input;
use crate::cli::ValidateArgs;
use crate::mig::catalog::Model;
use crate::mig::sim::parse_spec;
use anyhow::Context;
use std::process::ExitCode;

/// Runs `validate`.
pub fn run(simulate: Option<&str>, a: &ValidateArgs) -> anyhow::Result<ExitCode> {
    let (text, name) = read_input(&a.config_file, "config file")?;
    // Every config is parsed on its own, so one that does not parse hides none of the others.
    let (file, parse_errors) =
        crate::config::parse_all(&text).with_context(|| format!("invalid config file {name}"))?;
    let mut parse_problems: Vec<String> = parse_errors
        .iter()
        .filter(|e| a.selected_config.as_ref().is_none_or(|only| e.config.as_ref() == Some(only)))
        .map(ToString::to_string)
        .collect();
    let spec = a.gpu.as_deref().or(simulate);
    let node: Option<Vec<&'static Model>> = match spec {
        Some(s) => Some(parse_spec(s)?.into_iter().flat_map(|(m, n)| std::iter::repeat_n(m, n as usize)).collect()),
        None => None,
    };
    let only = a.selected_config.as_deref().filter(|_| parse_problems.is_empty());
    let found = if a.selected_config.is_some() && !parse_problems.is_empty() {
        crate::validate::Findings::default()
    } else {
        crate::validate::validate(&file, only, node.as_deref()).map_err(anyhow::Error::msg)?
    };
    for w in &found.warnings {
        outln!("warning: {w}");
    }
    let mut problems = std::mem::take(&mut parse_problems);
    problems.extend(found.problems);
    if a.strict {
        problems.extend(found.warnings.iter().cloned());
    }
    let checked = a.selected_config.as_ref().map_or(file.configs.len() + parse_errors.len(), |_| 1);
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
