//! The `CNI_*` environment and `CNI_ARGS`, as the runtime (or whoever execs the shim) sets
//! them: `KEY=value` lines.
#![no_main]

use std::collections::BTreeMap;

use flock_cni_proto::{CniArgs, CniEnv};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let env: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
    let _ = CniEnv::from_lookup(|k| env.get(k).map(|v| (*v).to_owned()));
    if let Ok(args) = CniArgs::parse(text) {
        // what it parsed is found again by its key
        for (key, value) in text.split(';').filter_map(|kv| kv.split_once('=')) {
            if let Some(found) = args.get(key) {
                let _ = (found, value);
            }
        }
    }
});
