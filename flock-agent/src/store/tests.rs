//! The store's unit tests.

use super::*;

const BOOT: &str = "boot-1";

fn record(cid: &str) -> AllocationRecord {
    AllocationRecord {
        format: STORE_FORMAT,
        state: RecordState::Pending,
        network: "flock".into(),
        container_id: cid.into(),
        if_name: "eth0".into(),
        netns: "/run/netns/x".into(),
        boot_id: "b".into(),
        pod: Some(PodRef {
            namespace: "default".into(),
            name: "web-0".into(),
            uid: String::new(),
        }),
        ipv6: Some("2001:db8:1::5".parse().unwrap()),
        ipv4: Some("10.1.0.5".parse().unwrap()),
        addresses: vec![],
        anycast: vec![],
        mtu: 1500,
        host_if: "flock01234567".into(),
        host_mac: String::new(),
        pod_mac: String::new(),
        flock_network: None,
        default_route: true,
        routes: Vec::new(),
    }
}

#[test]
fn put_read_delete_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let (store, records) = Store::open(dir.path(), BOOT).unwrap();
    assert!(records.is_empty());
    let mut a = record("aaa");
    store.put(&a).unwrap();
    a.state = RecordState::Committed;
    store.put(&a).unwrap();
    store.put(&record("bbb")).unwrap();
    let (store, records) = Store::open(dir.path(), BOOT).unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0], a);
    store.delete(&a.key()).unwrap();
    store.delete(&a.key()).unwrap();
    let (_, records) = Store::open(dir.path(), BOOT).unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].container_id, "bbb");
}

#[test]
fn torn_temp_file_is_ignored_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), BOOT).unwrap();
    store.put(&record("aaa")).unwrap();
    let tmp = store.dir().join(".tmp-aaa.eth0.json");
    fs::write(&tmp, b"{\"format\":1,\"sta").unwrap();
    let (_, records) = Store::open(dir.path(), BOOT).unwrap();
    assert_eq!(records.len(), 1);
    assert!(!tmp.exists());
}

#[test]
fn corrupt_record_stops_with_the_file_named() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), BOOT).unwrap();
    let bad = store.dir().join("ccc.eth0.json");
    fs::write(&bad, b"{not json").unwrap();
    let err = Store::open(dir.path(), BOOT).unwrap_err().to_string();
    assert!(err.contains("ccc.eth0.json"), "{err}");
}

#[test]
fn unknown_store_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("store.json"), b"{\"format\":7}").unwrap();
    let err = Store::open(dir.path(), BOOT).unwrap_err().to_string();
    assert!(err.contains("store format 7"), "{err}");
}

#[test]
fn keys_that_join_alike_get_files_of_their_own() {
    // `a.b` + `c` and `a` + `b.c` shared the file `a.b.c.json` before.
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), BOOT).unwrap();
    let mut one = record("a.b");
    one.if_name = "c".into();
    let mut two = record("a");
    two.if_name = "b.c".into();
    store.put(&one).unwrap();
    store.put(&two).unwrap();
    let (store, records) = Store::open(dir.path(), BOOT).unwrap();
    assert_eq!(records, vec![two.clone(), one.clone()]);
    store.delete(&one.key()).unwrap();
    assert_eq!(Store::read(dir.path()).unwrap(), vec![two]);
}

#[test]
fn reading_beside_a_running_agent_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), BOOT).unwrap();
    store.put(&record("aaa")).unwrap();
    // A write the running agent has in progress.
    let in_flight = store.dir().join(".tmp-bbb:eth0.json");
    fs::write(&in_flight, b"{\"format\":1").unwrap();
    let records = Store::read(dir.path()).unwrap();
    assert_eq!(records.len(), 1);
    assert!(
        in_flight.exists(),
        "a read-only listing removed an in-flight file"
    );
    assert!(
        Store::read(&dir.path().join("nothing-here"))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn records_of_earlier_agents_are_read_and_renamed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), BOOT).unwrap();
    let r = record("aaa");
    let legacy = store.dir().join("aaa.eth0.json");
    fs::write(&legacy, serde_json::to_vec(&r).unwrap()).unwrap();
    assert_eq!(Store::read(dir.path()).unwrap(), vec![r.clone()]);
    assert!(legacy.exists(), "read-only");
    let (store, records) = Store::open(dir.path(), BOOT).unwrap();
    assert_eq!(records, vec![r]);
    assert!(!legacy.exists());
    assert!(store.dir().join("aaa:eth0.json").exists());
}

#[test]
fn a_torn_record_of_a_previous_boot_is_dropped_one_of_this_boot_stops() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), "boot-1").unwrap();
    store.put(&record("aaa")).unwrap();
    // What a power cut can leave of records written without fsync: a truncated one, an
    // empty one.
    let torn = store.dir().join("bbb:eth0.json");
    fs::write(&torn, b"{\"format\":1,\"sta").unwrap();
    let empty = store.dir().join("ccc:eth0.json");
    fs::write(&empty, b"").unwrap();
    // In the boot the store was opened in, no power cut explains them: stop, naming one.
    let err = Store::open(dir.path(), "boot-1").unwrap_err().to_string();
    assert!(err.contains(":eth0.json"), "{err}");
    assert!(
        torn.exists() && empty.exists(),
        "nothing is lost on an error"
    );
    // After a reboot they are records of a previous boot: dropped, the rest read.
    let (_, records) = Store::open(dir.path(), "boot-2").unwrap();
    assert_eq!(records, vec![record("aaa")]);
    assert!(!torn.exists() && !empty.exists());
    // What a power cut can leave of a recycled file: the complete record it held before,
    // under another attachment's name. Of this boot: stop; of a previous one: dropped.
    let stale = store.dir().join("ddd:eth0.json");
    fs::write(&stale, serde_json::to_vec(&record("eee")).unwrap()).unwrap();
    let err = Store::open(dir.path(), "boot-2").unwrap_err().to_string();
    assert!(
        err.contains("ddd:eth0.json") && err.contains("\"eee\""),
        "{err}"
    );
    let (_, records) = Store::open(dir.path(), "boot-4").unwrap();
    assert_eq!(records, vec![record("aaa")]);
    assert!(!stale.exists());
    // A store of an earlier agent (no boot in store.json, every record fsync'd): stop.
    fs::write(dir.path().join("store.json"), b"{\"format\":1}").unwrap();
    fs::write(&torn, b"{").unwrap();
    assert!(Store::open(dir.path(), "boot-3").is_err());
}

/// The inode of a file, to tell a recycled file from a new one.
fn inode(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path).unwrap().ino()
}

fn spares_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".spare-"))
        .collect();
    names.sort();
    names
}

#[test]
fn files_of_replaced_and_deleted_records_are_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), BOOT).unwrap();
    let a_path = store.dir().join("aaa:eth0.json");
    let mut a = record("aaa");
    store.put(&a).unwrap();
    let pending = inode(&a_path);
    // No spare yet: the commit is a new file, exchanged with the pending one's, which
    // becomes a spare.
    a.state = RecordState::Committed;
    store.put(&a).unwrap();
    let committed = inode(&a_path);
    assert_ne!(committed, pending);
    assert_eq!(spares_in(store.dir()).len(), 1);
    // The next record is written into that spare: no new file.
    let b_path = store.dir().join("bbb:eth0.json");
    let mut b = record("bbb");
    store.put(&b).unwrap();
    assert_eq!(inode(&b_path), pending);
    assert!(spares_in(store.dir()).is_empty());
    // Its commit is a new file again, the pending one's a spare...
    b.state = RecordState::Committed;
    store.put(&b).unwrap();
    let b_committed = inode(&b_path);
    // ...and a deletion gives its file back as a spare, which the next write takes.
    assert_eq!(spares_in(store.dir()).len(), 1);
    store.delete(&a.key()).unwrap();
    assert!(!a_path.exists());
    assert_eq!(spares_in(store.dir()).len(), 2);
    let c = record("ccc");
    store.put(&c).unwrap();
    b.host_if = "flock-b2".into();
    store.put(&b).unwrap();
    let recycled = [pending, committed];
    assert!(recycled.contains(&inode(&store.dir().join("ccc:eth0.json"))));
    assert!(
        recycled.contains(&inode(&b_path)),
        "an exchange, not a new file"
    );
    assert_ne!(inode(&b_path), b_committed);
    // A shorter record over a longer one leaves nothing of the longer behind.
    let mut short = record("ccc");
    short.pod = None;
    store.put(&short).unwrap();
    // Every record reads back whole; a reader beside the agent skips the spares, the next
    // open removes them.
    assert_eq!(
        Store::read(dir.path()).unwrap(),
        vec![b.clone(), short.clone()]
    );
    assert!(!spares_in(store.dir()).is_empty());
    let (store, records) = Store::open(dir.path(), BOOT).unwrap();
    assert_eq!(records, vec![b, short]);
    assert!(spares_in(store.dir()).is_empty());
}

#[test]
fn spares_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), BOOT).unwrap();
    let records: Vec<AllocationRecord> = (0..MAX_SPARES + 10)
        .map(|i| record(&format!("c{i:04}")))
        .collect();
    for r in &records {
        store.put(r).unwrap();
    }
    for r in &records {
        store.delete(&r.key()).unwrap();
    }
    assert_eq!(spares_in(store.dir()).len(), MAX_SPARES);
    assert!(Store::read(dir.path()).unwrap().is_empty());
}

#[test]
fn a_spare_removed_behind_the_agents_back_is_made_anew() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), BOOT).unwrap();
    let mut a = record("aaa");
    store.put(&a).unwrap();
    store.put(&record("bbb")).unwrap();
    store.delete(&record("bbb").key()).unwrap();
    a.state = RecordState::Committed;
    store.put(&a).unwrap();
    assert!(!spares_in(store.dir()).is_empty());
    for spare in spares_in(store.dir()) {
        fs::remove_file(store.dir().join(spare)).unwrap();
    }
    let c = record("ccc");
    store.put(&c).unwrap();
    a.host_if = "flock-a2".into();
    store.put(&a).unwrap();
    assert_eq!(Store::read(dir.path()).unwrap(), vec![a, c]);
}

#[test]
fn a_stocked_store_writes_a_burst_of_pods_into_files_it_already_has() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), BOOT).unwrap();
    assert!(store.claim_stock(), "an open store has no spare");
    assert!(!store.claim_stock(), "one stock at a time");
    assert_eq!(store.stock().unwrap(), SPARE_STOCK);
    assert!(!store.claim_stock(), "stocked");
    let stocked: std::collections::HashSet<u64> = spares_in(store.dir())
        .iter()
        .map(|n| inode(&store.dir().join(n)))
        .collect();
    assert_eq!(stocked.len(), SPARE_STOCK);
    // Each pod's pending and committed writes take a stocked file, and give one back but the
    // one its record keeps: no new file until the stock runs low.
    let pods = SPARE_STOCK - SPARE_LOW;
    let mut written = Vec::new();
    for i in 0..pods {
        let mut r = record(&format!("p{i:04}"));
        store.put(&r).unwrap();
        r.state = RecordState::Committed;
        store.put(&r).unwrap();
        let path = store.dir().join(r.key().file_name());
        assert!(
            stocked.contains(&inode(&path)),
            "{} is a new file",
            path.display()
        );
        written.push(r);
    }
    assert_eq!(spares_in(store.dir()).len(), SPARE_LOW);
    assert!(!store.claim_stock(), "not below the low mark yet");
    store.put(&record("last")).unwrap();
    assert!(store.claim_stock());
    assert_eq!(store.stock().unwrap(), SPARE_STOCK - SPARE_LOW + 1);
    // Stocked spares are empty files: never read as records, removed at the next open.
    written.push(record("last"));
    written.sort_by(|a, b| a.container_id.cmp(&b.container_id));
    let mut read = Store::read(dir.path()).unwrap();
    read.sort_by(|a, b| a.container_id.cmp(&b.container_id));
    assert_eq!(read, written);
    let (store, _) = Store::open(dir.path(), BOOT).unwrap();
    assert!(spares_in(store.dir()).is_empty());
}

#[test]
fn a_spare_is_truncated_whenever_what_it_held_was_longer_or_is_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let long = |cid: &str| {
        let mut r = record(cid);
        r.netns = format!("/run/netns/{}", "x".repeat(400));
        r
    };
    let short = |cid: &str| {
        let mut r = record(cid);
        r.pod = None;
        r
    };
    {
        let (store, _) = Store::open(dir.path(), BOOT).unwrap();
        store.put(&long("aaa")).unwrap();
    }
    // Read at open: the new store does not know how long its file is.
    let (store, records) = Store::open(dir.path(), BOOT).unwrap();
    assert_eq!(records, vec![long("aaa")]);
    // Replaced by a shorter record, the long file becomes a spare of unknown length...
    store.put(&short("aaa")).unwrap();
    assert_eq!(spares_in(store.dir()).len(), 1);
    // ...which the next record is written into, and cut to.
    store.put(&short("bbb")).unwrap();
    assert!(spares_in(store.dir()).is_empty());
    // A deleted record's file is a spare of a length the store wrote.
    store.put(&long("ccc")).unwrap();
    store.delete(&long("ccc").key()).unwrap();
    store.put(&short("ddd")).unwrap();
    // A longer record over a shorter spare needs no cut.
    store.delete(&short("ddd").key()).unwrap();
    store.put(&long("eee")).unwrap();
    // A record whose file was removed behind the agent's back is written anew.
    fs::remove_file(store.dir().join("aaa:eth0.json")).unwrap();
    store.put(&long("aaa")).unwrap();
    let mut read = Store::read(dir.path()).unwrap();
    read.sort_by(|a, b| a.container_id.cmp(&b.container_id));
    assert_eq!(read, vec![long("aaa"), short("bbb"), long("eee")]);
}

/// How many of this process's descriptors are open on files of `dir`.
fn open_in(dir: &Path) -> usize {
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| fs::read_link(e.unwrap().path()).ok())
        .filter(|target| target.parent() == Some(dir))
        .count()
}

#[test]
fn the_store_holds_its_files_open_up_to_a_bound_and_closes_them_with_itself() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), BOOT).unwrap();
    let records_dir = store.dir().to_owned();
    assert!(store.claim_stock());
    assert_eq!(store.stock().unwrap(), SPARE_STOCK);
    assert_eq!(open_in(&records_dir), SPARE_STOCK, "every stocked spare");
    // More pods than files may be held: the writes beyond the bound open their files by
    // name, and every record still reads back whole.
    let mut written = Vec::new();
    for i in 0..OPEN_FILES + 40 {
        let mut r = record(&format!("p{i:04}"));
        store.put(&r).unwrap();
        r.state = RecordState::Committed;
        store.put(&r).unwrap();
        written.push(r);
    }
    assert_eq!(open_in(&records_dir), OPEN_FILES);
    for r in &written[..100] {
        store.delete(&r.key()).unwrap();
    }
    let mut read = Store::read(dir.path()).unwrap();
    read.sort_by(|a, b| a.container_id.cmp(&b.container_id));
    assert_eq!(read, written[100..]);
    drop(store);
    assert_eq!(open_in(&records_dir), 0);
}
