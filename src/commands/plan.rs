//! `gpupart plan`: fleet and demand in, pools, layouts, labels and taints out (docs/plan.md).

use super::read_input;
use crate::cli::{PlanArgs, PlanFormat};
use crate::fleet::{self, render, report};
use anyhow::Context;
use std::process::ExitCode;

/// Runs `plan`.
pub fn run(a: &PlanArgs) -> anyhow::Result<ExitCode> {
    let (text, name) = read_input(&a.file, "demand file")?;
    let input = fleet::input::parse(&text).with_context(|| format!("invalid demand file {name}"))?;
    let started = std::time::Instant::now();
    let plan = fleet::plan(&input, &fleet::Options { headroom_pct: a.headroom })
        .with_context(|| format!("invalid demand file {name}"))?;
    let doc = report::report(&input, &plan);
    tracing::info!(
        nodes = input.nodes.len(),
        models = input.demand.len(),
        gpus_used = doc.summary.gpus_used,
        method = %doc.summary.search.method,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "planned"
    );
    for u in &doc.unplaced {
        tracing::warn!(model = %u.model, replicas = u.replicas, reason = %u.reason, "unplaced");
    }
    let out = match a.output {
        PlanFormat::Text => render::text(&doc),
        PlanFormat::Yaml => render::kube_yaml(&doc),
        PlanFormat::Json => serde_json::to_string_pretty(&doc).context("rendering the plan as JSON")? + "\n",
    };
    print!("{out}");
    Ok(ExitCode::SUCCESS)
}
