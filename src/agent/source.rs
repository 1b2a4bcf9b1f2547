//! Where the desired layout comes from in bare-metal mode (a fixed name or a file holding one),
//! and change detection for it and the config file (a ConfigMap mount is replaced by symlink
//! swap, so files are compared by content, not by inode or mtime).

use super::reconcile::Desired;
use std::path::{Path, PathBuf};

/// The layout name's source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayoutSource {
    /// `--layout NAME`.
    Fixed(String),
    /// `--layout-file FILE`: the first non-empty, non-comment line.
    File(PathBuf),
    /// Supplied by the caller (the Kubernetes label).
    External(Option<String>),
}

/// Reads the layout name (`default` when none is found).
pub fn layout_name(source: &LayoutSource, default: Option<&str>) -> Result<Option<String>, String> {
    let name = match source {
        LayoutSource::Fixed(n) => Some(n.clone()),
        LayoutSource::External(n) => n.clone(),
        LayoutSource::File(p) => match std::fs::read_to_string(p) {
            Ok(t) => t.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_string),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(format!("reading layout file {}: {e}", p.display())),
        },
    };
    Ok(name.filter(|n| !n.is_empty()).or_else(|| default.map(str::to_string)))
}

/// Reads everything the reconcile needs.
pub fn desired(source: &LayoutSource, default: Option<&str>, config: &Path) -> Desired {
    let config_text = std::fs::read_to_string(config).map_err(|e| format!("{}: {e}", config.display()));
    match layout_name(source, default) {
        Ok(layout) => Desired { layout, config: config_text },
        Err(e) => Desired { layout: Some(String::new()), config: Err(e) },
    }
}

/// A cheap fingerprint of the inputs, to notice changes by polling.
pub fn fingerprint(source: &LayoutSource, config: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::fs::read(config).ok().hash(&mut h);
    if let LayoutSource::File(p) = source {
        std::fs::read(p).ok().hash(&mut h);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_file_first_meaningful_line_or_default() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("layout");
        let src = LayoutSource::File(f.clone());
        assert_eq!(layout_name(&src, Some("all-disabled")).unwrap().as_deref(), Some("all-disabled"));
        assert_eq!(layout_name(&src, None).unwrap(), None);
        std::fs::write(&f, "# comment\n\n  all-balanced \nother\n").unwrap();
        assert_eq!(layout_name(&src, None).unwrap().as_deref(), Some("all-balanced"));
        let before = fingerprint(&src, &f);
        std::fs::write(&f, "x\n").unwrap();
        assert_ne!(before, fingerprint(&src, &f));
        assert_eq!(layout_name(&LayoutSource::Fixed("a".into()), Some("b")).unwrap().as_deref(), Some("a"));
    }
}
