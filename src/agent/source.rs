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

/// Reads the layout name (`default` when none is found); without one, says why there is none.
pub fn layout_name(source: &LayoutSource, default: Option<&str>) -> Result<Result<String, String>, String> {
    let found = match source {
        LayoutSource::Fixed(n) => Ok(n.clone()),
        LayoutSource::External(n) => n.clone().ok_or_else(|| "no layout requested".to_string()),
        LayoutSource::File(p) => match std::fs::read_to_string(p) {
            Ok(t) => {
                t.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_string).ok_or_else(
                    || {
                        format!(
                            "no layout requested: layout file {} holds no layout name (only blank or comment lines)",
                            p.display()
                        )
                    },
                )
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(format!("no layout requested: layout file {} does not exist", p.display()))
            }
            Err(e) => return Err(format!("reading layout file {}: {e}", p.display())),
        },
    };
    Ok(found.and_then(|n| if n.is_empty() { Err("the layout name is empty".into()) } else { Ok(n) }).or_else(|why| {
        match default {
            Some(d) => Ok(d.to_string()),
            None => Err(why),
        }
    }))
}

/// Where the config text comes from.
#[derive(Clone)]
pub enum ConfigSource {
    /// `-f FILE` (a ConfigMap mount is fine: it is re-read on change).
    File(PathBuf),
    /// `--config-map NS/NAME`, watched through the API.
    Map(Box<super::config_map::ConfigMapConfig>),
}

impl ConfigSource {
    /// The config text, or why it cannot be read; `None` while a ConfigMap has not been read yet.
    pub fn text(&self) -> Option<Result<String, String>> {
        match self {
            ConfigSource::File(p) => Some(std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))),
            ConfigSource::Map(m) => m.text(),
        }
    }

    /// The config file, when the config is one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            ConfigSource::File(p) => Some(p),
            ConfigSource::Map(_) => None,
        }
    }
}

/// Reads everything the reconcile needs from the layout source and the config text.
pub fn desired(source: &LayoutSource, default: Option<&str>, config_text: Result<String, String>) -> Desired {
    match layout_name(source, default) {
        Ok(Ok(name)) => Desired { layout: Some(name), config: config_text, idle_reason: String::new() },
        Ok(Err(why)) => Desired { layout: None, config: config_text, idle_reason: why },
        Err(e) => Desired { layout: Some(String::new()), config: Err(e), idle_reason: String::new() },
    }
}

/// A cheap fingerprint of the inputs, to notice changes by polling.
pub fn fingerprint(source: &LayoutSource, config: Option<&Path>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    config.and_then(|c| std::fs::read(c).ok()).hash(&mut h);
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
        assert_eq!(layout_name(&src, Some("all-disabled")).unwrap().as_deref(), Ok("all-disabled"));
        let why = layout_name(&src, None).unwrap().unwrap_err();
        assert!(why.contains("does not exist") && why.contains(&f.display().to_string()), "{why}");
        std::fs::write(&f, "# only a comment\n\n").unwrap();
        assert!(layout_name(&src, None).unwrap().unwrap_err().contains("holds no layout name"));
        std::fs::write(&f, "# comment\n\n  all-balanced \nother\n").unwrap();
        assert_eq!(layout_name(&src, None).unwrap().as_deref(), Ok("all-balanced"));
        let before = fingerprint(&src, Some(&f));
        std::fs::write(&f, "x\n").unwrap();
        assert_ne!(before, fingerprint(&src, Some(&f)));
        assert_eq!(layout_name(&LayoutSource::Fixed("a".into()), Some("b")).unwrap().as_deref(), Ok("a"));
    }
}
