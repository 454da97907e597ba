//! The suite's bookkeeping: the exclusion file (each spec skipped with its reason) and the
//! per-spec outcomes read back from the JUnit report.

use std::path::Path;

use anyhow::{Context, Result, bail};

/// The specs excluded for a reason outside flock, each with the reason.
pub(super) const EXCLUSIONS: &str = include_str!("exclusions.txt");

/// One entry of the exclusion file.
#[derive(Debug, PartialEq)]
pub struct Exclusion {
    /// A literal part of the spec's full name.
    pub spec: String,
    /// Why it cannot run here.
    pub reason: String,
}

/// Parses the exclusion file: a spec line, then its indented reason lines; `#` comments.
pub fn exclusions(text: &str) -> Result<Vec<Exclusion>> {
    let mut out: Vec<Exclusion> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        if line.starts_with([' ', '\t']) {
            let Some(last) = out.last_mut() else {
                bail!("e2e/exclusions.txt:{}: a reason before any spec", n + 1);
            };
            if !last.reason.is_empty() {
                last.reason.push(' ');
            }
            last.reason.push_str(line.trim());
        } else {
            out.push(Exclusion {
                spec: line.trim().to_owned(),
                reason: String::new(),
            });
        }
    }
    if let Some(e) = out.iter().find(|e| e.reason.is_empty()) {
        bail!("e2e/exclusions.txt: {:?} has no reason", e.spec);
    }
    Ok(out)
}

/// Escapes `text` for Go's regexp (RE2).
pub(super) fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if r"\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// One spec of a JUnit report.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// Its full name, tags included.
    pub name: String,
    /// How it ended.
    pub outcome: Outcome,
    /// How long it ran.
    pub seconds: f64,
    /// What its `<failure>` (or `<error>`) said, when it failed: Ginkgo's message, whose first
    /// lines name the check that missed.
    pub failure: Option<String>,
}

/// How a spec ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    /// It ran and passed.
    Passed,
    /// It ran and failed (or errored).
    Failed,
    /// It did not run (not in focus, skipped by a tag or an exclusion, or by the spec itself).
    Skipped,
}

/// Decodes the XML entities Ginkgo's JUnit reporter writes.
fn unescape(text: &str) -> String {
    text.replace("&#34;", "\"")
        .replace("&#39;", "'")
        .replace("&#xA;", "\n")
        .replace("&#x9;", "\t")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// The value of attribute `name` in the tag text `tag`.
fn attribute(tag: &str, name: &str) -> Option<String> {
    let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    let len = tag[start..].find('"')?;
    Some(unescape(&tag[start..start + len]))
}

/// Parses Ginkgo's JUnit report: every `<testcase>` with its outcome.
pub fn parse_junit(xml: &str) -> Vec<Spec> {
    let mut specs = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find("<testcase ") {
        rest = &rest[i..];
        let tag_end = rest.find('>').unwrap_or(rest.len());
        let tag = &rest[..tag_end];
        let self_closed = tag.ends_with('/');
        let body_end = if self_closed {
            tag_end
        } else {
            rest.find("</testcase>").unwrap_or(rest.len())
        };
        let body = &rest[tag_end..body_end];
        let outcome = if body.contains("<failure") || body.contains("<error") {
            Outcome::Failed
        } else if body.contains("<skipped") {
            Outcome::Skipped
        } else {
            Outcome::Passed
        };
        let failure = ["<failure", "<error"].iter().find_map(|open| {
            let start = body.find(open)?;
            let text = &body[start..];
            let text = &text[text.find('>')? + 1..];
            let end = text.find("</").unwrap_or(text.len());
            Some(unescape(text[..end].trim()))
        });
        if let Some(name) = attribute(tag, "name") {
            specs.push(Spec {
                name,
                outcome,
                seconds: attribute(tag, "time")
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0.0),
                failure,
            });
        }
        rest = &rest[body_end.max(1)..];
    }
    specs
}

/// Every spec of the JUnit reports in `dir`.
pub(super) fn read_junit(dir: &Path) -> Result<Vec<Spec>> {
    let mut specs = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("junit") && name.ends_with(".xml") {
            let xml = std::fs::read_to_string(&path)
                .with_context(|| format!("read {}", path.display()))?;
            specs.extend(parse_junit(&xml));
        }
    }
    if specs.is_empty() {
        bail!("no JUnit report in {}", dir.display());
    }
    Ok(specs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exclusion_file_parses_and_every_entry_has_a_reason() {
        let e = exclusions(EXCLUSIONS).unwrap();
        assert!(e.iter().all(|e| !e.reason.is_empty() && !e.spec.is_empty()));
        let one = exclusions("# c\n[sig-network] a spec\n    its reason\n").unwrap();
        assert_eq!(
            one,
            [Exclusion {
                spec: "[sig-network] a spec".into(),
                reason: "its reason".into()
            }]
        );
        assert!(exclusions("a spec\n").is_err());
        assert!(exclusions("  a reason\n").is_err());
    }

    #[test]
    fn junit_outcomes() {
        let xml = r#"<testsuite><testcase name="[sig-network] a &#34;b&#34;" classname="x" time="1.5"></testcase>
<testcase name="c" classname="x" time="0"><skipped></skipped></testcase>
<testcase name="d" classname="x" time="3"><failure type="Failure">boom</failure></testcase></testsuite>"#;
        let specs = parse_junit(xml);
        assert_eq!(specs.len(), 3);
        assert_eq!(specs[0].name, "[sig-network] a \"b\"");
        assert_eq!(specs[0].outcome, Outcome::Passed);
        assert_eq!(specs[0].seconds, 1.5);
        assert_eq!(specs[1].outcome, Outcome::Skipped);
        assert_eq!(specs[2].outcome, Outcome::Failed);
        assert_eq!(specs[2].failure.as_deref(), Some("boom"));
        assert_eq!(specs[0].failure, None);
    }

    #[test]
    fn escapes_regex_metacharacters() {
        assert_eq!(regex_escape("[sig-network] a.b"), r"\[sig-network\] a\.b");
    }
}
