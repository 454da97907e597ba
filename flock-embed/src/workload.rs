//! The workload-name rule of DESIGN §4.

/// The workload name of a pod, shared by all its replicas.
///
/// - `owner`: the controller owner reference as `(kind, name)`, if any;
/// - `pod_template_hash`: the pod's `pod-template-hash` label, if any;
/// - `pod_name`: the pod's own name.
///
/// A ReplicaSet owner named `<deployment>-<pod-template-hash>` gives the
/// Deployment's name; a ReplicaSet whose name lacks that suffix gives its own
/// name; every other controller kind (StatefulSet, DaemonSet, Job, …) gives
/// its name as is; no controller gives the pod's name.
///
/// ```
/// use flock_embed::workload_name;
/// assert_eq!(workload_name(Some(("ReplicaSet", "web-7d4b9c")), Some("7d4b9c"), "web-7d4b9c-x2x1q"), "web");
/// assert_eq!(workload_name(Some(("StatefulSet", "db")), None, "db-0"), "db");
/// assert_eq!(workload_name(None, None, "debug"), "debug");
/// ```
pub fn workload_name(
    owner: Option<(&str, &str)>,
    pod_template_hash: Option<&str>,
    pod_name: &str,
) -> String {
    let Some((kind, name)) = owner else {
        return pod_name.to_owned();
    };
    if kind == "ReplicaSet"
        && let Some(hash) = pod_template_hash.filter(|h| !h.is_empty())
        && let Some(deployment) = name
            .strip_suffix(hash)
            .and_then(|rest| rest.strip_suffix('-'))
            .filter(|d| !d.is_empty())
    {
        return deployment.to_owned();
    }
    name.to_owned()
}

#[cfg(test)]
mod tests {
    use super::workload_name;

    #[test]
    fn rules() {
        let rs = Some(("ReplicaSet", "api-5f6d8"));
        assert_eq!(workload_name(rs, Some("5f6d8"), "api-5f6d8-abcde"), "api");
        // hash label missing or not the suffix: the ReplicaSet's own name
        assert_eq!(workload_name(rs, None, "p"), "api-5f6d8");
        assert_eq!(workload_name(rs, Some("zzz"), "p"), "api-5f6d8");
        assert_eq!(
            workload_name(Some(("ReplicaSet", "5f6d8")), Some("5f6d8"), "p"),
            "5f6d8"
        );
        assert_eq!(
            workload_name(Some(("ReplicaSet", "-5f6d8")), Some("5f6d8"), "p"),
            "-5f6d8"
        );
        assert_eq!(
            workload_name(Some(("ReplicaSet", "x5f6d8")), Some("5f6d8"), "p"),
            "x5f6d8"
        );
        for kind in ["StatefulSet", "DaemonSet", "Job"] {
            assert_eq!(
                workload_name(Some((kind, "w-5f6d8")), Some("5f6d8"), "w-0"),
                "w-5f6d8"
            );
        }
        assert_eq!(workload_name(None, Some("5f6d8"), "solo"), "solo");
    }
}
