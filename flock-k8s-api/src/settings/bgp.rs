//! `spec.bgp` into a `flock-bird` model: per-neighbor graceful restart, BFD timing, link-local
//! neighbors, password sources, graceful shutdown, every error naming its field.

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::invalid;
use crate::nodeconfig::{
    BgpSpec, DEFAULT_BFD_INTERVAL_MS, DEFAULT_BFD_MULTIPLIER, DEFAULT_RESTART_TIME, NeighborSpec,
};
use crate::{Error, Result};

/// The node's BGP setup as a `flock-bird` model, validated now so a bad NodeConfig is
/// reported when it arrives, not at the first pod.
pub(super) fn bird_model(
    bgp: &BgpSpec,
    cidr6: Option<Ipv6Net>,
    cidr4: Option<Ipv4Net>,
) -> Result<flock_bird::BirdModel> {
    let timers = bgp.peering.timers.as_ref().map(|t| flock_bird::Timers {
        hold: t.hold,
        keepalive: t.keepalive,
        connect_retry: t.connect_retry,
        connect_delay: t.connect_retry,
    });
    let communities = bgp
        .peering
        .communities
        .iter()
        .enumerate()
        .map(|(i, c)| {
            c.parse::<flock_bird::Community>().map_err(|e| {
                let reason = match &e {
                    flock_bird::Error::CommunitySyntax { reason, .. } => (*reason).to_owned(),
                    other => other.to_string(),
                };
                invalid(&format!("spec.bgp.communities[{i}]"), c, &reason)
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut cidrs: Vec<IpNet> = Vec::new();
    cidrs.extend(cidr6.map(IpNet::V6));
    cidrs.extend(cidr4.map(IpNet::V4));
    let neighbors = bgp
        .peering
        .neighbors
        .iter()
        .enumerate()
        .map(|(i, n)| bird_neighbor(i, n, timers))
        .collect::<Result<Vec<_>>>()?;
    let model = flock_bird::BirdModel {
        router_id: bgp.router_id.clone(),
        asn: u64::from(bgp.peering.asn),
        neighbors,
        graceful_restart: Some(DEFAULT_RESTART_TIME),
        graceful_shutdown: bgp.peering.graceful_shutdown,
        cidrs,
        communities,
        ..flock_bird::BirdModel::default()
    };
    // A placeholder stands in for each password that is read later, so that the model is
    // validated exactly as it will be rendered.
    let mut checked = model.clone();
    for n in &mut checked.neighbors {
        n.password.get_or_insert_with(|| "placeholder".to_owned());
    }
    checked.validate().map_err(bird_error)?;
    Ok(model)
}

fn bird_neighbor(
    i: usize,
    n: &NeighborSpec,
    timers: Option<flock_bird::Timers>,
) -> Result<flock_bird::NeighborSpec> {
    let field = |name: &str| format!("spec.bgp.neighbors[{i}].{name}");
    if n.password.is_some() {
        return Err(invalid(
            &field("password"),
            "(not shown)",
            "a password is never accepted in clear in a NodeConfig; put it in a Secret and \
             name it in passwordSecretRef (or use passwordFile in standalone mode)",
        ));
    }
    if n.password_secret_ref.is_some() && n.password_file.is_some() {
        return Err(invalid(
            &field("passwordFile"),
            n.password_file.as_deref().unwrap_or_default(),
            "give passwordSecretRef or passwordFile, not both",
        ));
    }
    if let Some(r) = &n.password_secret_ref {
        for (key, value) in [
            ("name", &r.name),
            ("namespace", &r.namespace),
            ("key", &r.key),
        ] {
            if value.trim().is_empty() {
                return Err(invalid(
                    &field(&format!("passwordSecretRef.{key}")),
                    value,
                    "is required",
                ));
            }
        }
    }
    if !n.bfd && (n.bfd_interval_ms.is_some() || n.bfd_multiplier.is_some()) {
        return Err(invalid(
            &field("bfd"),
            "false",
            "bfdIntervalMs and bfdMultiplier need bfd: true",
        ));
    }
    let gr = n.graceful_restart.clone().unwrap_or_default();
    let graceful_restart = if gr.enabled.unwrap_or(true) {
        flock_bird::GracefulRestart::On {
            restart_time: gr.restart_time.unwrap_or(DEFAULT_RESTART_TIME),
            long_lived_stale_time: gr.long_lived_stale_time,
        }
    } else {
        if gr.restart_time.is_some() || gr.long_lived_stale_time.is_some() {
            return Err(invalid(
                &field("gracefulRestart.enabled"),
                "false",
                "restartTime and longLivedStaleTime need graceful restart enabled",
            ));
        }
        flock_bird::GracefulRestart::Off
    };
    Ok(flock_bird::NeighborSpec {
        address: n.address.clone(),
        interface: n.interface.clone(),
        asn: u64::from(n.asn),
        bfd: n.bfd,
        bfd_timing: n.bfd.then(|| flock_bird::BfdTiming {
            interval_ms: n.bfd_interval_ms.unwrap_or(DEFAULT_BFD_INTERVAL_MS),
            multiplier: n.bfd_multiplier.unwrap_or(DEFAULT_BFD_MULTIPLIER),
        }),
        graceful_restart: Some(graceful_restart),
        multihop: n.multihop,
        timers,
        ..flock_bird::NeighborSpec::default()
    })
}

/// A `flock-bird` validation error as a NodeConfig error: `bgp.neighbors[0].asn` becomes the
/// field `spec.bgp.neighbors[0].asn` where the message names one.
fn bird_error(e: flock_bird::Error) -> Error {
    let message = e.to_string();
    let field = message
        .split([' ', ':'])
        .next()
        .filter(|f| f.starts_with("bgp."))
        .map(|f| format!("spec.{f}"))
        .unwrap_or_else(|| "spec.bgp".into());
    Error::InvalidNodeConfig {
        field,
        value: String::new(),
        reason: message,
    }
}

#[cfg(test)]
mod tests {
    use crate::Error;
    use crate::nodeconfig::NodeConfig;

    fn node(neighbors: &str) -> Result<crate::NodeSettings, Error> {
        let yaml = format!(
            "apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata: {{ name: host001 }}
spec:
  cidr6: 2001:db8:0:1::/64
  cidr4: 10.244.1.0/24
  bgp:
    asn: 64512
    routerId: 10.0.0.1
    neighbors:
{neighbors}"
        );
        serde_yaml::from_str::<NodeConfig>(&yaml)
            .expect("yaml")
            .settings()
    }

    fn refused(neighbors: &str) -> (String, String) {
        match node(neighbors) {
            Err(Error::InvalidNodeConfig { field, reason, .. }) => (field, reason),
            other => panic!("expected an invalid NodeConfig, got {other:?}"),
        }
    }

    #[test]
    fn graceful_restart_is_on_by_default_and_bfd_is_100_ms_x_3() {
        let s = node("      - { address: \"2001:db8::fe\", asn: 65000, bfd: true }\n").unwrap();
        let n = &s.bgp.unwrap().neighbors[0];
        assert_eq!(
            n.graceful_restart,
            Some(flock_bird::GracefulRestart::On {
                restart_time: 120,
                long_lived_stale_time: None
            })
        );
        assert_eq!(
            n.bfd_timing,
            Some(flock_bird::BfdTiming {
                interval_ms: 100,
                multiplier: 3
            })
        );

        let s = node(
            "      - address: \"2001:db8::fe\"
        asn: 65000
        bfd: true
        bfdIntervalMs: 50
        bfdMultiplier: 4
        gracefulRestart: { restartTime: 30, longLivedStaleTime: 3600 }
      - { address: \"2001:db8::fd\", asn: 65000, gracefulRestart: { enabled: false } }
",
        )
        .unwrap();
        let m = s.bgp.unwrap();
        assert_eq!(
            m.neighbors[0].graceful_restart,
            Some(flock_bird::GracefulRestart::On {
                restart_time: 30,
                long_lived_stale_time: Some(3600)
            })
        );
        assert_eq!(m.neighbors[0].bfd_timing.unwrap().interval_ms, 50);
        assert_eq!(
            m.neighbors[1].graceful_restart,
            Some(flock_bird::GracefulRestart::Off)
        );
    }

    #[test]
    fn passwords_come_from_a_secret_or_a_file_never_in_clear() {
        let (field, reason) =
            refused("      - { address: \"2001:db8::fe\", asn: 65000, password: s3cret }\n");
        assert_eq!(field, "spec.bgp.neighbors[0].password");
        assert!(reason.contains("passwordSecretRef"), "{reason}");
        assert!(!reason.contains("s3cret"));

        let s = node(
            "      - address: \"2001:db8::fe\"
        asn: 65000
        passwordSecretRef: { name: flock-bgp-passwords, namespace: kube-system, key: tor-a }
      - { address: \"2001:db8::fd\", asn: 65000, passwordFile: /etc/flock/tor-b.password }
",
        )
        .unwrap();
        assert_eq!(s.password_secrets.len(), 1);
        assert_eq!(s.password_secrets[0].0, 0);
        assert_eq!(
            s.password_secrets[0].1.to_string(),
            "Secret kube-system/flock-bgp-passwords key tor-a"
        );
        assert_eq!(
            s.password_files,
            [(1, std::path::PathBuf::from("/etc/flock/tor-b.password"))]
        );
        // Not read yet: the model has no password until the agent reads it.
        assert!(
            s.bgp
                .unwrap()
                .neighbors
                .iter()
                .all(|n| n.password.is_none())
        );

        let (field, _) = refused(
            "      - address: \"2001:db8::fe\"
        asn: 65000
        passwordSecretRef: { name: \"\", namespace: kube-system, key: tor-a }
",
        );
        assert_eq!(field, "spec.bgp.neighbors[0].passwordSecretRef.name");
    }

    #[test]
    fn link_local_neighbors_and_errors_name_their_field() {
        let s = node("      - { interface: eth1, asn: 65000 }\n      - { address: \"fe80::1\", interface: eth0, asn: 65000 }\n").unwrap();
        let valid = s.bgp.unwrap().validate().unwrap();
        let peers: Vec<String> = valid.neighbors().iter().map(|n| n.peer()).collect();
        assert_eq!(peers, ["eth1", "fe80::1%eth0"]);

        let (field, reason) =
            refused("      - { address: \"2001:db8::fe\", interface: eth0, asn: 65000 }\n");
        assert_eq!(field, "spec.bgp.neighbors[0].interface");
        assert!(reason.contains("not link-local"), "{reason}");
        let (field, _) = refused("      - { address: \"fe80::1\", asn: 65000 }\n");
        assert_eq!(field, "spec.bgp.neighbors[0].address");
        let (field, _) =
            refused("      - { address: \"2001:db8::fe\", asn: 65000, bfdMultiplier: 3 }\n");
        assert_eq!(field, "spec.bgp.neighbors[0].bfd");
        let (field, reason) = refused(
            "      - { address: \"2001:db8::fe\", asn: 65000, gracefulRestart: { restartTime: 5000 } }\n",
        );
        assert_eq!(field, "spec.bgp.neighbors[0].gracefulRestart");
        assert!(
            reason.contains("restart time 5000 is out of range"),
            "{reason}"
        );
    }

    #[test]
    fn graceful_shutdown_marks_every_route() {
        let yaml = "apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata: { name: host001 }
spec:
  cidr6: 2001:db8:0:1::/64
  bgp: { asn: 64512, routerId: 10.0.0.1, gracefulShutdown: true, neighbors: [] }
";
        let s = serde_yaml::from_str::<NodeConfig>(yaml)
            .unwrap()
            .settings()
            .unwrap();
        let conf = flock_bird::render(&s.bgp.unwrap().validate().unwrap());
        assert!(conf.contains("bgp_community.add((65535, 0));"), "{conf}");
    }
}
