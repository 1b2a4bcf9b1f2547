//! YAML reading for every input file: one place that turns the parser's errors into messages
//! for the user (line, column and the offending key, without the library's own advice).

/// Parses `text` as YAML into `T`; the error names the line, column and what is wrong.
pub fn from_str<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    serde_saphyr::from_str(text).map_err(|e| message(&e.to_string()))
}

/// The parser's message, less the advice meant for programmers ("set DuplicateKeyPolicy …").
fn message(raw: &str) -> String {
    raw.replace(", set DuplicateKeyPolicy in Options if acceptable", "")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_duplicate_key_is_named_with_its_line_and_no_library_advice() {
        let e = super::from_str::<serde_json::Value>("a: 1\nb:\n  c: 1\n  c: 2\n").unwrap_err();
        assert!(e.contains("line 4") && e.contains("duplicate mapping key: c"), "{e}");
        assert!(!e.contains("DuplicateKeyPolicy"), "{e}");
    }
}
