//! Label selectors as Kubernetes has them (`matchLabels` and `matchExpressions` with `In`,
//! `NotIn`, `Exists`, `DoesNotExist`), validated, matched against a pod's or a namespace's
//! labels, and shown the way `kubectl` shows them.

use std::collections::BTreeMap;
use std::fmt;

use crate::error::{Error, Result};

/// Labels of a pod or a namespace.
pub type Labels = BTreeMap<String, String>;

/// The label Kubernetes puts on every namespace, with the namespace's name as its value.
/// [`Namespace::effective_labels`](crate::Namespace::effective_labels) adds it when the
/// caller's labels lack it.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A `LabelSelector`: all of `match_labels` and all of `match_expressions` must hold; an
/// empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LabelSelector {
    /// `matchLabels`: key = value for each entry.
    pub match_labels: Labels,
    /// `matchExpressions`.
    pub match_expressions: Vec<Requirement>,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Requirement {
    /// The label key.
    pub key: String,
    /// How the key's value is compared.
    pub operator: Operator,
    /// The values for `In` and `NotIn`; empty for `Exists` and `DoesNotExist`.
    pub values: Vec<String>,
}

/// A `matchExpressions` operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operator {
    /// The label is present with one of the values.
    In,
    /// The label is absent, or present with none of the values.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

impl Operator {
    fn as_str(self) -> &'static str {
        match self {
            Operator::In => "In",
            Operator::NotIn => "NotIn",
            Operator::Exists => "Exists",
            Operator::DoesNotExist => "DoesNotExist",
        }
    }
}

impl LabelSelector {
    /// An empty selector: matches everything.
    pub fn all() -> LabelSelector {
        LabelSelector::default()
    }

    /// A selector of `matchLabels` only.
    pub fn labels<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> LabelSelector {
        LabelSelector {
            match_labels: pairs
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            match_expressions: Vec::new(),
        }
    }

    /// Whether `labels` satisfy the selector.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let value = labels.get(&r.key);
                match r.operator {
                    Operator::In => value.is_some_and(|v| r.values.contains(v)),
                    Operator::NotIn => !value.is_some_and(|v| r.values.contains(v)),
                    Operator::Exists => value.is_some(),
                    Operator::DoesNotExist => value.is_none(),
                }
            })
    }

    /// The same selector in a canonical form (expressions and their values sorted and
    /// de-duplicated), so equal selectors compare and hash equal.
    pub(crate) fn canonical(&self) -> LabelSelector {
        let mut exprs: Vec<Requirement> = self
            .match_expressions
            .iter()
            .map(|r| {
                let mut values = r.values.clone();
                values.sort();
                values.dedup();
                Requirement {
                    key: r.key.clone(),
                    operator: r.operator,
                    values,
                }
            })
            .collect();
        exprs.sort();
        exprs.dedup();
        LabelSelector {
            match_labels: self.match_labels.clone(),
            match_expressions: exprs,
        }
    }

    pub(crate) fn validate(&self, policy: &str, field: &str) -> Result<()> {
        for (i, r) in self.match_expressions.iter().enumerate() {
            let reason = match (r.operator, r.values.is_empty()) {
                (Operator::In | Operator::NotIn, true) => Some("needs at least one value"),
                (Operator::Exists | Operator::DoesNotExist, false) => Some("takes no values"),
                _ => None,
            };
            if let Some(reason) = reason {
                return Err(Error::Selector {
                    policy: policy.to_owned(),
                    field: format!("{field}.matchExpressions[{i}]"),
                    key: r.key.clone(),
                    operator: r.operator.as_str(),
                    reason,
                });
            }
        }
        Ok(())
    }
}

/// Kubernetes' selector syntax (`app=web,tier in (a,b),!legacy`); `{}` for the empty selector.
impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = self
            .match_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        for r in &self.match_expressions {
            parts.push(match r.operator {
                Operator::In => format!("{} in ({})", r.key, r.values.join(",")),
                Operator::NotIn => format!("{} notin ({})", r.key, r.values.join(",")),
                Operator::Exists => r.key.clone(),
                Operator::DoesNotExist => format!("!{}", r.key),
            });
        }
        if parts.is_empty() {
            f.write_str("{}")
        } else {
            f.write_str(&parts.join(","))
        }
    }
}
