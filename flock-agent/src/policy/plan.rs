//! What one apply does: nothing, a change of the table in place (elements, chains), or the
//! whole table. Pure.

use flock_policy::{Delta, REMOVE_SCRIPT, Ruleset, Update};

use crate::metrics::PolicySize;

/// One transaction, or none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The kernel already holds this ruleset.
    Nothing,
    /// The table changed in place: set and map elements, and chains that come or go.
    Update(Update),
    /// Replace the whole table (or, for an empty model, remove it: [`REMOVE_SCRIPT`]).
    Full(String),
}

impl Step {
    /// The script to feed `nft -f`, if any.
    pub fn script(&self) -> Option<String> {
        match self {
            Step::Nothing => None,
            Step::Update(u) => Some(u.script()),
            Step::Full(s) => Some(s.clone()),
        }
    }

    /// `elements` (elements only), `chains` (chains too) or `full` (the metrics' label);
    /// `none` for [`Step::Nothing`].
    pub fn kind(&self) -> &'static str {
        match self {
            Step::Nothing => "none",
            Step::Update(u) if u.elements_only() => "elements",
            Step::Update(_) => "chains",
            Step::Full(_) => "full",
        }
    }
}

/// The step from what the kernel holds (`applied`; `None`: unknown — at start-up, or after a
/// failed apply) to `next`, a rebuilt model.
pub fn next_step(applied: Option<&Ruleset>, next: &Ruleset) -> Step {
    let Some(old) = applied else {
        // Unknown: whatever a previous agent left is replaced (or removed) in one go.
        return Step::Full(next.render());
    };
    if old.is_empty() && next.is_empty() {
        return Step::Nothing;
    }
    match next.delta_from(old) {
        Some(d) if d.is_empty() => Step::Nothing,
        Some(d) => Step::Update(next.update(&d)),
        None if next.is_empty() => Step::Full(REMOVE_SCRIPT.to_owned()),
        None => Step::Full(next.render()),
    }
}

/// The step that brings the kernel from the ruleset a model had (empty or not: `was_empty`)
/// to `next`, the same model after the changes in `delta` (pods joined or left).
pub fn delta_step(was_empty: bool, next: &Ruleset, delta: &Delta) -> Step {
    if delta.is_empty() {
        Step::Nothing
    } else if next.is_empty() {
        Step::Full(REMOVE_SCRIPT.to_owned())
    } else if was_empty {
        // no table yet: it comes whole
        Step::Full(next.render())
    } else {
        Step::Update(next.update(delta))
    }
}

/// How big `ruleset` is.
pub fn size(ruleset: &Ruleset) -> PolicySize {
    PolicySize {
        ingress_pods: ruleset.ingress.len(),
        egress_pods: ruleset.egress.len(),
        rules: ruleset
            .ingress
            .values()
            .chain(ruleset.egress.values())
            .map(|c| c.matches().count())
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
            labels: std::sync::Arc::new([("role".into(), role.into())].into()),
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
    fn a_pod_joining_a_selector_or_a_second_server_is_elements_only() {
        let server = pod("s", 1, Some("flock00000001"), "server");
        let one = build(&[policy()], &ns(), std::slice::from_ref(&server)).unwrap();
        let step = next_step(None, &one);
        assert!(matches!(&step, Step::Full(s) if s.contains("\"flock00000001\" : jump ingress_")));
        assert_eq!(next_step(Some(&one), &one), Step::Nothing);

        let client = pod("c", 2, None, "client");
        let two = build(&[policy()], &ns(), &[server.clone(), client]).unwrap();
        let step = next_step(Some(&one), &two);
        assert_eq!(step.kind(), "elements");
        assert_eq!(
            step.script().unwrap(),
            "add element inet flock_policy pods0_v6 { 2001:db8:1::2 }\n"
        );

        let second_server = pod("s2", 3, Some("flock00000003"), "server");
        let three = build(&[policy()], &ns(), &[server, second_server]).unwrap();
        let step = next_step(Some(&one), &three);
        assert_eq!(
            step.script().unwrap(),
            "add element inet flock_policy ingress_pods { \"flock00000003\" : jump ingress_d7d2f747440bf9a8 }\n",
            "a second server shares the first one's chain: one map element"
        );
        assert_eq!(
            size(&three),
            PolicySize {
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
