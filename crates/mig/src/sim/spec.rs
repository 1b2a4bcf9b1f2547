//! The `MODEL:COUNT[,MODEL:COUNT…]` node specification used by `--simulate` and `FAKE_NVML_GPUS`.

use crate::catalog::{self, Model};

/// A malformed node specification.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// An entry is not `MODEL` or `MODEL:COUNT`.
    #[error("invalid GPU spec entry '{0}': expected MODEL:COUNT, e.g. A100-SXM4-80GB:8")]
    Syntax(String),
    /// Unknown model id.
    #[error("unknown GPU model '{model}'; known models: {known}")]
    UnknownModel {
        /// The model as written.
        model: String,
        /// Every catalog id.
        known: String,
    },
    /// Zero GPUs, or an absurd count.
    #[error("GPU count in '{0}' must be between 1 and 64")]
    Count(String),
}

/// Parses `MODEL:COUNT[,MODEL:COUNT…]` (a missing `:COUNT` means 1).
pub fn parse_spec(spec: &str) -> Result<Vec<(&'static Model, u32)>, SpecError> {
    let mut out = Vec::new();
    for entry in spec.split(',').map(str::trim) {
        if entry.is_empty() {
            return Err(SpecError::Syntax(spec.to_string()));
        }
        let (model, count) = match entry.rsplit_once(':') {
            Some((m, c)) => (m, c.trim().parse::<u32>().map_err(|_| SpecError::Count(entry.to_string()))?),
            None => (entry, 1),
        };
        if count == 0 || count > 64 {
            return Err(SpecError::Count(entry.to_string()));
        }
        let model = catalog::lookup(model)
            .ok_or_else(|| SpecError::UnknownModel { model: model.trim().to_string(), known: catalog::model_ids() })?;
        out.push((model, count));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let s = parse_spec("a100-sxm4-80gb:4, V100-SXM2-16GB:2").unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].0.id, s[0].1), ("A100-SXM4-80GB", 4));
        assert_eq!(parse_spec("H100-SXM5-80GB").unwrap()[0].1, 1);
        assert!(matches!(parse_spec("B200:8"), Err(SpecError::UnknownModel { .. })));
        assert!(matches!(parse_spec("A30-24GB:0"), Err(SpecError::Count(_))));
        assert!(matches!(parse_spec("A30-24GB:x"), Err(SpecError::Count(_))));
        assert!(parse_spec("").is_err());
    }
}
