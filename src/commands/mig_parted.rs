//! How gpupart speaks when invoked as `nvidia-mig-parted` (docs/mig-parted.md): mig-parted's
//! lines for the outcomes scripts and people look for, and its errors as its logger (logrus's
//! text format, stderr not a terminal) prints them. gpupart's own verbs keep their words.

/// `assert --valid-config` succeeded.
pub const CONFIG_VALID: &str = "Selected MIG configuration is valid";
/// `assert` succeeded.
pub const CONFIG_APPLIED: &str = "Selected MIG configuration currently applied";
/// `assert --mode-only` succeeded.
pub const MODE_APPLIED: &str = "Selected MIG mode settings from configuration currently applied";
/// `apply` (with or without `--mode-only`) succeeded.
pub const APPLIED: &str = "MIG configuration applied successfully";
/// `assert` failed (mig-parted's error, capitalized as its `log.Fatal` prints it).
pub const NOT_APPLIED: &str = "Assertion failure: selected configuration not currently applied";

/// One line as logrus's TextFormatter writes it when stderr is not a terminal:
/// `time="2026-12-07T14:10:00Z" level=fatal msg="Error parsing config file: …"` (UTC).
pub fn log_line(level: &str, msg: &str, unix_secs: i64) -> String {
    format!("time=\"{}\" level={level} msg={}", rfc3339(unix_secs), quoted(msg))
}

/// Logs `msg` at fatal level (the caller exits 1, as `log.Fatal` does), first letter capitalized
/// as mig-parted's `util.Capitalize` makes it.
pub fn fatal(msg: &str) {
    eprintln!("{}", log_line("fatal", &capitalize(msg), crate::clock::now_secs()));
}

/// Logs `msg` at debug level when `debug` (`-d`), as mig-parted logs the reason of a failed assert.
pub fn debug(debug: bool, msg: &str) {
    if debug {
        eprintln!("{}", log_line("debug", &capitalize(msg), crate::clock::now_secs()));
    }
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
}

/// logrus quotes a value unless it is made of letters, digits and `-._/@^+` only (Go's `%q`).
fn quoted(s: &str) -> String {
    let plain = !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-._/@^+".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("{s:?}")
    }
}

/// `unix_secs` as RFC 3339 in UTC (`2026-12-07T14:10:00Z`), as Go formats a UTC time.
fn rfc3339(unix_secs: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(unix_secs)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| unix_secs.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_logrus_text_lines() {
        // 2026-12-07T14:10:05Z, and the leap day and the epoch.
        assert_eq!(rfc3339(1_796_652_605), "2026-12-07T14:10:05Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(
            log_line("fatal", NOT_APPLIED, 0),
            "time=\"1970-01-01T00:00:00Z\" level=fatal msg=\"Assertion failure: selected configuration not currently applied\""
        );
        assert_eq!(log_line("debug", "ok", 0), "time=\"1970-01-01T00:00:00Z\" level=debug msg=ok");
        assert_eq!(quoted("say \"hi\"\n"), "\"say \\\"hi\\\"\\n\"");
        assert_eq!(capitalize("error parsing config file: x"), "Error parsing config file: x");
    }
}
