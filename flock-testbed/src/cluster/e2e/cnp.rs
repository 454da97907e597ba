//! `cargo xtask cluster e2e --suite cluster-network-policy`: SIG Network's ClusterNetworkPolicy
//! conformance suite (`TestConformance` of `sigs.k8s.io/network-policy-api/conformance`, at
//! [`versions::NETWORK_POLICY_API`]) against the cluster that is up.
//!
//! The suite is upstream's Go test package compiled into a test binary
//! ([`components::network_policy_api`]), its manifests embedded. It runs in the control plane's
//! namespace with the admin kubeconfig as `KUBECONFIG` (the client it execs its probes with
//! reads only that, not `--kubeconfig`), under `test2json` of the same toolchain, whose events
//! give each conformance test's outcome ([`gotest`]). A spec here is one conformance test
//! (`TestConformance/CNP…`): its subtests share the policies and labels they change, so
//! `--focus` and `--skip` (regular expressions of Go's `-test.run`) select whole tests. The
//! tests run one after the other (none is marked parallel upstream).
//!
//! What the suite asks of the cluster, and how the test bed meets it:
//! - the CRD, of the channel [`CNP_CHANNEL`] (`up` installs it before flock; applied again here,
//!   a no-op, for a cluster brought up before it did); the features claimed follow the channel
//!   unless `--features` names others;
//! - agnhost under the tag its manifests pin (read from the module's `conformance/` manifests),
//!   made from the cluster's release as for Kubernetes' suites ([`images::build_named`]);
//! - two schedulable nodes: the 2 hostNetwork replicas of `centaur` bind host ports
//!   34345-34352 and cannot share one; node1 and node2 carry no taint and the control plane
//!   runs no kubelet;
//! - hostNetwork pods in the namespaces it creates: the apiserver's PodSecurity admission runs
//!   without a configuration, so every namespace is `privileged`;
//! - SCTP in the kernel: every house's pods serve SCTP (`agnhost porter`, which exits when the
//!   kernel has none, so that the pods would never become ready and the set-up would fail after
//!   300 s). Where the kernel has none ([`kernel_has_sctp`]; this machine's), porter idles in
//!   the suite's agnhost image ([`images::build_named`]), and the subtests failed on SCTP,
//!   which must fail here, are set aside and listed as not judged ([`set_aside_sctp`]).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::super::deploy::{self, CNP_CHANNEL, CnpChannel};
use super::super::{CONTROL, NODES, images, kube, kubectl, node, pki, proc};
use super::families::{PodFamilies, Pods};
use super::gotest::{self, TestEvent};
use super::junit::{Outcome, Spec};
use crate::components::{self, Built, CNP_CONFORMANCE_PACKAGE};
use crate::{sys, versions};

/// The suite's one top-level test; each conformance test is a subtest of it.
const TOP: &str = "TestConformance";
/// The test binary's own limit (`-test.timeout`): it then panics, naming the test that ran.
/// Beneath the limit of every suite ([`super::LIMIT`]), which kills it.
const TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// What the suite claims the implementation supports: `--features`.
#[derive(Debug, Clone, PartialEq)]
pub enum Features {
    /// The standard features (`ClusterNetworkPolicy`), what an implementation must have: no
    /// flag.
    Standard,
    /// Every feature, the experimental ones too (`--all-features`).
    All,
    /// The standard features and these (`--supported-features=A,B`).
    Listed(String),
}

impl Features {
    /// The features a CRD of channel `channel` has fields for.
    pub fn of_channel(channel: CnpChannel) -> Features {
        match channel {
            CnpChannel::Standard => Features::Standard,
            CnpChannel::Experimental => Features::All,
        }
    }

    /// `--features standard`, `all`, or a comma-separated list of the suite's feature names
    /// (`ClusterNetworkPolicyNamedPorts,ClusterNetworkPolicyEgressNodePeers`).
    pub fn parse(value: &str) -> Result<Features> {
        match value {
            "standard" => Ok(Features::Standard),
            "all" => Ok(Features::All),
            list if !list.is_empty()
                && list
                    .split(',')
                    .all(|f| !f.is_empty() && f.chars().all(|c| c.is_ascii_alphanumeric())) =>
            {
                Ok(Features::Listed(list.to_owned()))
            }
            other => bail!(
                "--features {other:?}: standard, all, or the suite's feature names separated by \
                 commas (ClusterNetworkPolicyNamedPorts,ClusterNetworkPolicyEgressNodePeers)"
            ),
        }
    }

    /// The flags of the test binary that claim them.
    fn flags(&self) -> Vec<String> {
        match self {
            Features::Standard => Vec::new(),
            Features::All => vec!["--all-features".to_owned()],
            Features::Listed(list) => vec![format!("--supported-features={list}")],
        }
    }

    fn describe(&self) -> String {
        match self {
            Features::Standard => "standard".to_owned(),
            Features::All => "all".to_owned(),
            Features::Listed(list) => format!("standard and {list}"),
        }
    }
}

/// What `cargo xtask cluster e2e --suite cluster-network-policy` is told.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--focus`: the conformance tests to run (all unless given).
    pub focus: Option<String>,
    /// `--skip`: conformance tests not to run.
    pub skip: Option<String>,
    /// `--pods`: the address families of the suite's pods.
    pub pods: Pods,
    /// `--features`.
    pub features: Features,
}

/// `-test.run`: the top-level test, narrowed to the conformance tests `focus` matches.
fn run_pattern(focus: Option<&str>) -> String {
    match focus {
        Some(f) => format!("^{TOP}$/{f}"),
        None => format!("^{TOP}$"),
    }
}

/// The images the manifests under `dir` name (`image:` lines of every YAML file in it, at
/// any depth), sorted, each once.
fn manifest_images(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("read {}", d.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("read {}", path.display()))?;
                names.extend(images_in(&text));
            }
        }
    }
    names.sort();
    names.dedup();
    Ok(names)
}

/// The values of the `image:` lines of a manifest (not templated ones).
fn images_in(manifest: &str) -> Vec<String> {
    manifest
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l.strip_prefix("- ").unwrap_or(l);
            let value = l.strip_prefix("image:")?.trim().trim_matches(['"', '\'']);
            (!value.is_empty() && !value.contains("{{")).then(|| value.to_owned())
        })
        .collect()
}

/// Whether the kernel speaks SCTP: an SCTP socket can be made. In the machine's network
/// namespace, which it does not change (a protocol is the kernel's, not a namespace's; the
/// socket is closed at once).
pub fn kernel_has_sctp() -> Result<bool> {
    use nix::errno::Errno;
    use nix::sys::socket::{AddressFamily, SockFlag, SockProtocol, SockType, socket};
    match socket(
        AddressFamily::Inet6,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::Sctp,
    ) {
        Ok(_closed_when_dropped) => Ok(true),
        Err(Errno::EPROTONOSUPPORT | Errno::ESOCKTNOSUPPORT) => Ok(false),
        Err(e) => Err(e).context("socket(AF_INET6, SOCK_STREAM, IPPROTO_SCTP)"),
    }
}

/// `cargo xtask cluster e2e --suite cluster-network-policy …`.
pub fn run(options: &Options) -> Result<()> {
    let sctp = kernel_has_sctp()?;
    if !sctp {
        eprintln!(
            "cluster: e2e: this kernel has no SCTP (CONFIG_IP_SCTP off, or its module missing): \
             the suite's SCTP servers (agnhost porter) idle, and every subtest about SCTP, whose \
             probes cannot work here, is reported as not judged"
        );
    }
    // agnhost (for the suite's image) is a binary of Kubernetes' suites.
    let kube = kube::ensure_built()?.with_e2e()?;
    let suite = components::ensure_all(&[components::network_policy_api()])?
        .pop()
        .context("the suite's build")?;
    kubectl(&["get", "nodes"]).context("the cluster does not answer")?;
    super::super::step("ClusterNetworkPolicy CRD", || {
        deploy::install_cnp_crd(&deploy::cnp_crd()?)
    })?;

    let started = Instant::now();
    let source = components::network_policy_api().source_dir()?;
    let names = manifest_images(&source.join("conformance"))?;
    if names.is_empty() {
        bail!(
            "{} names no image: the suite's manifests moved",
            source.join("conformance").display()
        );
    }
    let archives = super::super::step("cluster-network-policy images", || {
        images::build_named(&kube, &names, sctp)
    })?;
    for n in &NODES {
        for archive in &archives {
            images::import(&kube, &node::containerd_socket(n), archive)
                .with_context(|| format!("import {} on {}", archive.display(), n.name))?;
        }
    }
    let images_took = started.elapsed();

    let report_dir = super::fresh_report_dir()?;
    let events_path = report_dir.join("cnp-events.json");
    let log_path = report_dir.join("cnp.log");
    eprintln!(
        "cluster: e2e: running network-policy-api {}'s TestConformance (features: {}; events: {})",
        versions::NETWORK_POLICY_API,
        options.features.describe(),
        events_path.display()
    );
    let t = Instant::now();
    let sessions_before = crate::cluster::site::router_sessions();
    let families = PodFamilies::set(options.pods)?;
    let status = run_binary(&suite, &report_dir, &events_path, options);
    drop(families);
    let status = status?;
    let suite_took = t.elapsed();
    let restarted = super::sessions_restarted(&sessions_before);

    let text = std::fs::read_to_string(&events_path)
        .with_context(|| format!("read {}", events_path.display()))?;
    let events: Vec<TestEvent> = text.lines().filter_map(gotest::parse_event).collect();
    std::fs::write(&log_path, gotest::output_text(&events))
        .with_context(|| format!("write {}", log_path.display()))?;
    let mut result = gotest::read_events(&events, TOP);
    let unjudged = if sctp {
        Vec::new()
    } else {
        set_aside_sctp(&mut result, &events)
    };

    let mut out = format!(
        "CLUSTER NETWORK POLICY CONFORMANCE (sigs.k8s.io/network-policy-api v{} {TOP}, from \
         {CONTROL}; CRD channel {}; features {}; {} pods{})\n",
        versions::NETWORK_POLICY_API,
        CNP_CHANNEL.name(),
        options.features.describe(),
        options.pods.describe(),
        options
            .focus
            .as_deref()
            .map(|f| format!("; focus {f:?}"))
            .unwrap_or_default(),
    );
    let rows: Vec<Vec<String>> = result
        .specs
        .iter()
        .map(|s| {
            vec![
                match s.outcome {
                    Outcome::Passed => "passed",
                    Outcome::Failed => "FAILED",
                    Outcome::Skipped => "skipped",
                }
                .to_owned(),
                format!("{:.1} s", s.seconds),
                s.name.trim_start_matches(&format!("{TOP}/")).to_owned(),
            ]
        })
        .collect();
    sys::table(&mut out, &["result", "took", "conformance test"], &rows);
    let count = |o: Outcome| result.specs.iter().filter(|s| s.outcome == o).count();
    let (passed, failed, skipped) = (
        count(Outcome::Passed),
        count(Outcome::Failed),
        count(Outcome::Skipped),
    );
    out.push_str(&format!(
        "\n{} conformance tests: {} run, {passed} passed, {failed} failed, {skipped} skipped by \
         the suite (a feature not claimed{})\n",
        result.specs.len(),
        passed + failed,
        if sctp { "" } else { ", or only about SCTP" },
    ));
    if !unjudged.is_empty() {
        out.push_str(&format!(
            "not judged (no SCTP in this kernel; each of these subtests failed, as its SCTP \
             probes must here): {} subtests\n",
            unjudged.len()
        ));
        for u in &unjudged {
            out.push_str(&format!("  {u}\n"));
        }
    }
    super::finish_report(
        &mut out,
        &restarted,
        (images_took, suite_took),
        &format!("its log: {}", log_path.display()),
        &report_dir,
    )?;
    check(&result, status, unjudged.len(), &restarted, &log_path)
}

/// Whether a failed subtest failed on SCTP: it is about SCTP (the suite's say "SCTP protocol"
/// in their names), or every probe that failed it was an SCTP one (`agnhost connect
/// --protocol=sctp`; a subtest of several protocols stops at its first failed probe, so what
/// it would have said of the others is not known).
fn about_sctp(subtest: &Spec) -> bool {
    if subtest.name.contains("SCTP") {
        return true;
    }
    let failure = subtest.failure.as_deref().unwrap_or_default();
    let probes: Vec<&str> = failure
        .lines()
        .filter(|l| l.contains("FAILED Command was"))
        .collect();
    !probes.is_empty() && probes.iter().all(|l| l.contains("--protocol=sctp"))
}

/// Without SCTP in the kernel: takes the failed subtests about SCTP ([`about_sctp`]) out of the
/// judgement. A failed test whose every failed
/// subtest is one of them counts as passed when another subtest passed, else as skipped.
/// Returns the subtests set aside, by test.
fn set_aside_sctp(run: &mut gotest::GoTestRun, events: &[TestEvent]) -> Vec<String> {
    let mut aside = Vec::new();
    for spec in run
        .specs
        .iter_mut()
        .filter(|s| s.outcome == Outcome::Failed)
    {
        let subtests = gotest::read_events(events, &spec.name).specs;
        let failed: Vec<&Spec> = subtests
            .iter()
            .filter(|s| s.outcome == Outcome::Failed)
            .collect();
        if failed.is_empty() || !failed.iter().all(|s| about_sctp(s)) {
            continue;
        }
        aside.extend(
            failed
                .iter()
                .map(|s| s.name.trim_start_matches(&format!("{TOP}/")).to_owned()),
        );
        spec.outcome = if subtests.iter().any(|s| s.outcome == Outcome::Passed) {
            Outcome::Passed
        } else {
            Outcome::Skipped
        };
        spec.failure = None;
    }
    aside
}

/// Fails unless every conformance test that ran passed, one did, the binary exited 0 (or
/// failed only for the `unjudged` subtests set aside) and the router's sessions held; the
/// error says what each failure printed.
fn check(
    run: &gotest::GoTestRun,
    status: bool,
    unjudged: usize,
    restarted: &[String],
    log: &Path,
) -> Result<()> {
    let own_output = || {
        gotest::last_lines(&run.output, 20)
            .map(|t| format!(":\n{t}"))
            .unwrap_or_default()
    };
    if run.specs.is_empty() {
        bail!(
            "no conformance test ran: {TOP} {}{} (the log: {})",
            match run.outcome {
                Some(Outcome::Failed) => "failed in its set-up",
                Some(_) => "ran none (the focus matched nothing?)",
                None => "never ended",
            },
            own_output(),
            log.display()
        );
    }
    let failed: Vec<&Spec> = run
        .specs
        .iter()
        .filter(|s| s.outcome == Outcome::Failed)
        .collect();
    // the binary fails for the subtests set aside too: that alone is no failure
    if !failed.is_empty() || (!status && unjudged == 0) {
        let mut why = String::new();
        for s in &failed {
            let message = s.failure.as_deref().unwrap_or("(no message)");
            let message: Vec<&str> = message.lines().take(12).collect();
            why.push_str(&format!(
                "\n  {}\n      {}",
                s.name,
                message.join("\n      ")
            ));
        }
        if failed.is_empty() {
            why.push_str(&format!("\n  {TOP} itself{}", own_output()));
        }
        if !restarted.is_empty() {
            why.push_str(&format!(
                "\n  and the router's BGP sessions restarted during the suite: {}",
                restarted.join("; ")
            ));
        }
        bail!(
            "{} conformance tests failed (the test binary {}); the failures are in {}{why}",
            failed.len(),
            if status { "exited 0" } else { "failed" },
            log.display()
        );
    }
    if !run.specs.iter().any(|s| s.outcome == Outcome::Passed) {
        bail!(
            "no conformance test passed: every one was skipped (its features not claimed: \
             --features)"
        );
    }
    if !restarted.is_empty() {
        bail!(
            "the router's BGP sessions restarted during the suite ({}): its routes to a node's \
             pods went with them",
            restarted.join("; ")
        );
    }
    Ok(())
}

/// Runs the conformance binary under `test2json` in the control plane's namespace, in the test
/// client's cgroup, its events into `events`; echoes each conformance test's outcome. Returns
/// whether it exited 0.
fn run_binary(suite: &Built, report_dir: &Path, events: &Path, options: &Options) -> Result<bool> {
    let sh = proc::Place::Net(CONTROL.to_owned()).command("sh");
    let mut cmd = super::in_client_cgroup(sh, &suite.tool("test2json"))?;
    cmd.current_dir(report_dir)
        .env("KUBECONFIG", pki::kubeconfig("admin"))
        .env("HOME", report_dir)
        .args(["-t", "-p", CNP_CONFORMANCE_PACKAGE])
        .arg(suite.tool("conformance.test"))
        .arg("-test.v=test2json")
        .arg(format!(
            "-test.run={}",
            run_pattern(options.focus.as_deref())
        ))
        .arg(format!("-test.timeout={}s", TIMEOUT.as_secs()));
    if let Some(skip) = &options.skip {
        cmd.arg(format!("-test.skip=^{TOP}$/{skip}"));
    }
    cmd.args(options.features.flags());
    let prefix = format!("{TOP}/");
    super::stream_suite(
        cmd,
        "the conformance suite",
        events,
        &report_dir.join("cnp.stderr.log"),
        |line| {
            let Some(e) = gotest::parse_event(line) else {
                return;
            };
            let Some(test) = e.test.as_deref().and_then(|t| t.strip_prefix(&prefix)) else {
                return;
            };
            if !test.contains('/') && matches!(e.action.as_str(), "pass" | "fail" | "skip") {
                eprintln!(
                    "cluster: e2e: {} {test} ({:.1} s)",
                    e.action.to_uppercase(),
                    e.elapsed.unwrap_or(0.0)
                );
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(name: &str, failure: &str) -> Spec {
        Spec {
            name: name.to_owned(),
            outcome: Outcome::Failed,
            seconds: 1.0,
            failure: Some(failure.to_owned()),
        }
    }

    /// As the suite prints them (2026-11-26, a kernel without SCTP).
    #[test]
    fn a_subtest_failed_on_sctp_is_told_from_one_failed_on_another_protocol() {
        let sctp = "helper.go:71: FAILED Command was [/agnhost connect --timeout=3s \
                    --protocol=sctp [2001:db8:c2::7d7b]:9003]\n\
                    helper.go:71: Expected connection to be dropped ... OTHER: protocol not supported\n";
        let tcp = "helper.go:71: FAILED Command was [/agnhost connect --timeout=3s \
                   --protocol=tcp [2001:db8:c2::7d7b]:80]\n";
        assert!(about_sctp(&failed(
            "TestConformance/CNPAdminTierEgressInlineCIDRPeers/Should_deny",
            sctp
        )));
        assert!(about_sctp(&failed(
            "TestConformance/CNPAdminTierEgressSCTP/Should_support_an_'allow-egress'_policy_for_SCTP_protocol",
            ""
        )));
        assert!(!about_sctp(&failed(
            "TestConformance/CNPX/y",
            &format!("{sctp}{tcp}")
        )));
        assert!(!about_sctp(&failed(
            "TestConformance/CNPX/y",
            "Error: no probe at all"
        )));
    }

    #[test]
    fn features_follow_the_channel_unless_named() {
        assert_eq!(
            Features::of_channel(CnpChannel::Standard),
            Features::Standard
        );
        assert_eq!(
            Features::of_channel(CnpChannel::Experimental),
            Features::All
        );
        assert!(Features::Standard.flags().is_empty());
        assert_eq!(Features::parse("all").unwrap().flags(), ["--all-features"]);
        assert_eq!(
            Features::parse("ClusterNetworkPolicyNamedPorts")
                .unwrap()
                .flags(),
            ["--supported-features=ClusterNetworkPolicyNamedPorts"]
        );
        for bad in ["", "a,,b", "Named Ports", "x;y"] {
            assert!(Features::parse(bad).is_err(), "{bad:?}");
        }
    }

    fn spec(name: &str, outcome: Outcome, failure: Option<&str>) -> Spec {
        Spec {
            name: format!("{TOP}/{name}"),
            outcome,
            seconds: 1.0,
            failure: failure.map(str::to_owned),
        }
    }

    #[test]
    fn a_run_passes_only_with_a_test_passed_and_none_failed() {
        let log = Path::new("/run/flockcluster/e2e/cnp.log");
        let run = |specs: Vec<Spec>, outcome| gotest::GoTestRun {
            specs,
            outcome: Some(outcome),
            output: "    suite.go:158: Test Setup: Applying base manifests\n".to_owned(),
        };
        let passed = run(
            vec![
                spec("CNPAdminTierEgressTCP", Outcome::Passed, None),
                spec("CNPAdminTierEgressNamedPort", Outcome::Skipped, None),
            ],
            Outcome::Passed,
        );
        check(&passed, true, 0, &[], log).unwrap();
        let err = check(&passed, true, 0, &["node2: up before".to_owned()], log).unwrap_err();
        assert!(err.to_string().contains("BGP sessions restarted"), "{err}");

        let failed = run(
            vec![spec(
                "CNPAdminTierEgressTCP",
                Outcome::Failed,
                Some("Should_deny:\n    Error: Condition never satisfied"),
            )],
            Outcome::Failed,
        );
        let err = check(&failed, false, 0, &[], log).unwrap_err().to_string();
        assert!(err.starts_with("1 conformance tests failed"), "{err}");
        assert!(
            err.contains("TestConformance/CNPAdminTierEgressTCP\n      Should_deny:"),
            "{err}"
        );

        let set_up = run(Vec::new(), Outcome::Failed);
        let err = check(&set_up, false, 0, &[], log).unwrap_err().to_string();
        assert!(
            err.contains("failed in its set-up:\n    suite.go:158"),
            "{err}"
        );

        let skipped = run(
            vec![spec("CNPAdminTierEgressNamedPort", Outcome::Skipped, None)],
            Outcome::Passed,
        );
        assert!(check(&skipped, true, 0, &[], log).is_err());

        // the binary failed only for SCTP subtests set aside: a pass; with none set aside, not
        let sctp_only = run(
            vec![spec("CNPAdminTierGress", Outcome::Passed, None)],
            Outcome::Failed,
        );
        check(&sctp_only, false, 6, &[], log).unwrap();
        assert!(check(&sctp_only, false, 0, &[], log).is_err());
    }

    #[test]
    fn the_kernel_answers_whether_it_speaks_sctp() {
        // Either answer, but an answer: no other error of socket(2).
        kernel_has_sctp().unwrap();
    }

    #[test]
    fn focus_narrows_the_top_level_test() {
        assert_eq!(run_pattern(None), "^TestConformance$");
        assert_eq!(
            run_pattern(Some("CNPAdminTier(Egress|Ingress)TCP")),
            "^TestConformance$/CNPAdminTier(Egress|Ingress)TCP"
        );
    }

    #[test]
    fn images_are_the_manifests_image_lines() {
        let manifest = "spec:\n  containers:\n    - name: a-client\n      image: registry.k8s.io/e2e-test-images/agnhost:2.45\n    - image: \"registry.k8s.io/e2e-test-images/agnhost:2.45\"\n      name: b\n    - name: c\n      image: {{ .Image }}\n# image: not/this\n";
        assert_eq!(
            images_in(manifest),
            [
                "registry.k8s.io/e2e-test-images/agnhost:2.45",
                "registry.k8s.io/e2e-test-images/agnhost:2.45"
            ]
        );
    }
}
