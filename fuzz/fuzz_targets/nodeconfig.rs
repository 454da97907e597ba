//! A NodeConfig (a resource, or standalone mode's YAML file): validated into the node's
//! settings; a valid one renders a BIRD configuration.
#![no_main]

use flock_k8s_api::NodeConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(nc) = serde_yaml::from_slice::<NodeConfig>(data) else {
        return;
    };
    let Ok(settings) = nc.settings() else {
        return;
    };
    if let Some(model) = &settings.bgp
        && let Ok(valid) = model.validate()
    {
        let _ = flock_bird::render(&valid);
    }
    for n in &settings.networks {
        assert!(!n.cidrs().is_empty(), "a network without space passed");
    }
});
