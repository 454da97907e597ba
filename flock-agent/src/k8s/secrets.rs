//! BGP passwords from Secrets (`spec.bgp.neighbors[].passwordSecretRef`): the agent GETs
//! exactly the Secret each reference names, never lists or watches Secrets, so its RBAC can
//! be one Role per Secret namespace with `resourceNames` (deploy/rbac.yaml). A password that
//! cannot be read leaves its neighbor out of BIRD's configuration (a session without the
//! password it asks for is never attempted) and the reason goes to the NodeConfig status.

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use flock_k8s_api::{NodeSettings, SecretKeyRef};

/// Reads one key of one Secret.
#[derive(Clone)]
pub struct SecretReader {
    client: Client,
}

impl SecretReader {
    /// A reader using `client` (the agent's service account).
    pub fn new(client: Client) -> SecretReader {
        SecretReader { client }
    }

    /// The value of `reference.key`, as UTF-8 with a trailing newline dropped; the error says
    /// which Secret and why (not found, forbidden by RBAC, no such key), never the value.
    pub async fn read(&self, reference: &SecretKeyRef) -> Result<String, SecretError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &reference.namespace);
        let at = || reference.to_string();
        let secret = api.get(&reference.name).await.map_err(|e| match e {
            kube::Error::Api(status) if status.code == 403 => SecretError::Forbidden {
                secret: at(),
                namespace: reference.namespace.clone(),
                message: status.message,
            },
            kube::Error::Api(status) if status.code == 404 => {
                SecretError::NotFound { secret: at() }
            }
            source => SecretError::Get {
                secret: at(),
                source,
            },
        })?;
        let value = secret
            .data
            .as_ref()
            .and_then(|d| d.get(&reference.key))
            .map(|v| v.0.clone())
            .or_else(|| {
                secret
                    .string_data
                    .as_ref()
                    .and_then(|d| d.get(&reference.key))
                    .map(|v| v.clone().into_bytes())
            })
            .ok_or_else(|| SecretError::NoKey { secret: at() })?;
        let text = String::from_utf8(value).map_err(|_| SecretError::NotUtf8 { secret: at() })?;
        Ok(text.trim_end_matches(['\n', '\r']).to_owned())
    }
}

/// Why a password could not be read from its Secret; each names the Secret and key
/// (`namespace/name key`), never the value.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// RBAC refused the GET.
    #[error(
        "{secret}: the agent may not read it (RBAC: grant `get` on this Secret by \
         resourceNames in a Role of namespace {namespace}): {message}"
    )]
    Forbidden {
        /// The reference.
        secret: String,
        /// Its namespace.
        namespace: String,
        /// The API server's message.
        message: String,
    },
    /// No such Secret.
    #[error("{secret}: no such Secret")]
    NotFound {
        /// The reference.
        secret: String,
    },
    /// The GET failed otherwise (the API server unreachable).
    #[error("{secret}: {source}")]
    Get {
        /// The reference.
        secret: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The Secret has no such key.
    #[error("{secret}: the Secret has no such key")]
    NoKey {
        /// The reference.
        secret: String,
    },
    /// The value is not text.
    #[error("{secret}: the value is not UTF-8 text")]
    NotUtf8 {
        /// The reference.
        secret: String,
    },
}

/// Fills in every password `settings` takes from a Secret (or a file). Each one that cannot be
/// read adds a line to the returned problems, which name the neighbor's field and the Secret,
/// and then: if `previous` (the settings in force) has a password for the same neighbor, that
/// one stays in use, so that an API server outage or a Secret being re-created never resets a
/// session; otherwise the neighbor is removed from `settings.bgp`. A value BIRD could not take
/// removes the neighbor too.
pub async fn fill_passwords(
    settings: &mut NodeSettings,
    reader: &SecretReader,
    previous: Option<&NodeSettings>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut unusable = Vec::new();
    let refs = settings.password_secrets.clone();
    let files = settings.password_files.clone();
    let Some(model) = settings.bgp.as_mut() else {
        return problems;
    };
    // A Secret mounted into the agent's pod as a file works too.
    for (index, path) in files {
        match tokio::fs::read_to_string(&path).await {
            Ok(text) => {
                if let Some(n) = model.neighbors.get_mut(index) {
                    n.password = Some(text.trim_end_matches(['\n', '\r']).to_owned());
                }
            }
            Err(e) => {
                problems.push(format!(
                    "spec.bgp.neighbors[{index}].passwordFile {}: {e}; the neighbor is left out of BIRD until it can be read",
                    path.display()
                ));
                unusable.push(index);
            }
        }
    }
    for (index, reference) in refs {
        let field = format!("spec.bgp.neighbors[{index}].passwordSecretRef");
        match reader.read(&reference).await {
            Ok(password) => {
                if let Some(n) = model.neighbors.get_mut(index) {
                    n.password = Some(password);
                }
            }
            Err(why) => {
                let kept = model
                    .neighbors
                    .get(index)
                    .and_then(|n| previous_password(previous, n));
                match kept {
                    Some(password) => {
                        problems.push(format!(
                            "{field}: {why}; the password read before stays in use"
                        ));
                        if let Some(n) = model.neighbors.get_mut(index) {
                            n.password = Some(password);
                        }
                    }
                    None => {
                        problems.push(format!(
                            "{field}: {why}; the neighbor is left out of BIRD until it can be read"
                        ));
                        unusable.push(index);
                    }
                }
            }
        }
    }
    // A value BIRD cannot take (a quote, a newline, too long) is reported the same way.
    if let Err(e) = model.validate() {
        let message = e.to_string();
        if let Some(index) = message
            .strip_prefix("bgp.neighbors[")
            .and_then(|rest| rest.split(']').next())
            .and_then(|i| i.parse::<usize>().ok())
            .filter(|_| message.contains(".password"))
        {
            problems.push(format!(
                "spec.bgp.neighbors[{index}].passwordSecretRef: {message}; the neighbor is left out of BIRD"
            ));
            unusable.push(index);
        }
    }
    unusable.sort_unstable();
    unusable.dedup();
    for index in unusable.into_iter().rev() {
        if index < model.neighbors.len() {
            model.neighbors.remove(index);
        }
    }
    problems
}

/// The password the settings in force use for the same neighbor (same address and interface).
fn previous_password(
    previous: Option<&NodeSettings>,
    neighbor: &flock_bird::NeighborSpec,
) -> Option<String> {
    previous?
        .bgp
        .as_ref()?
        .neighbors
        .iter()
        .find(|n| n.address == neighbor.address && n.interface == neighbor.interface)?
        .password
        .clone()
}
