//! The cluster's certificates and kubeconfigs, made with `openssl` under `RUN_DIR/pki`.
//!
//! One CA (EC P-256, valid 30 days) signs the apiserver's serving certificate and a client
//! certificate for each component: admin (`system:masters`), the controller manager, the
//! scheduler, kube-proxy, the apiserver's client for kubelets, and one kubelet per node
//! (`system:node:NAME` in `system:nodes`, as the Node authorizer expects). The service
//! accounts' tokens are signed with an RSA key.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use super::{CONTROL_ADDR, KUBERNETES_SERVICE_IP, RUN_DIR};
use crate::sys;

/// `RUN_DIR/pki`.
pub fn dir() -> PathBuf {
    Path::new(RUN_DIR).join("pki")
}

/// `RUN_DIR/pki/NAME`.
pub fn file(name: &str) -> String {
    dir().join(name).to_string_lossy().into_owned()
}

/// The apiserver's URL, as every client in the cluster reaches it.
pub fn apiserver_url() -> String {
    format!("https://[{CONTROL_ADDR}]:6443")
}

/// One client identity: its file stem, common name and organisation.
struct Client {
    stem: String,
    cn: String,
    org: Option<&'static str>,
}

fn clients() -> Vec<Client> {
    let mut all = vec![
        Client {
            stem: "admin".into(),
            cn: "flockcluster-admin".into(),
            org: Some("system:masters"),
        },
        Client {
            stem: "controller-manager".into(),
            cn: "system:kube-controller-manager".into(),
            org: None,
        },
        Client {
            stem: "scheduler".into(),
            cn: "system:kube-scheduler".into(),
            org: None,
        },
        Client {
            stem: "kube-proxy".into(),
            cn: "system:kube-proxy".into(),
            org: None,
        },
        Client {
            stem: "apiserver-kubelet-client".into(),
            cn: "kube-apiserver-kubelet-client".into(),
            org: Some("system:masters"),
        },
    ];
    for node in super::every_node() {
        all.push(Client {
            stem: format!("kubelet-{}", node.name),
            cn: format!("system:node:{}", node.name),
            org: Some("system:nodes"),
        });
    }
    all
}

fn openssl(args: &[&str]) -> Result<()> {
    sys::output(Command::new("openssl").args(args).current_dir(dir()))?;
    Ok(())
}

fn ec_key_request(stem: &str, subject: &str) -> Result<()> {
    openssl(&[
        "req",
        "-new",
        "-nodes",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-keyout",
        &format!("{stem}.key"),
        "-out",
        &format!("{stem}.csr"),
        "-subj",
        subject,
    ])
}

fn sign(stem: &str, extensions: &str) -> Result<()> {
    let ext = dir().join(format!("{stem}.ext"));
    std::fs::write(&ext, extensions).with_context(|| format!("write {}", ext.display()))?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        &format!("{stem}.csr"),
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "30",
        "-out",
        &format!("{stem}.crt"),
        "-extfile",
        &format!("{stem}.ext"),
    ])
}

/// Makes the CA, every certificate, the service-account key and every kubeconfig.
pub fn make_all() -> Result<()> {
    std::fs::create_dir_all(dir()).with_context(|| format!("create {}", dir().display()))?;
    openssl(&[
        "req",
        "-x509",
        "-new",
        "-nodes",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "30",
        "-subj",
        "/CN=flockcluster-ca",
    ])?;
    ec_key_request("apiserver", "/CN=kube-apiserver")?;
    sign(
        "apiserver",
        &format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage=serverAuth\n\
             subjectAltName=IP:{CONTROL_ADDR},IP:::1,IP:127.0.0.1,IP:{KUBERNETES_SERVICE_IP},\
             DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,\
             DNS:kubernetes.default.svc.cluster.local\n"
        ),
    )?;
    for client in clients() {
        let subject = match client.org {
            Some(org) => format!("/O={org}/CN={}", client.cn),
            None => format!("/CN={}", client.cn),
        };
        ec_key_request(&client.stem, &subject)?;
        sign(
            &client.stem,
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage=clientAuth\n",
        )?;
        if client.stem != "apiserver-kubelet-client" {
            write_kubeconfig(&client.stem)?;
        }
    }
    openssl(&["genrsa", "-out", "sa.key", "2048"])?;
    openssl(&["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"])?;
    Ok(())
}

/// `RUN_DIR/pki/STEM.kubeconfig`.
pub fn kubeconfig(stem: &str) -> String {
    file(&format!("{stem}.kubeconfig"))
}

fn write_kubeconfig(stem: &str) -> Result<()> {
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: flockcluster
  cluster:
    certificate-authority: {ca}
    server: {server}
users:
- name: {stem}
  user:
    client-certificate: {crt}
    client-key: {key}
contexts:
- name: {stem}@flockcluster
  context: {{ cluster: flockcluster, user: {stem} }}
current-context: {stem}@flockcluster
",
        ca = file("ca.crt"),
        server = apiserver_url(),
        crt = file(&format!("{stem}.crt")),
        key = file(&format!("{stem}.key")),
    );
    let path = kubeconfig(stem);
    std::fs::write(&path, text).with_context(|| format!("write {path}"))
}
