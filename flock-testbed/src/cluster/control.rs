//! The control plane, in the namespace `flockcluster-control`: etcd on its loopback, the
//! apiserver on the namespace's address (reached by every node through the router), the
//! controller manager and the scheduler.
//!
//! The apiserver writes an audit log of every request flock's service account makes
//! (`RUN_DIR/control/audit.log`): the report compares the verbs flock used with the RBAC
//! `deploy/rbac.yaml` grants, and looks for refusals.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use super::kube::KubeBuild;
use super::proc::{self, Place};
use super::{
    CONTROL, CONTROL_ADDR, FLOCK_SERVICE_ACCOUNT, RUN_DIR, SERVICE_CIDR, SERVICE_CIDR4, pki,
};

/// How long a control-plane component may take to answer.
const START_LIMIT: Duration = Duration::from_secs(90);

/// `RUN_DIR/control`.
pub fn dir() -> PathBuf {
    Path::new(RUN_DIR).join("control")
}

/// The apiserver's audit log.
pub fn audit_log() -> PathBuf {
    dir().join("audit.log")
}

fn here() -> Place {
    Place::Net(CONTROL.to_owned())
}

/// Starts etcd, the apiserver, the controller manager and the scheduler, each once the one
/// before answers.
pub fn start(kube: &KubeBuild) -> Result<()> {
    std::fs::create_dir_all(dir()).with_context(|| format!("create {}", dir().display()))?;
    start_etcd(kube)?;
    start_apiserver(kube)?;
    start_controller_manager(kube)?;
    start_scheduler(kube)?;
    Ok(())
}

/// Kills the apiserver (SIGKILL) and starts it again; returns once it is ready.
pub fn restart_apiserver(kube: &KubeBuild) -> Result<()> {
    proc::kill_daemon("kube-apiserver")?;
    start_apiserver(kube)
}

fn start_etcd(kube: &KubeBuild) -> Result<()> {
    let data = dir().join("etcd");
    let data = data.to_string_lossy();
    proc::spawn(
        "etcd",
        &here(),
        kube.etcd(),
        &[
            "--name=control",
            &format!("--data-dir={data}"),
            "--listen-client-urls=http://127.0.0.1:2379",
            "--advertise-client-urls=http://127.0.0.1:2379",
            "--listen-peer-urls=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=control=http://127.0.0.1:2380",
            "--listen-metrics-urls=http://127.0.0.1:2381",
            "--log-level=warn",
        ],
        &[],
    )?;
    proc::wait_daemon("etcd", "etcd to report healthy", START_LIMIT, || {
        here()
            .run(&[
                "curl",
                "-fsS",
                "--max-time",
                "2",
                "http://127.0.0.1:2379/health",
            ])
            .is_ok_and(|body| body.contains("true"))
    })?;
    Ok(())
}

fn audit_policy() -> String {
    format!(
        "# Every request of flock's service account, at Metadata level; nothing else. Every
# stage: a watch's later stages may be written only when it ends.
apiVersion: audit.k8s.io/v1
kind: Policy
rules:
  - level: Metadata
    users: [\"{FLOCK_SERVICE_ACCOUNT}\"]
  - level: None
"
    )
}

/// The cluster's Service ranges, IPv6 first: a Service that names no family gets IPv6.
fn service_ranges() -> String {
    format!("{SERVICE_CIDR},{SERVICE_CIDR4}")
}

fn start_apiserver(kube: &KubeBuild) -> Result<()> {
    let policy = dir().join("audit-policy.yaml");
    std::fs::write(&policy, audit_policy())
        .with_context(|| format!("write {}", policy.display()))?;
    let f = pki::file;
    proc::spawn(
        "kube-apiserver",
        &here(),
        kube.tool("kube-apiserver"),
        &[
            "--etcd-servers=http://127.0.0.1:2379".to_owned(),
            "--bind-address=::".to_owned(),
            "--secure-port=6443".to_owned(),
            format!("--advertise-address={CONTROL_ADDR}"),
            format!("--service-cluster-ip-range={}", service_ranges()),
            format!("--tls-cert-file={}", f("apiserver.crt")),
            format!("--tls-private-key-file={}", f("apiserver.key")),
            format!("--client-ca-file={}", f("ca.crt")),
            format!(
                "--kubelet-client-certificate={}",
                f("apiserver-kubelet-client.crt")
            ),
            format!("--kubelet-client-key={}", f("apiserver-kubelet-client.key")),
            // Else `kubectl exec` looks the node's name up in DNS.
            "--kubelet-preferred-address-types=InternalIP".to_owned(),
            "--service-account-issuer=https://kubernetes.default.svc".to_owned(),
            format!("--service-account-signing-key-file={}", f("sa.key")),
            format!("--service-account-key-file={}", f("sa.pub")),
            "--authorization-mode=Node,RBAC".to_owned(),
            "--enable-admission-plugins=NodeRestriction".to_owned(),
            // Multus's daemon and some e2e pods run privileged (flock's own pods do not).
            "--allow-privileged=true".to_owned(),
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", audit_log().display()),
            "--audit-log-format=json".to_owned(),
            "--profiling=false".to_owned(),
        ],
        &[],
    )?;
    proc::wait_daemon(
        "kube-apiserver",
        "the apiserver's /readyz",
        START_LIMIT,
        || super::kubectl(&["get", "--raw", "/readyz"]).is_ok_and(|s| s.trim() == "ok"),
    )?;
    Ok(())
}

fn start_controller_manager(kube: &KubeBuild) -> Result<()> {
    let kubeconfig = pki::kubeconfig("controller-manager");
    proc::spawn(
        "kube-controller-manager",
        &here(),
        kube.tool("kube-controller-manager"),
        &[
            format!("--kubeconfig={kubeconfig}"),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--leader-elect=false".to_owned(),
            // flock assigns pod addresses from NodeConfigs; nodes have no podCIDR.
            "--controllers=*,-nodeipam".to_owned(),
            format!("--root-ca-file={}", pki::file("ca.crt")),
            format!("--service-account-private-key-file={}", pki::file("sa.key")),
            "--use-service-account-credentials=true".to_owned(),
            format!("--service-cluster-ip-range={}", service_ranges()),
            "--profiling=false".to_owned(),
        ],
        &[],
    )?;
    proc::wait_daemon(
        "kube-controller-manager",
        "the controller manager's /healthz",
        START_LIMIT,
        || healthz(10257),
    )?;
    Ok(())
}

fn start_scheduler(kube: &KubeBuild) -> Result<()> {
    let kubeconfig = pki::kubeconfig("scheduler");
    proc::spawn(
        "kube-scheduler",
        &here(),
        kube.tool("kube-scheduler"),
        &[
            format!("--kubeconfig={kubeconfig}"),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--leader-elect=false".to_owned(),
            "--profiling=false".to_owned(),
        ],
        &[],
    )?;
    proc::wait_daemon(
        "kube-scheduler",
        "the scheduler's /healthz",
        START_LIMIT,
        || healthz(10259),
    )?;
    Ok(())
}

/// A component's `/healthz` on the control namespace's loopback answers `ok`.
fn healthz(port: u16) -> bool {
    here()
        .run(&[
            "curl",
            "-ksS",
            "--max-time",
            "2",
            &format!("https://127.0.0.1:{port}/healthz"),
        ])
        .is_ok_and(|body| body.trim() == "ok")
}
