//! The ip-algo spec (a pod or NodeConfig annotation): parsed, printed and parsed back to the
//! same spec, laid out in host parts of every size, and an address derived from it.
#![no_main]

use flock_embed::{Identity, IpAlgo};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&bits, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let Ok(algo) = IpAlgo::parse(text) else {
        return;
    };
    let printed = algo.to_string();
    let again = IpAlgo::parse(&printed).expect("a printed spec parses");
    assert_eq!(again.to_string(), printed);
    let host_bits = bits % 129;
    if let Ok(layout) = algo.layout(host_bits) {
        let identity = Identity {
            namespace: "shop",
            workload: "web",
            image: Some("registry.example/web:1"),
            pod: "web-7d9c",
            container_id: "0123abcd",
        };
        let value = layout.host_bits_with(&identity, 3, u128::MAX);
        if host_bits < 128 {
            assert!(
                value < (1u128 << host_bits),
                "host bits beyond the host part"
            );
        }
        let _ = layout.explain();
    }
});
