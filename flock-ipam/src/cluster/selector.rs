//! Label selectors of node pools: Kubernetes' `matchLabels` and `matchExpressions`
//! semantics over a plain label map.

use std::collections::BTreeMap;

/// A Kubernetes label selector: every `match_labels` pair and every requirement must hold.
/// The empty selector selects every node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSelector {
    /// `key: value` pairs a node's labels must all have.
    pub match_labels: BTreeMap<String, String>,
    /// Further requirements, all of which must hold.
    pub match_expressions: Vec<LabelRequirement>,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelRequirement {
    /// The label is set to one of the values.
    In {
        /// The label key.
        key: String,
        /// The accepted values.
        values: Vec<String>,
    },
    /// The label is absent or set to none of the values.
    NotIn {
        /// The label key.
        key: String,
        /// The refused values.
        values: Vec<String>,
    },
    /// The label is set (to anything).
    Exists {
        /// The label key.
        key: String,
    },
    /// The label is not set.
    DoesNotExist {
        /// The label key.
        key: String,
    },
}

impl NodeSelector {
    /// A selector of `match_labels` only.
    pub fn labels<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> NodeSelector {
        NodeSelector {
            match_labels: pairs
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            match_expressions: Vec::new(),
        }
    }

    /// Whether a node with these labels is selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| r.matches(labels))
    }
}

impl LabelRequirement {
    /// Whether labels satisfy this requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            LabelRequirement::In { key, values } => {
                labels.get(key).is_some_and(|v| values.contains(v))
            }
            LabelRequirement::NotIn { key, values } => {
                labels.get(key).is_none_or(|v| !values.contains(v))
            }
            LabelRequirement::Exists { key } => labels.contains_key(key),
            LabelRequirement::DoesNotExist { key } => !labels.contains_key(key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn match_labels_and_expressions_follow_kubernetes() {
        let rack1 = labels(&[("rack", "r1"), ("role", "worker")]);
        let bare = labels(&[]);
        assert!(NodeSelector::default().matches(&bare), "empty selects all");
        assert!(NodeSelector::labels([("rack", "r1")]).matches(&rack1));
        assert!(!NodeSelector::labels([("rack", "r2")]).matches(&rack1));
        assert!(!NodeSelector::labels([("rack", "r1")]).matches(&bare));
        let expr = |r: LabelRequirement| NodeSelector {
            match_expressions: vec![r],
            ..NodeSelector::default()
        };
        let key = || "rack".to_owned();
        let vals = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect();
        assert!(
            expr(LabelRequirement::In {
                key: key(),
                values: vals(&["r0", "r1"])
            })
            .matches(&rack1)
        );
        assert!(
            !expr(LabelRequirement::In {
                key: key(),
                values: vals(&["r0"])
            })
            .matches(&rack1)
        );
        assert!(
            !expr(LabelRequirement::In {
                key: key(),
                values: vals(&["r1"])
            })
            .matches(&bare)
        );
        assert!(
            !expr(LabelRequirement::NotIn {
                key: key(),
                values: vals(&["r1"])
            })
            .matches(&rack1)
        );
        assert!(
            expr(LabelRequirement::NotIn {
                key: key(),
                values: vals(&["r1"])
            })
            .matches(&bare)
        );
        assert!(expr(LabelRequirement::Exists { key: key() }).matches(&rack1));
        assert!(!expr(LabelRequirement::Exists { key: key() }).matches(&bare));
        assert!(expr(LabelRequirement::DoesNotExist { key: key() }).matches(&bare));
        assert!(!expr(LabelRequirement::DoesNotExist { key: key() }).matches(&rack1));
    }
}
