//! A minimal chained CNI plugin on `flock_cni_proto::skel`: it passes the
//! previous plugin's result through unchanged (so it can sit anywhere in a
//! conflist after the plugin that creates the interface), accepts only
//! known `CNI_ARGS`, and treats DEL, STATUS and GC as the no-ops they are
//! for a plugin that keeps no state.
//!
//! Try it:
//!
//! ```sh
//! cargo build -p flock-examples --example minimal_plugin
//! CNI_COMMAND=VERSION target/debug/examples/minimal_plugin
//! echo '{"cniVersion":"1.0.0","name":"demo","type":"minimal_plugin",
//!        "prevResult":{"cniVersion":"1.0.0","ips":[{"address":"2001:db8::5/128"}]}}' |
//!   CNI_COMMAND=ADD CNI_CONTAINERID=c1 CNI_NETNS=/run/netns/x CNI_IFNAME=eth0 \
//!   CNI_PATH=/opt/cni/bin target/debug/examples/minimal_plugin
//! ```

use flock_cni_proto::{Call, CniArgs, CniError, CniResult, ErrorCode, Plugin, skel};

/// The `CNI_ARGS` keys this plugin understands (the CRI ones, ignored).
const KNOWN_ARGS: &[&str] = &[
    "K8S_POD_NAMESPACE",
    "K8S_POD_NAME",
    "K8S_POD_UID",
    "K8S_POD_INFRA_CONTAINER_ID",
];

struct Passthrough;

impl Passthrough {
    fn prev_result(call: &Call<'_>) -> Result<CniResult, CniError> {
        CniArgs::parse(&call.env.args)?.check_known(KNOWN_ARGS)?;
        call.conf.prev_result()?.ok_or_else(|| {
            CniError::new(
                ErrorCode::InvalidNetworkConfig,
                format!(
                    "plugin {:?} of network {:?} must be chained after a plugin that creates an interface: no prevResult",
                    call.conf.plugin_type, call.conf.name
                ),
            )
        })
    }
}

impl Plugin for Passthrough {
    fn add(&self, call: &Call<'_>) -> Result<CniResult, CniError> {
        Self::prev_result(call)
    }

    fn del(&self, _call: &Call<'_>) -> Result<(), CniError> {
        Ok(())
    }

    fn check(&self, call: &Call<'_>) -> Result<(), CniError> {
        let prev = Self::prev_result(call)?;
        if prev.ips.is_empty() {
            return Err(CniError::new(
                ErrorCode::Plugin(100),
                format!(
                    "container {:?}: prevResult has no addresses",
                    call.env.container_id
                ),
            ));
        }
        Ok(())
    }

    fn status(&self, _call: &Call<'_>) -> Result<(), CniError> {
        Ok(())
    }

    fn gc(&self, _call: &Call<'_>) -> Result<(), CniError> {
        Ok(())
    }
}

fn main() {
    skel::run(&Passthrough)
}
