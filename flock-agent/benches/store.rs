//! The allocation store's writes of a burst of pods (each a pending and a committed record,
//! as an ADD writes them), on the filesystem of `--state-dir`'s choosing (`$TMPDIR`), in the
//! store's two layouts:
//! - `pages`: records in pages of the slots file, as the agent writes them while it runs;
//! - `files`: a file per record, as once the slots file is retired ([`Store::retire_slots`]),
//!   or for a record longer than a page;
//!
//! and, for each, the two cases the store meets:
//! - `stocked`: blank pages or spare files made beforehand ([`Store::stock`], as the agent
//!   does off the request path), so every write goes into a page or file that exists;
//! - `unstocked`: none, so each pod's first write appends a page or its commit creates a file.
//!
//! Stocked, also right after 5 000 files were created and removed (what a build or the last
//! burst's DELs do): file creation on ext4 without a journal slows with every inode freed
//! lately, the cause of `store_commit`'s growth from one `cargo xtask bench` run to the next
//! (issue 29).
//!
//! `cargo bench -p flock-agent --bench store`

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use flock_agent::store::{AllocationRecord, PodRef, RecordState, STORE_FORMAT, Store};

/// Files created and removed before the burst in the `after_churn` cases.
const CHURN: usize = 5_000;

fn record(i: u64) -> AllocationRecord {
    AllocationRecord {
        format: STORE_FORMAT,
        state: RecordState::Pending,
        network: "flock".into(),
        container_id: format!("{i:064x}"),
        if_name: "eth0".into(),
        netns: format!("/var/run/netns/cni-{i:032x}"),
        boot_id: "00000000-0000-4000-8000-000000000000".into(),
        pod: Some(PodRef {
            namespace: "default".into(),
            name: format!("web-{i}"),
            uid: format!("00000000-0000-4000-8000-{i:012}"),
        }),
        // Distinct for as many pods as a sample takes (more than a /16 holds when writes are
        // fast).
        ipv6: Some(std::net::Ipv6Addr::from(
            0x2001_0db8_0001_0000_0000_0000_0000_0001_u128 + u128::from(i),
        )),
        ipv4: Some(std::net::Ipv4Addr::from(
            0x0a00_0001_u32 + (i % 0x00ff_fffe) as u32,
        )),
        addresses: vec![],
        anycast: vec![],
        mtu: 1500,
        host_if: format!("flock{:08x}", i),
        host_mac: String::new(),
        pod_mac: String::new(),
        flock_network: None,
        default_route: true,
        routes: Vec::new(),
    }
}

/// Creates and removes [`CHURN`] files in `dir`.
fn churn(dir: &std::path::Path) {
    for i in 0..CHURN {
        let path = dir.join(format!("churn-{i}"));
        std::fs::write(&path, [0u8; 900]).expect("write a churn file");
        std::fs::remove_file(&path).expect("remove a churn file");
    }
}

/// The time of `pods` pods' two writes each, on a fresh store (`files`: its slots file
/// retired; `stocked`: its blank pages or spares made first), after churn or not.
fn burst(pods: u64, files: bool, stocked: bool, after_churn: bool) -> Duration {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = Store::open(dir.path(), "bench-boot").expect("open the store");
    if files {
        store.retire_slots().expect("retire the slots file");
    }
    if stocked {
        // one stock covers a burst of up to SLOT_STOCK - SLOT_LOW (SPARE_STOCK - SPARE_LOW)
        // pods; more are made in rounds, untimed, as the agent's blocking thread makes them
        // beside the requests
        assert!(store.claim_stock());
        store.stock().expect("stock");
    }
    if after_churn {
        churn(store.dir());
    }
    let mut took = Duration::ZERO;
    for i in 0..pods {
        if stocked && store.claim_stock() {
            store.stock().expect("stock");
        }
        let mut r = record(i);
        let started = Instant::now();
        store.put(&r).expect("pending");
        r.state = RecordState::Committed;
        store.put(&r).expect("commit");
        took += started.elapsed();
    }
    took
}

fn store_writes(c: &mut Criterion) {
    let mut group = c.benchmark_group("store_pod_writes");
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(10));
    for (layout, files) in [("pages", false), ("files", true)] {
        for (case, stocked, after_churn) in [
            ("stocked", true, false),
            ("unstocked", false, false),
            ("stocked_after_churn", true, true),
        ] {
            group.bench_function(format!("{layout}/{case}"), |b| {
                b.iter_custom(|pods| burst(pods, files, stocked, after_churn))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, store_writes);
criterion_main!(benches);
