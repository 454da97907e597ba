//! What the runtime writes on the shim's stdin, and a conflist on disk: parsed, flock's keys
//! validated, each plugin's configuration cut out of a list.
#![no_main]

use flock_cni_proto::{CniVersion, Conflist, NetConf};
use flock_rpc::FlockNetConf;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((conf, _raw)) = NetConf::from_slice(data) {
        let _ = FlockNetConf::from_netconf(&conf);
        let _ = conf.prev_result();
        let _ = conf.gc_attachments();
    }
    if let Ok(list) = Conflist::from_slice(data) {
        let version = list.version_for(&CniVersion::SUPPORTED);
        assert!(CniVersion::SUPPORTED.contains(&version) || version == list.cni_version);
        for i in 0..list.plugins.len().min(8) {
            if let Some(one) = list.plugin_config(i, None)
                && let Ok(conf) = NetConf::from_value(&one)
            {
                let _ = FlockNetConf::from_netconf(&conf);
            }
        }
    }
});
