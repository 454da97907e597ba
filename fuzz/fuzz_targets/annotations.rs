//! Pod annotations, which anyone who may create a pod writes: `key=value` lines (the
//! `flock.fritzlab.net/` prefix added to a key without one), read into an allocation request
//! against nodes with and without each family.
#![no_main]

use std::collections::BTreeMap;

use flock_ipam::{NodeDefaults, PodRequest};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let annotations: BTreeMap<String, String> = text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let key = if k.contains('/') {
                k.to_owned()
            } else {
                format!("flock.fritzlab.net/{k}")
            };
            (key, v.to_owned())
        })
        .collect();
    for (has_cidr6, has_cidr4) in [(true, true), (true, false), (false, true)] {
        let node = NodeDefaults {
            ipv6: has_cidr6,
            ipv4: has_cidr4,
            ip_algo: None,
            has_cidr6,
            has_cidr4,
        };
        if let Ok(req) = PodRequest::from_annotations(&annotations, &node) {
            let _ = req;
        }
    }
});
