//! MIG profile names (`[<C>c.]<G>g.<GB>gb[+attr|-attr]`) and the memory-size formula NVIDIA's
//! tools use to derive the `<GB>` part from NVML.

use std::fmt;
use std::str::FromStr;

/// A parsed MIG device profile name such as `3g.40gb`, `1c.2g.20gb` or `1g.10gb+me`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProfileName {
    /// GPU-instance compute slices (`<G>g`).
    pub gi_slices: u32,
    /// Memory in GB as derived by [`memory_gb`] (`<GB>gb`).
    pub memory_gb: u64,
    /// Compute-instance slices (`<C>c.`), `None` when the CI spans the whole GI (C == G).
    pub ci_slices: Option<u32>,
    /// Attribute suffix in canonical form: `""`, `"+me"`, `"+me.all"`, `"+gfx"`, `"-me"`, …
    pub suffix: String,
}

/// Why a profile string could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid MIG profile '{name}': {reason}")]
pub struct NameError {
    /// The offending string.
    pub name: String,
    /// What is wrong with it.
    pub reason: String,
}

impl ProfileName {
    /// The name of a GPU instance with one full-size compute instance.
    pub fn gi(gi_slices: u32, memory_gb: u64, suffix: &str) -> Self {
        Self { gi_slices, memory_gb, ci_slices: None, suffix: suffix.to_string() }
    }

    /// The compute slices of the MIG device this name denotes (C, or G when C is omitted).
    pub fn compute_slices(&self) -> u32 {
        self.ci_slices.unwrap_or(self.gi_slices)
    }

    /// The GPU-instance part of the name (`1c.2g.20gb+me` → `2g.20gb+me`).
    pub fn gi_name(&self) -> ProfileName {
        ProfileName { ci_slices: None, ..self.clone() }
    }

    /// The same name with the compute-instance size set (dropped when it equals G).
    pub fn with_ci(&self, ci_slices: u32) -> ProfileName {
        ProfileName { ci_slices: (ci_slices != self.gi_slices).then_some(ci_slices), ..self.clone() }
    }
}

impl fmt::Display for ProfileName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(c) = self.ci_slices {
            write!(f, "{c}c.")?;
        }
        write!(f, "{}g.{}gb{}", self.gi_slices, self.memory_gb, self.suffix)
    }
}

fn number(part: &str, unit: &str, name: &str) -> Result<u64, NameError> {
    let digits = part
        .strip_suffix(unit)
        .ok_or_else(|| NameError { name: name.to_string(), reason: format!("'{part}' does not end in '{unit}'") })?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 6 {
        return Err(NameError {
            name: name.to_string(),
            reason: format!("'{part}' is not a number followed by '{unit}'"),
        });
    }
    digits.parse().map_err(|_| NameError { name: name.to_string(), reason: format!("'{part}' is out of range") })
}

fn parse_suffix(suffix: &str, name: &str) -> Result<String, NameError> {
    if suffix.is_empty() {
        return Ok(String::new());
    }
    let err = |reason: String| NameError { name: name.to_string(), reason };
    let (sign, rest) = suffix.split_at(1);
    if rest.contains('+') || rest.contains('-') {
        return Err(err("a profile may carry either '+' or '-' attributes, once".into()));
    }
    let mut seen = Vec::new();
    for attr in rest.split(',') {
        if attr.is_empty() || !attr.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.') {
            return Err(err(format!("attribute '{attr}' must be lower-case letters, digits and '.'")));
        }
        if seen.contains(&attr) {
            return Err(err(format!("attribute '{attr}' is repeated")));
        }
        seen.push(attr);
    }
    Ok(format!("{sign}{rest}"))
}

impl FromStr for ProfileName {
    type Err = NameError;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let name = raw.trim();
        let lower = name.to_ascii_lowercase();
        let cut = lower.find(['+', '-']).unwrap_or(lower.len());
        let (body, suffix) = lower.split_at(cut);
        let parts: Vec<&str> = body.split('.').collect();
        let (c, g, gb) = match parts.as_slice() {
            [g, gb] => (None, *g, *gb),
            [c, g, gb] => (Some(*c), *g, *gb),
            _ => {
                return Err(NameError {
                    name: raw.to_string(),
                    reason: "expected <G>g.<GB>gb or <C>c.<G>g.<GB>gb".into(),
                })
            }
        };
        let gi_slices = number(g, "g", raw)? as u32;
        let memory_gb = number(gb, "gb", raw)?;
        let ci = c.map(|c| number(c, "c", raw)).transpose()?.map(|c| c as u32);
        if gi_slices == 0 || ci == Some(0) {
            return Err(NameError { name: raw.to_string(), reason: "slice counts must be positive".into() });
        }
        if let Some(c) = ci {
            if c > gi_slices || (c < gi_slices && 2 * c > gi_slices + 1) {
                return Err(NameError {
                    name: raw.to_string(),
                    reason: format!("{c}c is not a valid compute-instance size in a {gi_slices}g instance"),
                });
            }
        }
        let suffix = parse_suffix(suffix, raw)?;
        Ok(ProfileName { gi_slices, memory_gb, ci_slices: ci.filter(|&c| c != gi_slices), suffix })
    }
}

/// The `<GB>` of a profile name, computed exactly as go-nvlib's `getMigMemorySizeGB` does from the
/// profile's `memorySizeMB` (MiB) and the parent device's total memory in bytes.
pub fn memory_gb(memory_mib: u64, total_bytes: u64) -> u64 {
    const ONE_MIB: f64 = 1024.0 * 1024.0;
    const ONE_GIB: u64 = 1024 * 1024 * 1024;
    if total_bytes == 0 {
        return 0;
    }
    let frac = (memory_mib as f64 * ONE_MIB) / total_bytes as f64;
    let frac = (frac * 8.0).ceil() / 8.0;
    let total_gb = total_bytes.div_ceil(ONE_GIB) as f64;
    (frac * total_gb).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> ProfileName {
        s.parse().unwrap()
    }

    #[test]
    fn parses_the_grammar() {
        assert_eq!(p("3g.40gb"), ProfileName::gi(3, 40, ""));
        assert_eq!(p("1c.2g.20gb").ci_slices, Some(1));
        assert_eq!(p("2c.2g.20gb"), ProfileName::gi(2, 20, ""));
        assert_eq!(p("1g.10gb+me").suffix, "+me");
        assert_eq!(p("1g.24gb+me.all").suffix, "+me.all");
        assert_eq!(p("1g.24gb-me").suffix, "-me");
        assert_eq!(p("4g.96gb+gfx").to_string(), "4g.96gb+gfx");
        assert_eq!(p("1C.7G.80GB").to_string(), "1c.7g.80gb");
    }

    #[test]
    fn rejects_bad_names() {
        for bad in [
            "",
            "3g",
            "g.40gb",
            "3x.40gb",
            "3g.40",
            "5c.7g.80gb",
            "3c.4g.40gb",
            "8c.7g.80gb",
            "1g.10gb+me-gfx",
            "1g.10gb+",
            "1g.10gb+me,me",
            "0g.1gb",
            "1g.10gb+M E",
        ] {
            assert!(bad.parse::<ProfileName>().is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn memory_formula_matches_worked_examples() {
        const MIB: u64 = 1024 * 1024;
        assert_eq!(memory_gb(4864, 40537 * MIB), 5);
        assert_eq!(memory_gb(81152, 81559 * MIB), 80);
        assert_eq!(memory_gb(22144, 95830 * MIB), 24);
        assert_eq!(memory_gb(71168, 143771 * MIB), 71);
        assert_eq!(memory_gb(5952, 24576 * MIB), 6);
    }
}
