//! A Go test binary's results, read back from its test events: the JSON lines `test2json`
//! writes (what `go test -json` prints), one event per line with `Action` (`run`, `output`,
//! `pass`, `fail`, `skip` …), `Test` (`TestConformance/CNPAdminTierEgressTCP`, subtests
//! joined by `/`, spaces as `_`), `Elapsed` and `Output`. The binary runs with
//! `-test.v=test2json`, which marks each of its framing lines (`=== RUN`, `--- FAIL:` …), so
//! that a test's own output can never pass for one.
//!
//! network-policy-api's conformance suite is one Go test, `TestConformance`, with one subtest
//! per conformance test (`CNP…`), each with its own subtests (`Should_…`) that share the
//! policies and labels they change: a spec here is a subtest of the top-level test.

use std::collections::BTreeMap;

use super::junit::{Outcome, Spec};

/// One test event.
#[derive(Debug, Clone, PartialEq)]
pub struct TestEvent {
    /// `start`, `run`, `pause`, `cont`, `pass`, `fail`, `skip`, `output`, `bench`.
    pub action: String,
    /// The test it is about (none: the binary as a whole).
    pub test: Option<String>,
    /// For `pass` and `fail`: how long the test ran, in seconds.
    pub elapsed: Option<f64>,
    /// For `output`: what the test printed (a line, or part of one).
    pub output: Option<String>,
}

/// Parses one line of `test2json`'s output; `None` for a line that is no event.
pub fn parse_event(line: &str) -> Option<TestEvent> {
    let value: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
    let text = |key: &str| value.get(key)?.as_str().map(str::to_owned);
    Some(TestEvent {
        action: text("Action")?,
        test: text("Test"),
        elapsed: value.get("Elapsed").and_then(serde_json::Value::as_f64),
        output: text("Output"),
    })
}

/// What one run of a test with subtests came to.
#[derive(Debug, Clone, PartialEq)]
pub struct GoTestRun {
    /// Each direct subtest of the test, in the order they started; a failed one's `failure`
    /// holds what its failed subtests (or it itself) printed, a subtest that never ended (the
    /// binary killed, or a panic) counts as failed.
    pub specs: Vec<Spec>,
    /// How the test itself ended; `None` if it never did (or never ran).
    pub outcome: Option<Outcome>,
    /// What the test printed outside its subtests (its set-up, a timeout's panic).
    pub output: String,
}

/// Whether `line` is one of `go test -v`'s framing lines rather than a test's own output.
fn is_framing(line: &str) -> bool {
    let line = line.trim_start();
    [
        "=== RUN",
        "=== PAUSE",
        "=== CONT",
        "=== NAME",
        "--- PASS",
        "--- FAIL",
        "--- SKIP",
    ]
    .iter()
    .any(|p| line.starts_with(p))
}

/// One test as the events tell it.
#[derive(Default)]
struct Seen {
    /// When it started, as the index of its first event.
    first: usize,
    outcome: Option<Outcome>,
    elapsed: f64,
    output: String,
}

/// Reads the events of a run back into the direct subtests of `parent` (`TestConformance`).
pub fn read_events(events: &[TestEvent], parent: &str) -> GoTestRun {
    let mut tests: BTreeMap<&str, Seen> = BTreeMap::new();
    for (i, e) in events.iter().enumerate() {
        let Some(name) = e.test.as_deref() else {
            continue;
        };
        let seen = tests.entry(name).or_insert_with(|| Seen {
            first: i,
            ..Seen::default()
        });
        match e.action.as_str() {
            "pass" => seen.outcome = Some(Outcome::Passed),
            "fail" => seen.outcome = Some(Outcome::Failed),
            "skip" => seen.outcome = Some(Outcome::Skipped),
            "output" => {
                let text = e.output.as_deref().unwrap_or("");
                if !is_framing(text) {
                    seen.output.push_str(text);
                }
            }
            _ => {}
        }
        if let Some(elapsed) = e.elapsed {
            seen.elapsed = elapsed;
        }
    }
    let prefix = format!("{parent}/");
    let mut children: Vec<(&str, &Seen)> = tests
        .iter()
        .filter(|(name, _)| {
            name.strip_prefix(&prefix)
                .is_some_and(|rest| !rest.contains('/'))
        })
        .map(|(name, seen)| (*name, seen))
        .collect();
    children.sort_by_key(|(_, seen)| seen.first);
    let specs = children
        .into_iter()
        .map(|(name, seen)| {
            let outcome = seen.outcome.unwrap_or(Outcome::Failed);
            let failure = (outcome == Outcome::Failed).then(|| match seen.outcome {
                None => format!(
                    "did not end (the test binary was killed or panicked){}",
                    last_lines(&seen.output, 20)
                        .map(|t| format!(":\n{t}"))
                        .unwrap_or_default()
                ),
                Some(_) => failures_under(&tests, name),
            });
            Spec {
                name: name.to_owned(),
                outcome,
                seconds: seen.elapsed,
                failure,
            }
        })
        .collect();
    let (outcome, output) = tests.get(parent).map_or((None, String::new()), |seen| {
        (seen.outcome, seen.output.clone())
    });
    GoTestRun {
        specs,
        outcome,
        output,
    }
}

/// What the failed tests under `name` (or it itself, when none of its subtests failed)
/// printed: each failed leaf's name below `name`, then its output.
fn failures_under(tests: &BTreeMap<&str, Seen>, name: &str) -> String {
    let below = format!("{name}/");
    let failed = |t: &str| {
        tests
            .get(t)
            .is_some_and(|s| s.outcome == Some(Outcome::Failed))
    };
    let mut out = String::new();
    let leaves = tests.keys().filter(|t| {
        (**t == name || t.starts_with(&below))
            && failed(t)
            && !tests
                .keys()
                .any(|u| u.starts_with(&format!("{t}/")) && failed(u))
    });
    for leaf in leaves {
        if let Some(seen) = tests.get(leaf) {
            if !out.is_empty() {
                out.push('\n');
            }
            if *leaf != name {
                out.push_str(leaf.strip_prefix(&below).unwrap_or(leaf));
                out.push_str(":\n");
            }
            out.push_str(seen.output.trim_end());
        }
    }
    out
}

/// The last `n` lines of `text`, if it has any.
pub fn last_lines(text: &str, n: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    (!lines.is_empty()).then(|| lines[lines.len().saturating_sub(n)..].join("\n"))
}

/// The test's output as `go test -v` printed it: every `output` event, in order.
pub fn output_text(events: &[TestEvent]) -> String {
    events
        .iter()
        .filter(|e| e.action == "output")
        .filter_map(|e| e.output.as_deref())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `test2json -t -p sigs.k8s.io/network-policy-api/conformance conformance.test
    /// -test.v=test2json -test.run '^TestConformance$'` prints for a run with a passed, a
    /// failed (one subtest of two) and a skipped conformance test, the time stamps left out.
    const RUN: &str = r#"{"Action":"start","Package":"sigs.k8s.io/network-policy-api/conformance"}
{"Action":"run","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance"}
{"Action":"output","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance","Output":"=== RUN   TestConformance\n"}
{"Action":"output","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance","Output":"    conformance_test.go:62: Running conformance tests with cleanup: true\n"}
{"Action":"output","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance","Output":"    suite.go:158: Test Setup: Applying base manifests\n"}
{"Action":"run","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressSCTP"}
{"Action":"output","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressSCTP","Output":"=== RUN   TestConformance/CNPAdminTierEgressSCTP\n"}
{"Action":"output","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressSCTP","Output":"    suite.go:232: Applying base/admin_tier/standard-egress-sctp-rules.yaml\n"}
{"Action":"run","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressSCTP/Should_support_an_'allow-egress'_policy_for_SCTP_protocol;_ensure_rule_ordering_is_respected"}
{"Action":"output","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressSCTP/Should_support_an_'allow-egress'_policy_for_SCTP_protocol;_ensure_rule_ordering_is_respected","Output":"=== RUN   TestConformance/CNPAdminTierEgressSCTP/Should_support_an_'allow-egress'_policy_for_SCTP_protocol;_ensure_rule_ordering_is_respected\n"}
{"Action":"output","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressSCTP/Should_support_an_'allow-egress'_policy_for_SCTP_protocol;_ensure_rule_ordering_is_respected","Output":"--- PASS: TestConformance/CNPAdminTierEgressSCTP/Should_support_an_'allow-egress'_policy_for_SCTP_protocol;_ensure_rule_ordering_is_respected (0.92s)\n"}
{"Action":"pass","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressSCTP/Should_support_an_'allow-egress'_policy_for_SCTP_protocol;_ensure_rule_ordering_is_respected","Elapsed":0.92}
{"Action":"output","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressSCTP","Output":"--- PASS: TestConformance/CNPAdminTierEgressSCTP (4.51s)\n"}
{"Action":"pass","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressSCTP","Elapsed":4.51}
{"Action":"run","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressTCP"}
{"Action":"output","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressTCP","Output":"=== RUN   TestConformance/CNPAdminTierEgressTCP\n"}
{"Action":"run","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressTCP/Should_support_an_'allow-egress'_policy_for_TCP_protocol"}
{"Action":"output","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressTCP/Should_support_an_'allow-egress'_policy_for_TCP_protocol","Output":"--- PASS: TestConformance/CNPAdminTierEgressTCP/Should_support_an_'allow-egress'_policy_for_TCP_protocol (1.20s)\n"}
{"Action":"pass","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressTCP/Should_support_an_'allow-egress'_policy_for_TCP_protocol","Elapsed":1.2}
{"Action":"run","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressTCP/Should_support_a_'deny-egress'_policy_for_TCP_protocol"}
{"Action":"output","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressTCP/Should_support_a_'deny-egress'_policy_for_TCP_protocol","Output":"    helper.go:73: \n"}
{"Action":"output","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressTCP/Should_support_a_'deny-egress'_policy_for_TCP_protocol","Output":"        \tError:      \tCondition never satisfied\n"}
{"Action":"output","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressTCP/Should_support_a_'deny-egress'_policy_for_TCP_protocol","Output":"    --- FAIL: TestConformance/CNPAdminTierEgressTCP/Should_support_a_'deny-egress'_policy_for_TCP_protocol (10.50s)\n"}
{"Action":"fail","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressTCP/Should_support_a_'deny-egress'_policy_for_TCP_protocol","Elapsed":10.5}
{"Action":"output","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressTCP","Output":"--- FAIL: TestConformance/CNPAdminTierEgressTCP (12.00s)\n"}
{"Action":"fail","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressTCP","Elapsed":12}
{"Action":"run","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressNamedPort"}
{"Action":"output","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressNamedPort","Output":"    suite.go:220: Skipping CNPAdminTierEgressNamedPort: suite does not support ClusterNetworkPolicyNamedPorts\n"}
{"Action":"output","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressNamedPort","Output":"--- SKIP: TestConformance/CNPAdminTierEgressNamedPort (0.00s)\n"}
{"Action":"skip","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance/CNPAdminTierEgressNamedPort","Elapsed":0}
{"Action":"output","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance","Output":"--- FAIL: TestConformance (20.00s)\n"}
{"Action":"fail","Package":"sigs.k8s.io/network-policy-api/conformance","Test":"TestConformance","Elapsed":20}
{"Action":"output","Package":"sigs.k8s.io/network-policy-api/conformance","Output":"FAIL\n"}
{"Action":"fail","Package":"sigs.k8s.io/network-policy-api/conformance","Elapsed":20.1}
"#;

    fn events(text: &str) -> Vec<TestEvent> {
        text.lines().filter_map(parse_event).collect()
    }

    #[test]
    fn subtests_of_the_top_level_test_are_the_specs() {
        let run = read_events(&events(RUN), "TestConformance");
        let names: Vec<&str> = run.specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "TestConformance/CNPAdminTierEgressSCTP",
                "TestConformance/CNPAdminTierEgressTCP",
                "TestConformance/CNPAdminTierEgressNamedPort"
            ]
        );
        let outcomes: Vec<Outcome> = run.specs.iter().map(|s| s.outcome).collect();
        assert_eq!(
            outcomes,
            [Outcome::Passed, Outcome::Failed, Outcome::Skipped]
        );
        assert_eq!(run.specs[0].seconds, 4.51);
        assert_eq!(run.specs[0].failure, None);
        assert_eq!(run.outcome, Some(Outcome::Failed));
        // The parent's own output: its set-up, without the framing lines.
        assert!(run.output.contains("Test Setup: Applying base manifests"));
        assert!(!run.output.contains("=== RUN") && !run.output.contains("--- FAIL"));
    }

    #[test]
    fn a_failure_names_the_failed_subtest_and_what_it_printed() {
        let run = read_events(&events(RUN), "TestConformance");
        let failure = run.specs[1].failure.as_deref().unwrap();
        assert!(
            failure.starts_with("Should_support_a_'deny-egress'_policy_for_TCP_protocol:\n"),
            "{failure}"
        );
        assert!(
            failure.contains("Error:      \tCondition never satisfied"),
            "{failure}"
        );
        // The passed subtest and the framing lines are left out.
        assert!(!failure.contains("allow-egress") && !failure.contains("--- FAIL"));
    }

    #[test]
    fn a_test_that_never_ended_failed() {
        // The binary killed in the middle of a test: no pass or fail for it or its parent.
        let cut: String = RUN.lines().take(8).map(|l| format!("{l}\n")).collect();
        let run = read_events(&events(&cut), "TestConformance");
        assert_eq!(run.specs.len(), 1);
        assert_eq!(run.specs[0].outcome, Outcome::Failed);
        let failure = run.specs[0].failure.as_deref().unwrap();
        assert!(failure.starts_with("did not end"), "{failure}");
        assert!(failure.contains("Applying base/admin_tier"), "{failure}");
        assert_eq!(run.outcome, None);
    }

    #[test]
    fn a_timeout_fails_the_running_test_with_the_panic() {
        // What `-test.timeout` does (as test2json of Go 1.26 reports it): the running subtest
        // gets the panic as its output and a `fail`; its parent never ends.
        let text = r#"{"Action":"run","Test":"TestConformance"}
{"Action":"run","Test":"TestConformance/CNPAdminTierGress"}
{"Action":"output","Test":"TestConformance/CNPAdminTierGress","Output":"=== RUN   TestConformance/CNPAdminTierGress\n"}
{"Action":"output","Test":"TestConformance/CNPAdminTierGress","Output":"panic: test timed out after 30m0s\n"}
{"Action":"output","Test":"TestConformance/CNPAdminTierGress","Output":"\trunning tests:\n"}
{"Action":"output","Test":"TestConformance/CNPAdminTierGress","Output":"\t\tTestConformance/CNPAdminTierGress (2m0s)\n"}
{"Action":"fail","Test":"TestConformance/CNPAdminTierGress"}
"#;
        let run = read_events(&events(text), "TestConformance");
        assert_eq!(run.outcome, None);
        assert_eq!(run.specs[0].outcome, Outcome::Failed);
        assert_eq!(run.specs[0].seconds, 0.0);
        let failure = run.specs[0].failure.as_deref().unwrap();
        assert!(
            failure.starts_with("panic: test timed out after 30m0s\n"),
            "{failure}"
        );
    }

    #[test]
    fn a_failed_set_up_fails_the_parent_with_no_spec() {
        let text = r#"{"Action":"run","Test":"TestConformance"}
{"Action":"output","Test":"TestConformance","Output":"    helper.go:140: timed out waiting for pods of centaur to be ready\n"}
{"Action":"output","Test":"TestConformance","Output":"--- FAIL: TestConformance (300.01s)\n"}
{"Action":"fail","Test":"TestConformance","Elapsed":300.01}
not an event
"#;
        let run = read_events(&events(text), "TestConformance");
        assert!(run.specs.is_empty());
        assert_eq!(run.outcome, Some(Outcome::Failed));
        assert_eq!(
            last_lines(&run.output, 5).as_deref(),
            Some("    helper.go:140: timed out waiting for pods of centaur to be ready")
        );
    }

    #[test]
    fn events_and_the_text_they_carry() {
        let e = parse_event(
            r#"{"Time":"2026-11-26T11:00:00Z","Action":"pass","Test":"T","Elapsed":1.5}"#,
        )
        .unwrap();
        assert_eq!(
            e,
            TestEvent {
                action: "pass".into(),
                test: Some("T".into()),
                elapsed: Some(1.5),
                output: None
            }
        );
        assert_eq!(parse_event("PASS"), None);
        assert_eq!(parse_event(r#"{"Test":"T"}"#), None);
        let text = output_text(&events(RUN));
        assert!(text.starts_with("=== RUN   TestConformance\n"));
        assert!(text.ends_with("--- FAIL: TestConformance (20.00s)\nFAIL\n"));
    }
}
