//! `gpupart plan`: fleet and demand in, pools, layouts, labels and taints out (docs/plan.md).

use super::io::read_input;
use crate::cli::{PlanArgs, PlanFormat};
use crate::fleet::current::{self, Current};
use crate::fleet::{self, render, report};
use anyhow::Context;
use std::process::ExitCode;

/// Today's layouts from `--current` or `--from-cluster` (empty without either).
fn today(a: &PlanArgs) -> anyhow::Result<Current> {
    let today = if let Some(path) = &a.current {
        let (text, name) = read_input(path, "current layouts file")?;
        current::parse_status_file(&text).with_context(|| format!("invalid current layouts file {name}"))?
    } else if a.from_cluster {
        let key = format!("{}gpus", a.annotation_prefix);
        let mut today = Current::new();
        for (node, value) in crate::kube::cluster::read_node_annotations(&key)? {
            match value {
                Some(v) => {
                    today.insert(node.clone(), current::from_annotation(&node, &v)?);
                }
                None => tracing::debug!(%node, "no {key} annotation: no gpupart agent"),
            }
        }
        today
    } else {
        return Ok(Current::new());
    };
    Ok(today)
}

/// Runs `plan`.
pub fn run(a: &PlanArgs) -> anyhow::Result<ExitCode> {
    let (text, name) = read_input(&a.file, "demand file")?;
    let mut input = fleet::input::parse(&text).with_context(|| format!("invalid demand file {name}"))?;
    let today = today(a)?;
    for (placeholder, real) in current::adopt_names(&mut input, &today) {
        tracing::info!(%placeholder, node = %real, "a node of today takes the place of a counted one");
    }
    for node in today.keys().filter(|n| !input.nodes.iter().any(|x| &x.name == *n)) {
        tracing::warn!(%node, "today's layouts name a node outside the fleet; ignored");
    }
    let started = std::time::Instant::now();
    let given_today = a.current.is_some() || a.from_cluster;
    let plan = fleet::plan_from(&input, &fleet::Options { headroom_pct: a.headroom }, &today).with_context(|| {
        if given_today {
            format!("invalid demand file {name} for today's layouts")
        } else {
            format!("invalid demand file {name}")
        }
    })?;
    if input.nodes.len() >= 1000 {
        tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, "planning: writing the report");
    }
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
        PlanFormat::Kubectl => render::kubectl_script(&doc),
        PlanFormat::Json => serde_json::to_string_pretty(&doc).context("rendering the plan as JSON")? + "\n",
    };
    out!("{out}");
    Ok(ExitCode::SUCCESS)
}
