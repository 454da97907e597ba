//! flock and the apiserver: what its service account may do against what the audit log
//! shows it doing, and `kubectl exec` and the apiserver's proxy through the pods.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use anyhow::{Context, Result};
use serde_json::Value;

use super::super::deploy::DEMO_NS;
use super::super::{FLOCK_SERVICE_ACCOUNT, NODES, control, kubectl, kubectl_stdin};
use super::pods::demo_pods;
use super::{Report, json};
use crate::sys;

/// Audit events of flock's service account: ((resource, verb), (requests, refused)).
fn audit_use() -> Result<BTreeMap<(String, String), (usize, usize)>> {
    let path = control::audit_log();
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let mut seen: BTreeMap<String, (String, String, u64)> = BTreeMap::new();
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if e["user"]["username"] != FLOCK_SERVICE_ACCOUNT {
            continue;
        }
        let o = &e["objectRef"];
        let mut resource = match o["resource"].as_str() {
            Some(r) => r.to_owned(),
            // A request without an object: API discovery (`/apis/discovery.k8s.io/v1`), which
            // Kubernetes' own `system:discovery` role lets every user make.
            None => e["requestURI"]
                .as_str()
                .map_or("?", |u| u.split('?').next().unwrap_or(u))
                .to_owned(),
        };
        if let Some(sub) = o["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        if let Some(g) = o["apiGroup"].as_str().filter(|g| !g.is_empty()) {
            resource = format!("{resource}.{g}");
        }
        let id = e["auditID"].as_str().unwrap_or("").to_owned();
        let code = e["responseStatus"]["code"].as_u64().unwrap_or(0);
        let verb = e["verb"].as_str().unwrap_or("?").to_owned();
        // One request has up to three stages (RequestReceived, ResponseStarted for a watch,
        // ResponseComplete): count it once, with the latest code known.
        let entry = seen.entry(id).or_insert((resource, verb, 0));
        if code != 0 {
            entry.2 = code;
        }
    }
    let mut used: BTreeMap<(String, String), (usize, usize)> = BTreeMap::new();
    for (resource, verb, code) in seen.into_values() {
        let e = used.entry((resource, verb)).or_default();
        e.0 += 1;
        if code == 403 {
            e.1 += 1;
        }
    }
    Ok(used)
}

/// A GET of the API's discovery documents (`/api`, `/apis…`, `/version`): granted to every
/// authenticated user by Kubernetes' `system:discovery` ClusterRole, not by flock's RBAC.
fn is_discovery(resource: &str, verb: &str) -> bool {
    verb == "get"
        && (resource == "/api"
            || resource.starts_with("/api/")
            || resource == "/apis"
            || resource.starts_with("/apis/")
            || resource == "/version")
        && !resource.contains("/namespaces/")
}

/// What `deploy/rbac.yaml`'s ClusterRole grants, as (resource[/sub][.group], verb).
/// (resource, verb) of every grant of flock's ClusterRole and of the Roles bound to its
/// service account (the BGP passwords' Secret).
fn granted() -> Result<BTreeSet<(String, String)>> {
    let mut roles = vec![json(&["get", "clusterrole", "flock", "-o", "json"])?];
    let bindings = json(&["get", "rolebindings", "-A", "-o", "json"])?;
    for b in bindings["items"].as_array().into_iter().flatten() {
        let ours = b["subjects"].as_array().into_iter().flatten().any(|s| {
            s["kind"] == "ServiceAccount" && s["name"] == "flock" && s["namespace"] == "kube-system"
        });
        if ours && b["roleRef"]["kind"] == "Role" {
            let ns = b["metadata"]["namespace"].as_str().unwrap_or("default");
            let name = b["roleRef"]["name"].as_str().unwrap_or("");
            roles.push(json(&["-n", ns, "get", "role", name, "-o", "json"])?);
        }
    }
    let mut out = BTreeSet::new();
    for rule in roles
        .iter()
        .flat_map(|r| r["rules"].as_array().cloned().unwrap_or_default())
    {
        let groups: Vec<String> = rule["apiGroups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g.as_str().map(str::to_owned))
            .collect();
        for g in &groups {
            for res in rule["resources"].as_array().into_iter().flatten() {
                for verb in rule["verbs"].as_array().into_iter().flatten() {
                    let res = res.as_str().unwrap_or("?");
                    let name = if g.is_empty() {
                        res.to_owned()
                    } else {
                        format!("{res}.{g}")
                    };
                    out.insert((name, verb.as_str().unwrap_or("?").to_owned()));
                }
            }
        }
    }
    Ok(out)
}

pub(super) fn apiserver(r: &mut Report) -> Result<()> {
    r.text.push_str("FLOCK AND THE APISERVER\n");
    let mut rows = Vec::new();
    // 1. The CRD's schema refuses a bad NodeConfig at the apiserver.
    let bad = "apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata: { name: schema-probe }
spec:
  cidr6: not-a-cidr
  bgp: { asn: 0, routerId: 10.0.0.1 }
";
    match kubectl_stdin(&["create", "--dry-run=server", "-f", "-"], bad) {
        Ok(out) => {
            r.failures.push(format!(
                "the apiserver accepted a bad NodeConfig: {}",
                out.trim()
            ));
            rows.push(vec![
                "schema refuses a bad NodeConfig".into(),
                "NO: accepted".into(),
            ]);
        }
        Err(e) => {
            let msg = format!("{e:#}");
            let why: Vec<&str> = ["spec.cidr6", "spec.bgp.asn"]
                .into_iter()
                .filter(|f| msg.contains(f))
                .collect();
            if why.len() != 2 || !msg.contains("Invalid value") {
                r.failures.push(format!(
                    "a bad NodeConfig was refused, but not by its schema: {msg}"
                ));
            }
            rows.push(vec![
                "schema refuses a bad NodeConfig (cidr6: not-a-cidr, asn: 0)".into(),
                format!("yes: Invalid value for {}", why.join(", ")),
            ]);
        }
    }
    // 2. Status writes go through the status subresource.
    let can = |args: &[&str]| {
        let mut all = vec!["auth", "can-i"];
        all.extend_from_slice(args);
        all.push("--as");
        all.push(FLOCK_SERVICE_ACCOUNT);
        kubectl(&all)
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|e| {
                // `can-i` exits 1 for "no".
                if format!("{e:#}").contains("no") {
                    "no".into()
                } else {
                    format!("{e:#}")
                }
            })
    };
    let main = can(&["patch", "nodeconfigs.flock.fritzlab.net"]);
    let status = can(&[
        "patch",
        "nodeconfigs.flock.fritzlab.net",
        "--subresource=status",
    ]);
    let used = audit_use()?;
    let status_writes: usize = used
        .iter()
        .filter(|((res, verb), _)| {
            res == "nodeconfigs/status.flock.fritzlab.net"
                && matches!(verb.as_str(), "patch" | "update")
        })
        .map(|(_, (n, refused))| n - refused)
        .sum();
    let main_writes: usize = used
        .iter()
        .filter(|((res, verb), _)| {
            res == "nodeconfigs.flock.fritzlab.net"
                && matches!(verb.as_str(), "patch" | "update" | "create" | "delete")
        })
        .map(|(_, (n, _))| *n)
        .sum();
    let generations = kubectl(&[
        "get",
        "nodeconfigs",
        "-o",
        "jsonpath={range .items[*]}{.metadata.generation} {end}",
    ])?;
    let generations = generations.trim().to_owned();
    if status_writes == 0 || main_writes > 0 || main != "no" || status != "yes" {
        r.failures.push(format!(
            "status writes: {status_writes} through nodeconfigs/status, {main_writes} to nodeconfigs; \
             can-i patch nodeconfigs: {main}, nodeconfigs/status: {status}"
        ));
    }
    if generations.split_whitespace().any(|g| g != "1") {
        r.failures.push(format!(
            "a NodeConfig's generation moved ({generations}): something wrote its spec"
        ));
    }
    rows.push(vec![
        "status written through the status subresource".into(),
        format!(
            "{status_writes} patches of nodeconfigs/status, {main_writes} writes of nodeconfigs; \
             can-i patch nodeconfigs: {main}, nodeconfigs/status: {status}; generations {generations}"
        ),
    ]);
    // 3. The agents' logs hold no refusal.
    let mut refusals = 0;
    let agents = kubectl(&[
        "-n",
        "kube-system",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=flock",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ])?;
    for pod in agents.split_whitespace() {
        let log = kubectl(&["-n", "kube-system", "logs", pod, "-c", "agent"])?;
        refusals += log
            .lines()
            // The apiserver's refusal reads "… is forbidden: …" (a bare "403" also matches
            // timestamps).
            .filter(|l| l.to_lowercase().contains("forbidden"))
            .count();
    }
    let refused_requests: usize = used.values().map(|(_, refused)| refused).sum();
    if refusals > 0 || refused_requests > 0 {
        r.failures.push(format!(
            "flock was refused: {refused_requests} requests answered 403, {refusals} log lines"
        ));
    }
    rows.push(vec![
        "refusals (403)".into(),
        format!("{refused_requests} in the audit log, {refusals} lines in the agents' logs"),
    ]);
    sys::table(&mut r.text, &["check", "result"], &rows);

    // 4. RBAC: granted versus used.
    let granted = granted()?;
    let mut keys: BTreeSet<(String, String)> = granted.clone();
    keys.extend(used.keys().cloned());
    r.text.push_str(
        "FLOCK'S RBAC (deploy/rbac.yaml's ClusterRole and Roles versus the requests of kube-system/flock in the apiserver's audit log)\n",
    );
    let mut rows = Vec::new();
    let mut unused = Vec::new();
    for key in &keys {
        let (n, refused) = used.get(key).copied().unwrap_or((0, 0));
        let is_granted = granted.contains(key) || is_discovery(&key.0, &key.1);
        if is_granted && n == 0 {
            unused.push(format!("{} {}", key.1, key.0));
        }
        if !is_granted && n > 0 {
            r.failures.push(format!(
                "flock used {} {} without a grant in deploy/rbac.yaml",
                key.1, key.0
            ));
        }
        rows.push(vec![
            key.0.clone(),
            key.1.clone(),
            (if granted.contains(key) {
                "yes"
            } else if is_granted {
                "system:discovery"
            } else {
                "no"
            })
            .to_owned(),
            n.to_string(),
            refused.to_string(),
        ]);
    }
    sys::table(
        &mut r.text,
        &["resource", "verb", "granted", "requests", "refused"],
        &rows,
    );
    // A grant flock did not use is reported, not failed: the audit log shows what this run
    // exercised, not every path of the agent.
    if unused.is_empty() {
        r.text.push_str(
            "every grant was used; nothing was refused: enough and no broader than needed\n\n",
        );
    } else {
        let _ = writeln!(
            r.text,
            "granted but not used by flock: {} (candidates to drop from deploy/rbac.yaml)\n",
            unused.join(", ")
        );
    }
    Ok(())
}

pub(super) fn kubectl_exec(r: &mut Report) -> Result<()> {
    let pods = demo_pods()?;
    r.text.push_str(
        "KUBECTL EXEC AND THE APISERVER'S PROXY (apiserver -> kubelet -> containerd; apiserver -> the pod's primary IP)\n",
    );
    let mut rows = Vec::new();
    for n in &NODES {
        let Some(pod) = pods.iter().find(|p| p.app == "web" && p.node == n.name) else {
            continue;
        };
        let proxy = format!("/api/v1/namespaces/{DEMO_NS}/pods/{}:80/proxy/", pod.name);
        for (what, args) in [
            (
                format!("kubectl exec -n demo {} -- hostname", pod.name),
                vec!["-n", DEMO_NS, "exec", &pod.name, "--", "hostname"],
            ),
            (
                format!("kubectl get --raw {proxy}"),
                vec!["get", "--raw", &proxy],
            ),
        ] {
            let got = kubectl(&args)
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|e| format!("FAIL ({e:#})"));
            if got != pod.name {
                r.failures.push(format!("{what} answered {got:?}"));
            }
            rows.push(vec![what, n.name.to_owned(), got]);
        }
    }
    sys::table(&mut r.text, &["command", "node", "output"], &rows);
    Ok(())
}
