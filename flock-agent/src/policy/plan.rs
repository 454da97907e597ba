//! What one apply does: nothing, set elements only, or the whole table. Pure.

use flock_policy::{REMOVE_SCRIPT, Ruleset};

/// One `nft -f` transaction, or none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The kernel already holds this ruleset.
    Nothing,
    /// Only selector membership changed: set-element deletes and adds.
    Elements(String),
    /// Replace the whole table (or, for an empty model, remove it: [`REMOVE_SCRIPT`]).
    Full(String),
}

impl Step {
    /// The script to feed `nft -f`, if any.
    pub fn script(&self) -> Option<&str> {
        match self {
            Step::Nothing => None,
            Step::Elements(s) | Step::Full(s) => Some(s),
        }
    }

    /// `elements` or `full` (the metrics' label); `none` for [`Step::Nothing`].
    pub fn kind(&self) -> &'static str {
        match self {
            Step::Nothing => "none",
            Step::Elements(_) => "elements",
            Step::Full(_) => "full",
        }
    }
}

/// The step from what the kernel holds (`applied`; `None`: unknown — at start-up, or after a
/// failed apply) to `next`.
pub fn next_step(applied: Option<&Ruleset>, next: &Ruleset) -> Step {
    let Some(old) = applied else {
        // Unknown: whatever a previous agent left is replaced (or removed) in one go.
        return Step::Full(next.render());
    };
    if old.is_empty() && next.is_empty() {
        return Step::Nothing;
    }
    match next.update_from(old) {
        Some(s) if s.is_empty() => Step::Nothing,
        Some(s) => Step::Elements(s),
        None if next.is_empty() => Step::Full(REMOVE_SCRIPT.to_owned()),
        None => Step::Full(next.render()),
    }
}

/// Sizes of a ruleset, for the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RulesetSize {
    /// Pods isolated for ingress.
    pub ingress_pods: usize,
    /// Pods isolated for egress.
    pub egress_pods: usize,
    /// Allow rules over every per-pod chain.
    pub rules: usize,
    /// Named sets.
    pub sets: usize,
}

/// How big `ruleset` is.
pub fn size(ruleset: &Ruleset) -> RulesetSize {
    RulesetSize {
        ingress_pods: ruleset.ingress.len(),
        egress_pods: ruleset.egress.len(),
        rules: ruleset
            .ingress
            .values()
            .chain(ruleset.egress.values())
            .map(Vec::len)
            .sum(),
        sets: ruleset.sets.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flock_policy::{LabelSelector, Namespace, Peer, Pod, Policy, Rule, build};

    fn pod(name: &str, last: u8, host_if: Option<&str>, role: &str) -> Pod {
        Pod {
            namespace: "shop".into(),
            name: name.into(),
            labels: [("role".into(), role.into())].into(),
            addresses: vec![format!("2001:db8:1::{last}").parse().unwrap()],
            host_if: host_if.map(Into::into),
            ports: vec![],
        }
    }

    fn policy() -> Policy {
        Policy {
            namespace: "shop".into(),
            name: "server".into(),
            pod_selector: LabelSelector::labels([("role", "server")]),
            ingress: vec![Rule {
                peers: vec![Peer::pods(LabelSelector::labels([("role", "client")]))],
                ports: vec![],
            }],
            ..Default::default()
        }
    }

    fn ns() -> Vec<Namespace> {
        vec![Namespace {
            name: "shop".into(),
            ..Default::default()
        }]
    }

    #[test]
    fn unknown_kernel_state_gets_the_whole_table_even_when_empty() {
        let empty = build(&[], &ns(), &[]).unwrap();
        assert_eq!(
            next_step(None, &empty),
            Step::Full(REMOVE_SCRIPT.to_owned())
        );
        assert_eq!(next_step(Some(&empty), &empty), Step::Nothing);
    }

    #[test]
    fn a_pod_joining_a_selector_is_an_element_a_new_isolated_pod_a_full_table() {
        let server = pod("s", 1, Some("flock00000001"), "server");
        let one = build(&[policy()], &ns(), std::slice::from_ref(&server)).unwrap();
        let step = next_step(None, &one);
        assert!(matches!(&step, Step::Full(s) if s.contains("chain ingress_flock00000001")));
        assert_eq!(next_step(Some(&one), &one), Step::Nothing);

        let client = pod("c", 2, None, "client");
        let two = build(&[policy()], &ns(), &[server.clone(), client]).unwrap();
        assert_eq!(
            next_step(Some(&one), &two),
            Step::Elements("add element inet flock_policy pods0_v6 { 2001:db8:1::2 }\n".to_owned())
        );

        let second_server = pod("s2", 3, Some("flock00000003"), "server");
        let three = build(&[policy()], &ns(), &[server, second_server]).unwrap();
        assert!(matches!(next_step(Some(&one), &three), Step::Full(_)));
        assert_eq!(
            size(&three),
            RulesetSize {
                ingress_pods: 2,
                egress_pods: 0,
                // one allow per pod and family (a set of each family)
                rules: 4,
                sets: 2
            }
        );
    }

    #[test]
    fn removing_the_last_policy_removes_the_table() {
        let server = pod("s", 1, Some("flock00000001"), "server");
        let one = build(&[policy()], &ns(), std::slice::from_ref(&server)).unwrap();
        let none = build(&[], &ns(), &[server]).unwrap();
        assert_eq!(
            next_step(Some(&one), &none),
            Step::Full(REMOVE_SCRIPT.to_owned())
        );
        assert_eq!(next_step(Some(&none), &none).script(), None);
    }
}
