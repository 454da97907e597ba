//! The schedule, driven by hand and by proptest with no clock, lock or kernel: the steps a
//! follow plans are the steps a rebuild plans, no generation is reported applied before its
//! apply, the back-off is bounded and starts again after a success.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use flock_policy::Model;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use proptest::prelude::*;
use serde_json::json;

use super::super::convert::{self, ClusterPod};
use super::super::nft::NftError;
use super::super::view::LocalPod;
use super::*;

const NS: &str = "shop";
const APPS: [&str; 3] = ["a", "b", "c"];

fn key(name: &str) -> ObjectKey {
    (NS.to_owned(), name.to_owned())
}

fn addr(i: u8) -> IpAddr {
    IpAddr::V6(
        format!("2001:db8:1::{:x}", u16::from(i) + 1)
            .parse()
            .expect("v6"),
    )
}

/// Policy `variant`: pods of app `a` (or `b`) admit app `b` (or `c`), or egress to a CIDR.
fn policy(variant: u8) -> flock_policy::Policy {
    let (selected, peer) = (
        APPS[usize::from(variant % 2)],
        APPS[usize::from(variant % 2) + 1],
    );
    let spec = if variant < 2 {
        json!({ "podSelector": { "matchLabels": { "app": selected } },
                "ingress": [{ "from": [{ "podSelector": { "matchLabels": { "app": peer } } }] }] })
    } else {
        json!({ "podSelector": { "matchLabels": { "app": selected } }, "policyTypes": ["Egress"],
                "egress": [{ "to": [{ "ipBlock": { "cidr": "2001:db8:9::/48" } }] }] })
    };
    let np: NetworkPolicy = serde_json::from_value(json!({
        "metadata": { "namespace": NS, "name": format!("p{variant}") },
        "spec": spec,
    }))
    .expect("NetworkPolicy");
    convert::policy(&np).expect("valid policy")
}

fn labels(app: usize) -> flock_policy::Labels {
    [("app".to_owned(), APPS[app].to_owned())].into()
}

/// A schedule whose four caches have finished their first listing with one policy.
fn synced() -> Schedule {
    let mut s = Schedule::default();
    s.change(|v| {
        v.policies.init();
        v.policies.init_apply(key("p0"), Some(policy(0)));
        v.namespaces.init();
        v.namespaces
            .init_apply((String::new(), NS.to_owned()), Some(Default::default()));
        v.pods.init();
        v.cluster_policies.init();
        v.policies.init_done()
            | v.namespaces.init_done()
            | v.pods.init_done()
            | v.cluster_policies.init_done()
    });
    s
}

/// One change of the view, as the watches and the node's ADDs and DELs make them.
#[derive(Debug, Clone)]
enum Change {
    /// A cluster pod `i` appears or changes (app, address).
    ClusterPod { i: u8, app: usize },
    /// Cluster pod `i` goes.
    ClusterPodGone { i: u8 },
    /// A local pod on host veth `i` (ADD), named like cluster pod `i`.
    Local { i: u8, app: usize },
    /// The local pod on host veth `i` goes (DEL).
    LocalGone { i: u8 },
    /// Policy `variant` is set or removed: the model takes it in place.
    Policy { variant: u8, present: bool },
}

fn apply_change(s: &mut Schedule, change: &Change) -> u64 {
    match *change {
        Change::ClusterPod { i, app } => s.set_cluster_pod(
            key(&format!("pod{i}")),
            Some(ClusterPod {
                labels: Arc::new(labels(app)),
                addresses: vec![addr(i)],
                ..ClusterPod::default()
            }),
        ),
        Change::ClusterPodGone { i } => s.set_cluster_pod(key(&format!("pod{i}")), None),
        Change::Local { i, app } => s.set_local(
            format!("flock0000000{i}"),
            LocalPod {
                key: key(&format!("pod{i}")),
                uid: String::new(),
                addresses: vec![addr(i + 100)],
                labels: labels(app),
                ports: vec![],
            },
        ),
        Change::LocalGone { i } => s.remove_local(&format!("flock0000000{i}")),
        Change::Policy { variant, present } => s.change_rules(|v| {
            v.policies.set(
                key(&format!("p{variant}")),
                present.then(|| policy(variant)),
            )
        }),
    }
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        4 => (0u8..6, 0usize..3).prop_map(|(i, app)| Change::ClusterPod { i, app }),
        2 => (0u8..6).prop_map(|i| Change::ClusterPodGone { i }),
        4 => (0u8..4, 0usize..3).prop_map(|(i, app)| Change::Local { i, app }),
        2 => (0u8..4).prop_map(|i| Change::LocalGone { i }),
        1 => (0u8..4, any::<bool>()).prop_map(|(variant, present)| Change::Policy { variant, present }),
    ]
}

/// The model a rebuild from the view as it is now gives.
fn rebuilt(s: &Schedule) -> Model {
    let inputs = s.view().inputs();
    Model::new(&inputs.policies, &inputs.namespaces, &inputs.pods).expect("model")
}

fn refused() -> ApplyError {
    NftError::Injected("refused".into()).into()
}

/// Hands out, plans and reports works until the schedule has nothing to do at `now`;
/// returns the steps applied.
fn drain(s: &mut Schedule, now: Instant) -> Vec<Step> {
    let mut steps = Vec::new();
    while let Some(work) = s.next_work(now) {
        let generation = work.generation();
        match work.plan() {
            Ok(planned) => {
                steps.push(planned.step().clone());
                s.applied(planned, SystemTime::UNIX_EPOCH);
            }
            Err(PlanError::CannotFollow) => s.cannot_follow(generation),
            Err(PlanError::Failed(e)) => panic!("plan failed: {e}"),
        }
    }
    steps
}

#[test]
fn nothing_is_handed_out_before_every_cache_is_listed() {
    let mut s = Schedule::default();
    let now = Instant::now();
    let g = apply_change(&mut s, &Change::Local { i: 0, app: 0 });
    assert_eq!(g, 1);
    s.change(|v| v.policies.init_done() | v.namespaces.init_done());
    assert!(s.next_work(now).is_none(), "pods not listed yet");
    s.change(|v| v.pods.init_done());
    assert!(
        s.next_work(now).is_none(),
        "cluster policies not listed yet"
    );
    s.change(|v| v.cluster_policies.init_done());
    let work = s.next_work(now).expect("synced: work");
    assert!(s.next_work(now).is_none(), "one work at a time");
    let planned = work.plan().expect("plan");
    assert!(
        matches!(planned.step(), Step::Full(_)),
        "the first apply replaces the table"
    );
    assert_eq!(s.progress().applied, 0, "not applied before it is reported");
    s.applied(planned, SystemTime::UNIX_EPOCH);
    assert_eq!(s.progress().applied, s.generation());
    assert_eq!(s.ruleset(), Some(rebuilt(&s).ruleset()));
    assert!(s.next_work(now).is_none(), "nothing left");
}

#[test]
fn a_failure_is_retried_after_a_doubling_bounded_backoff_that_a_success_resets() {
    let mut s = synced();
    let t0 = Instant::now();
    let mut now = t0;
    let mut expected = FIRST_RETRY;
    for _ in 0..10 {
        let work = s.next_work(now).expect("due");
        let generation = work.generation();
        let delay = s.failed(generation, refused(), now);
        assert_eq!(delay, expected);
        assert_eq!(s.retry_at(), Some(now + delay));
        assert!(
            s.next_work(now + delay - Duration::from_millis(1))
                .is_none()
        );
        now += delay;
        expected = (expected * 2).min(MAX_RETRY);
    }
    assert_eq!(expected, MAX_RETRY, "bounded");
    // a newer change is tried at once, back-off or not
    let generation = s.next_work(now).expect("due").generation();
    s.failed(generation, refused(), now);
    apply_change(&mut s, &Change::Local { i: 1, app: 0 });
    assert_eq!(s.retry_at(), None);
    let work = s.next_work(now).expect("a newer change is due at once");
    let planned = work.plan().expect("plan");
    assert!(
        matches!(planned.step(), Step::Full(_)),
        "after a failure the table is unknown"
    );
    s.applied(planned, SystemTime::UNIX_EPOCH);
    apply_change(&mut s, &Change::Local { i: 2, app: 0 });
    let work = s.next_work(now).expect("due");
    assert_eq!(
        s.failed(work.generation(), refused(), now),
        FIRST_RETRY,
        "reset by the success"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Whatever the pod changes between two applies, the step a follow plans is the one a
    /// rebuild of the same view plans from the ruleset in the kernel, and leaves the same
    /// model: the incremental path leaves the table a rebuild leaves.
    #[test]
    fn a_follow_plans_what_a_rebuild_plans(
        batches in proptest::collection::vec(proptest::collection::vec(change(), 1..6), 1..12)
    ) {
        let mut s = synced();
        let now = Instant::now();
        drain(&mut s, now);
        for batch in &batches {
            for c in batch {
                apply_change(&mut s, c);
            }
            let kernel = s.ruleset().cloned();
            let rebuild = rebuilt(&s);
            let Some(work) = s.next_work(now) else {
                prop_assert_eq!(
                    kernel.as_ref().map(Ruleset::canonical),
                    Some(rebuild.ruleset().canonical())
                );
                continue;
            };
            let followed = matches!(work.kind, WorkKind::Follow { .. });
            let generation = work.generation();
            match work.plan() {
                Ok(planned) => {
                    if followed {
                        let by_diff = plan::next_step(kernel.as_ref(), planned.ruleset());
                        prop_assert_eq!(planned.step(), &by_diff);
                    }
                    prop_assert_eq!(planned.ruleset().canonical(), rebuild.ruleset().canonical());
                    s.applied(planned, SystemTime::UNIX_EPOCH);
                }
                Err(PlanError::CannotFollow) => {
                    s.cannot_follow(generation);
                    drain(&mut s, now);
                }
                Err(PlanError::Failed(e)) => prop_assert!(false, "plan failed: {e}"),
            }
            prop_assert_eq!(
                s.ruleset().map(Ruleset::canonical),
                Some(rebuild.ruleset().canonical())
            );
            prop_assert_eq!(s.progress().applied, s.generation());
        }
    }

    /// Changes, hand-outs, successes, failures and time in any order: the applied generation
    /// is always one whose work was reported applied, never newer; one work is out at a time;
    /// and once the failures stop, everything gets applied.
    #[test]
    fn no_generation_is_applied_before_its_apply(
        ops in proptest::collection::vec(
            prop_oneof![
                3 => change().prop_map(Some),
                2 => Just(None),
            ],
            1..60,
        ),
        outcomes in proptest::collection::vec(any::<bool>(), 60),
    ) {
        let mut s = synced();
        let mut now = Instant::now();
        let mut out: Option<Planned> = None;
        let mut reported_applied = 0u64;
        let mut outcome = outcomes.iter().cycle();
        for op in &ops {
            match op {
                Some(c) => {
                    apply_change(&mut s, c);
                }
                // a turn of the task: finish the work out, if any, else take one
                None => match out.take() {
                    Some(planned) => {
                        let generation = planned.generation();
                        if *outcome.next().expect("cycle") {
                            s.applied(planned, SystemTime::UNIX_EPOCH);
                            reported_applied = generation;
                        } else {
                            let delay = s.failed(generation, refused(), now);
                            prop_assert!(delay <= MAX_RETRY);
                        }
                    }
                    None => {
                        if let Some(work) = s.next_work(now) {
                            prop_assert!(s.next_work(now).is_none(), "two works out");
                            let generation = work.generation();
                            match work.plan() {
                                Ok(planned) => out = Some(planned),
                                Err(PlanError::CannotFollow) => s.cannot_follow(generation),
                                Err(PlanError::Failed(e)) => prop_assert!(false, "{e}"),
                            }
                        }
                    }
                },
            }
            prop_assert_eq!(s.progress().applied, reported_applied);
            now += Duration::from_millis(700);
        }
        if let Some(planned) = out.take() {
            s.applied(planned, SystemTime::UNIX_EPOCH);
        }
        drain(&mut s, now + MAX_RETRY);
        prop_assert_eq!(s.progress().applied, s.generation());
        let rebuild = rebuilt(&s);
        prop_assert_eq!(
            s.ruleset().map(Ruleset::canonical),
            Some(rebuild.ruleset().canonical())
        );
    }
}

/// After a policy change taken in place, a pod joining a selector is still followed: the
/// step is its element, not a rebuild (the model holds the pods it follows).
#[test]
fn after_a_policy_change_a_label_change_is_still_an_element() {
    let mut s = synced();
    let now = Instant::now();
    apply_change(&mut s, &Change::Local { i: 0, app: 0 });
    apply_change(&mut s, &Change::ClusterPod { i: 1, app: 2 });
    drain(&mut s, now);
    apply_change(
        &mut s,
        &Change::Policy {
            variant: 2,
            present: true,
        },
    );
    let steps = drain(&mut s, now);
    assert_eq!(steps.len(), 1, "{steps:?}");
    for app in [1, 2, 1] {
        apply_change(&mut s, &Change::ClusterPod { i: 1, app });
        let work = s.next_work(now).expect("a work");
        assert!(matches!(work.kind, WorkKind::Follow { .. }));
        let planned = work.plan().expect("followed, not rebuilt");
        assert_eq!(planned.step().kind(), "elements", "{:?}", planned.step());
        s.applied(planned, SystemTime::UNIX_EPOCH);
    }
}
