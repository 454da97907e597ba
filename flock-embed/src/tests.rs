//! Unit and property tests of the spec and the derivation.

use proptest::prelude::*;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;

use crate::layout::mask;
use crate::{Field, Identity, IpAlgo, fnv1a64};

fn id<'a>(ns: &'a str, app: &'a str, pod: &'a str) -> Identity<'a> {
    Identity {
        namespace: ns,
        workload: app,
        image: Some("registry.example/app:1.2"),
        pod,
        container_id: "c0ffee",
    }
}

#[test]
fn every_parse_error_message() {
    let cases = [
        "",
        "   ",
        "ns:16,,n:8",
        "ns:16,",
        "host:8",
        "NS:8",
        "ns",
        "ns:",
        "ns:x",
        "ns:-1",
        "ns:+8",
        "ns:0",
        "app:65",
        "rand:128",
        "n:4,ns:8,n:4",
    ];
    let mut out = String::new();
    for spec in cases {
        let err = IpAlgo::parse(spec).expect_err(spec);
        out.push_str(&format!("{spec:?} => {err}\n"));
    }
    let overflow = IpAlgo::parse("ns:32,app:32,n:8")
        .unwrap()
        .validate_for(64)
        .unwrap_err();
    out.push_str(&format!("\"ns:32,app:32,n:8\" in /64 => {overflow}\n"));
    let impossible = IpAlgo::random().layout(129).unwrap_err();
    out.push_str(&format!("random with 129 host bits => {impossible}\n"));
    insta::assert_snapshot!(out);
}

#[test]
fn presets_and_canonical_text() {
    assert_eq!(IpAlgo::parse("random").unwrap(), IpAlgo::random());
    assert_eq!(IpAlgo::parse(" workload ").unwrap(), IpAlgo::workload());
    assert_eq!(IpAlgo::default(), IpAlgo::random());
    assert!(IpAlgo::workload().has_counter());
    assert!(!IpAlgo::random().has_counter());
    assert_eq!(IpAlgo::workload().bits_needed(), 56);
    let a = IpAlgo::parse(" ns:16 , app : 24,rand:4,n:8").unwrap();
    assert_eq!(a.to_string(), "ns:16,app:24,rand:4,n:8");
    assert_eq!(a.to_string().parse::<IpAlgo>().unwrap(), a);
    // full width is allowed, one bit more is not
    assert!(
        IpAlgo::parse("ns:64,app:64")
            .unwrap()
            .validate_for(128)
            .is_ok()
    );
    assert!(
        IpAlgo::parse("ns:64,app:64,n:1")
            .unwrap()
            .validate_for(128)
            .is_err()
    );
}

#[test]
fn fnv_matches_reference_vectors() {
    // FNV-1a 64 test vectors from the reference implementation.
    assert_eq!(fnv1a64(""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64("a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a64("foobar"), 0x8594_4171_f739_67e8);
}

#[test]
fn image_falls_back_to_container_id() {
    let layout = IpAlgo::parse("image:64").unwrap().layout(64).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut ident = id("a", "b", "c");
    let with_image = layout.host_bits(&ident, 0, &mut rng);
    assert_eq!(with_image, u128::from(fnv1a64("registry.example/app:1.2")));
    ident.image = None;
    assert_eq!(
        layout.host_bits(&ident, 0, &mut rng),
        u128::from(fnv1a64("c0ffee"))
    );
    ident.image = Some("");
    assert_eq!(
        layout.host_bits(&ident, 0, &mut rng),
        u128::from(fnv1a64("c0ffee"))
    );
}

#[test]
fn explain_snapshot() {
    let mut out = IpAlgo::parse("ns:16,app:24,n:8")
        .unwrap()
        .explain(64)
        .unwrap();
    out.push_str(&IpAlgo::workload().explain(72).unwrap());
    out.push_str(&IpAlgo::random().explain(120).unwrap());
    out.push_str(
        &IpAlgo::parse("pod:8,rand:8,n:8")
            .unwrap()
            .explain(104)
            .unwrap(),
    );
    insta::assert_snapshot!(out);
}

#[test]
fn counter_values() {
    let l = IpAlgo::parse("n:64").unwrap().layout(64).unwrap();
    assert_eq!(l.counter_values(), Some(1u128 << 64));
    let l = IpAlgo::workload().layout(64).unwrap();
    assert_eq!(l.counter_values(), Some(256));
    assert_eq!(l.random_bits(), 8);
}

fn field() -> impl Strategy<Value = Field> {
    prop_oneof![
        Just(Field::Ns),
        Just(Field::App),
        Just(Field::Image),
        Just(Field::Pod),
        Just(Field::Rand),
        Just(Field::N),
    ]
}

/// A valid spec (at most one n) together with a host length it fits.
fn spec_and_host() -> impl Strategy<Value = (IpAlgo, u8)> {
    prop::collection::vec((field(), 1u8..=64), 0..6).prop_flat_map(|fields| {
        let mut seen_n = false;
        let mut used = 0u32;
        let text: Vec<String> = fields
            .into_iter()
            .filter(|(f, _)| !(*f == Field::N && std::mem::replace(&mut seen_n, true)))
            .take_while(|(_, b)| {
                used += u32::from(*b);
                used <= 128
            })
            .map(|(f, b)| format!("{f}:{b}"))
            .collect();
        let algo = if text.is_empty() {
            IpAlgo::random()
        } else {
            IpAlgo::parse(&text.join(",")).unwrap()
        };
        let lo = u8::try_from(algo.bits_needed()).unwrap();
        (Just(algo), lo..=128u8)
    })
}

proptest! {
    #[test]
    fn display_round_trips((algo, _host) in spec_and_host()) {
        prop_assert_eq!(algo.to_string().parse::<IpAlgo>().unwrap(), algo);
    }

    #[test]
    fn deterministic_for_equal_identity(
        (algo, host) in spec_and_host(),
        ns in "[a-z]{1,8}", app in "[a-z]{1,8}", pod in "[a-z0-9-]{1,12}",
        n in any::<u64>(), seed in any::<u64>(),
    ) {
        let layout = algo.layout(host).unwrap();
        let ident = id(&ns, &app, &pod);
        let a = layout.host_bits(&ident, n, &mut ChaCha8Rng::seed_from_u64(seed));
        let b = layout.host_bits(&ident, n, &mut ChaCha8Rng::seed_from_u64(seed));
        prop_assert_eq!(a, b);
        // and without random bits, the RNG does not matter at all
        if layout.random_bits() == 0 {
            let c = layout.host_bits(&ident, n, &mut ChaCha8Rng::seed_from_u64(seed ^ 1));
            prop_assert_eq!(a, c);
        }
        prop_assert!(host == 128 || a >> host == 0, "bits above the host part");
    }

    #[test]
    fn fields_sit_at_their_bit_offsets(
        (algo, host) in spec_and_host(),
        ns in "[a-z]{1,8}", app in "[a-z]{1,8}", pod in "[a-z0-9-]{1,12}",
        n in any::<u64>(), random in any::<u128>(),
    ) {
        let layout = algo.layout(host).unwrap();
        let ident = id(&ns, &app, &pod);
        let bits = layout.host_bits_with(&ident, n, random);
        let mut top = u32::from(host);
        for f in algo.fields() {
            top -= u32::from(f.bits);
            let got = (bits >> top) & mask(u32::from(f.bits));
            let want = match f.field {
                Field::Ns => u128::from(fnv1a64(&ns)),
                Field::App => u128::from(fnv1a64(&app)),
                Field::Image => u128::from(fnv1a64("registry.example/app:1.2")),
                Field::Pod => u128::from(fnv1a64(&pod)),
                Field::N => u128::from(n),
                Field::Rand => continue,
            } & mask(u32::from(f.bits));
            prop_assert_eq!(got, want, "field {} at shift {}", f.field, top);
        }
    }

    #[test]
    fn same_workload_shares_ns_app_prefix(
        ns in "[a-z]{1,8}", app in "[a-z]{1,8}",
        pod_a in "[a-z0-9-]{1,12}", pod_b in "[a-z0-9-]{1,12}",
        seed in any::<u64>(), prefix in 0u8..=72,
    ) {
        let algo = IpAlgo::workload();
        let layout = algo.layout(128 - prefix).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut a_ident = id(&ns, &app, &pod_a);
        a_ident.container_id = "aaa";
        let mut b_ident = id(&ns, &app, &pod_b);
        b_ident.container_id = "bbb";
        let a = layout.host_bits(&a_ident, 0, &mut rng);
        let b = layout.host_bits(&b_ident, 3, &mut rng);
        let host = u32::from(128 - prefix);
        // ns:16 + app:24 = the top 40 host bits
        prop_assert_eq!(a >> (host - 40), b >> (host - 40));
    }
}
