//! Writing v1 config entries as YAML, one way for every verb that prints a config.

use std::collections::BTreeMap;

/// One entry's lines: `device-filter` (already formatted), `devices`, `mig-enabled` and, when
/// given, `mig-devices` (an empty map is written `{}`).
pub struct EntryLines<'a> {
    /// The `device-filter` value as written, if any.
    pub filter: Option<String>,
    /// The `devices` value as written (`all`, `[0, 1]`).
    pub devices: String,
    /// `mig-enabled`.
    pub mig_enabled: bool,
    /// `mig-devices`, when the entry has the key.
    pub mig_devices: Option<&'a BTreeMap<String, u32>>,
}

/// Appends one list entry at the indentation of a config under `mig-configs:`.
pub fn entry(out: &mut String, e: &EntryLines<'_>) {
    let mut lines = Vec::new();
    if let Some(f) = &e.filter {
        lines.push(format!("device-filter: {f}"));
    }
    lines.push(format!("devices: {}", e.devices));
    lines.push(format!("mig-enabled: {}", e.mig_enabled));
    match e.mig_devices {
        None => {}
        Some(d) if d.is_empty() => lines.push("mig-devices: {}".into()),
        Some(d) => {
            lines.push("mig-devices:".into());
            lines.extend(d.iter().map(|(name, n)| format!("  \"{name}\": {n}")));
        }
    }
    for (i, l) in lines.iter().enumerate() {
        out.push_str(if i == 0 { "    - " } else { "      " });
        out.push_str(l);
        out.push('\n');
    }
}
