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

/// A store whose every record is written into a file of its own, as after
/// [`Store::retire_slots`]: for the tests of record files.
fn open_files(dir: &Path) -> (Store, Vec<AllocationRecord>) {
    let (store, records) = Store::open(dir, BOOT).unwrap();
    store.retire_slots().unwrap();
    (store, records)
}

/// The inode of a file, to tell a recycled file from a new one.
fn inode(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path).unwrap().ino()
}

/// The names of the files in `dir` that `wanted` takes, sorted.
fn names_in(dir: &Path, wanted: impl Fn(&str) -> bool) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| wanted(n))
        .collect();
    names.sort();
    names
}

fn spares_in(dir: &Path) -> Vec<String> {
    names_in(dir, |n| n.starts_with(".spare-"))
}

/// A pod's pending record and its committed one, as an ADD writes them (longer: the MACs).
fn pending_and_committed(cid: &str) -> (AllocationRecord, AllocationRecord) {
    let pending = record(cid);
    let mut committed = pending.clone();
    committed.state = RecordState::Committed;
    committed.host_mac = "02:00:00:00:00:01".into();
    committed.pod_mac = "02:00:00:00:00:02".into();
    (pending, committed)
}

#[test]
fn a_records_next_write_goes_in_place_padded_to_what_the_file_held() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = open_files(dir.path());
    let path = store.dir().join("aaa:eth0.json");
    let (pending, committed) = pending_and_committed("aaa");
    store.put(&pending).unwrap();
    let file = inode(&path);
    // The commit is written over the pending record: the same file, no spare given back.
    store.put(&committed).unwrap();
    assert_eq!(inode(&path), file);
    assert!(spares_in(store.dir()).is_empty());
    let long = fs::metadata(&path).unwrap().len();
    assert_eq!(long, serde_json::to_vec(&committed).unwrap().len() as u64);
    // A shorter record over it is padded with spaces to the file's length, not cut.
    store.put(&pending).unwrap();
    assert_eq!(inode(&path), file);
    assert_eq!(fs::metadata(&path).unwrap().len(), long);
    let bytes = fs::read(&path).unwrap();
    let json = serde_json::to_vec(&pending).unwrap();
    assert_eq!(&bytes[..json.len()], json.as_slice());
    assert!(bytes[json.len()..].iter().all(|b| *b == b' '), "{bytes:?}");
    // Both readers read it back whole.
    assert_eq!(Store::read(dir.path()).unwrap(), vec![pending.clone()]);
    store.put(&committed).unwrap();
    let (_, records) = open_files(dir.path());
    assert_eq!(records, vec![committed]);
}

#[test]
fn a_record_longer_than_a_page_or_of_unknown_length_is_exchanged_not_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = open_files(dir.path());
    let path = store.dir().join("aaa:eth0.json");
    let (pending, mut committed) = pending_and_committed("aaa");
    committed.netns = format!("/run/netns/{}", "x".repeat(IN_PLACE_MAX));
    store.put(&pending).unwrap();
    let file = inode(&path);
    store.put(&committed).unwrap();
    assert_ne!(
        inode(&path),
        file,
        "a record of more than a page is exchanged"
    );
    assert_eq!(spares_in(store.dir()).len(), 1);
    // Read at open, a record's length is unknown: its next write is exchanged too.
    let (short, _) = pending_and_committed("bbb");
    store.put(&short).unwrap();
    drop(store);
    let (store, _) = open_files(dir.path());
    let b_path = store.dir().join("bbb:eth0.json");
    let file = inode(&b_path);
    store.put(&short).unwrap();
    assert_ne!(inode(&b_path), file);
    // Written by this store, it goes in place from then on.
    let file = inode(&b_path);
    store.put(&short).unwrap();
    assert_eq!(inode(&b_path), file);
}

#[test]
fn a_record_removed_or_replaced_behind_the_agents_back_is_not_written_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = open_files(dir.path());
    let (pending, committed) = pending_and_committed("aaa");
    let path = store.dir().join("aaa:eth0.json");
    store.put(&pending).unwrap();
    fs::remove_file(&path).unwrap();
    store.put(&committed).unwrap();
    assert_eq!(Store::read(dir.path()).unwrap(), vec![committed.clone()]);
    // Renamed over: the file the store holds is no longer the record's.
    let stranger = store.dir().join("elsewhere");
    fs::write(&stranger, serde_json::to_vec(&committed).unwrap()).unwrap();
    fs::rename(&stranger, &path).unwrap();
    store.put(&pending).unwrap();
    assert_eq!(Store::read(dir.path()).unwrap(), vec![pending]);
}

/// Where [`in_place_writer`] keeps its store, when a test starts it.
const WRITER_DIR: &str = "FLOCK_TEST_IN_PLACE_WRITER_DIR";

/// Set (to anything) when [`in_place_writer`] is to write its record into a file of its own
/// rather than a page of the slots file.
const WRITER_FILES: &str = "FLOCK_TEST_IN_PLACE_WRITER_FILES";

/// The process [`a_record_rewritten_in_place_is_whole_after_any_kill`] starts and kills:
/// rewrites one record in place, in two versions of different lengths, until killed: in the
/// slots file's third page, or in its own file. Run alone, it returns at once.
#[test]
#[ignore = "a helper process of a_record_rewritten_in_place_is_whole_after_any_kill"]
fn in_place_writer() {
    use std::io::Write as _;
    let Some(dir) = std::env::var_os(WRITER_DIR) else {
        return;
    };
    let (store, records) = Store::open(Path::new(&dir), BOOT).unwrap();
    let (pending, committed) = pending_and_committed("aaa");
    if std::env::var_os(WRITER_FILES).is_some() {
        store.retire_slots().unwrap();
    } else if records.is_empty() {
        // Two pages before the record's: its writes land at an offset, not at the start.
        store.put(&record("a0")).unwrap();
        store.put(&record("a1")).unwrap();
    }
    // In a file, the first write after an open is an exchange; every later one goes in place.
    store.put(&pending).unwrap();
    store.put(&committed).unwrap();
    let mut out = std::io::stdout();
    writeln!(out, "\nwriting").unwrap();
    out.flush().unwrap();
    loop {
        store.put(&pending).unwrap();
        store.put(&committed).unwrap();
    }
}

#[test]
fn a_record_rewritten_in_place_is_whole_after_any_kill() {
    use std::io::BufRead as _;
    let (pending, committed) = pending_and_committed("aaa");
    let mut rng: u64 = 0x2545_f491_4f6c_dd1d;
    for files in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let others = if files {
            vec![]
        } else {
            vec![record("a0"), record("a1")]
        };
        for kill in 0..100 {
            let mut writer = std::process::Command::new(std::env::current_exe().unwrap());
            writer
                .args([
                    "--exact",
                    "store::tests::in_place_writer",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(WRITER_DIR, dir.path())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null());
            if files {
                writer.env(WRITER_FILES, "1");
            }
            let mut writer = writer.spawn().unwrap();
            let said = std::io::BufReader::new(writer.stdout.take().unwrap());
            assert!(
                said.lines()
                    .map_while(std::result::Result::ok)
                    .any(|l| l.trim_end() == "writing"),
                "the writer did not start"
            );
            // Somewhere in its loop: up to 2 ms of rewrites, a few microseconds each.
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            std::thread::sleep(std::time::Duration::from_micros(rng % 2000));
            writer.kill().unwrap();
            writer.wait().unwrap();
            // The agent's own start-up in the same boot: a torn record would stop it.
            let (_, records) = Store::open(dir.path(), BOOT)
                .unwrap_or_else(|e| panic!("files {files}, after kill {kill}: {e}"));
            let with = |r: &AllocationRecord| {
                let mut all = others.clone();
                all.push(r.clone());
                all.sort_by_key(AllocationRecord::key);
                all
            };
            assert!(
                records == with(&pending) || records == with(&committed),
                "files {files}, after kill {kill}: {records:?}"
            );
        }
    }
}

#[test]
fn files_of_replaced_and_deleted_records_are_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let long = |cid: &str| {
        let mut r = record(cid);
        r.netns = format!("/run/netns/{}", "x".repeat(IN_PLACE_MAX));
        r
    };
    let (store, _) = open_files(dir.path());
    let a_path = store.dir().join("aaa:eth0.json");
    let mut a = long("aaa");
    store.put(&a).unwrap();
    let first = inode(&a_path);
    // No spare yet: a record of more than a page is replaced by a new file, exchanged with
    // its old one, which becomes a spare.
    a.state = RecordState::Committed;
    store.put(&a).unwrap();
    let second = inode(&a_path);
    assert_ne!(second, first);
    assert_eq!(spares_in(store.dir()).len(), 1);
    // The next record is written into that spare: no new file.
    let b_path = store.dir().join("bbb:eth0.json");
    let mut b = record("bbb");
    store.put(&b).unwrap();
    assert_eq!(inode(&b_path), first);
    assert!(spares_in(store.dir()).is_empty());
    // A deletion gives its file back as a spare, which the next write takes.
    store.delete(&a.key()).unwrap();
    assert!(!a_path.exists());
    assert_eq!(spares_in(store.dir()).len(), 1);
    let c = record("ccc");
    store.put(&c).unwrap();
    assert_eq!(inode(&store.dir().join("ccc:eth0.json")), second);
    // A shorter record written into a longer spare is padded to its length, not cut (it
    // reads back whole below)...
    b.state = RecordState::Committed;
    store.put(&b).unwrap();
    store.delete(&b.key()).unwrap();
    let short = {
        let mut r = record("ddd");
        r.pod = None;
        r
    };
    store.put(&short).unwrap();
    let d_path = store.dir().join("ddd:eth0.json");
    let len = |path: &Path| fs::metadata(path).unwrap().len();
    assert_eq!(len(&d_path), serde_json::to_vec(&b).unwrap().len() as u64);
    // ...unless what it held was longer than a page: then it is cut.
    store.delete(&short.key()).unwrap();
    store.put(&long("fff")).unwrap();
    store.delete(&long("fff").key()).unwrap();
    store.put(&short).unwrap();
    assert_eq!(
        len(&d_path),
        serde_json::to_vec(&short).unwrap().len() as u64
    );
    // Every record reads back whole; a reader beside the agent skips the spares, the next
    // open removes them.
    store.put(&long("eee")).unwrap();
    store.put(&long("eee")).unwrap();
    assert_eq!(
        Store::read(dir.path()).unwrap(),
        vec![c.clone(), short.clone(), long("eee")]
    );
    assert!(!spares_in(store.dir()).is_empty());
    let (store, records) = open_files(dir.path());
    assert_eq!(records, vec![c, short, long("eee")]);
    assert!(spares_in(store.dir()).is_empty());
}

#[test]
fn spares_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = open_files(dir.path());
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
    let (store, _) = open_files(dir.path());
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

/// An agent restarted in the same process (as the handler tests restart theirs) opens the
/// store again while the last store's stock may still be creating spares: the two must never
/// name the same file, or the last one's `O_TRUNC` and page of spaces land in a record the new
/// one wrote into it (CI once read such a record: "EOF while parsing a value at line 1 column
/// 4096", a page of spaces under a record's name).
#[test]
fn two_stores_in_one_process_never_share_a_spare() {
    let dir = tempfile::tempdir().unwrap();
    let (before, _) = open_files(dir.path());
    let (after, _) = open_files(dir.path());
    for store in [&after, &before] {
        assert!(store.claim_stock());
        assert_eq!(store.stock().unwrap(), SPARE_STOCK);
    }
    let names = |s: &Store| -> std::collections::HashSet<String> {
        s.spares().files.iter().map(|(n, _)| n.clone()).collect()
    };
    let (b, a) = (names(&before), names(&after));
    assert!(
        b.is_disjoint(&a),
        "{} spare names shared",
        b.intersection(&a).count()
    );
    assert_eq!(spares_in(after.dir()).len(), 2 * SPARE_STOCK);
    // Each store's writes take its own spares and read back whole.
    let mut written = Vec::new();
    for (i, store) in [&after, &before, &after].into_iter().enumerate() {
        let (pending, committed) = pending_and_committed(&format!("p{i}"));
        store.put(&pending).unwrap();
        store.put(&committed).unwrap();
        written.push(committed);
    }
    assert_eq!(Store::read(dir.path()).unwrap(), written);
}

#[test]
fn a_stocked_store_writes_a_burst_of_pods_into_files_it_already_has() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = open_files(dir.path());
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
    // Stocked spares are pages of spaces, and records written into them are padded to a
    // page: the spares are never read as records, and removed at the next open.
    assert_eq!(
        fs::metadata(store.dir().join("last:eth0.json"))
            .unwrap()
            .len(),
        IN_PLACE_MAX as u64
    );
    written.push(record("last"));
    written.sort_by(|a, b| a.container_id.cmp(&b.container_id));
    let mut read = Store::read(dir.path()).unwrap();
    read.sort_by(|a, b| a.container_id.cmp(&b.container_id));
    assert_eq!(read, written);
    let (store, _) = open_files(dir.path());
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
        let (store, _) = open_files(dir.path());
        store.put(&long("aaa")).unwrap();
    }
    // Read at open: the new store does not know how long its file is.
    let (store, records) = open_files(dir.path());
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
    let (store, _) = open_files(dir.path());
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

/// Where [`Store::put`] put the record `cid`: the page of the slots file, if any.
fn page_of(store: &Store, cid: &str) -> Option<u64> {
    let name = record(cid).key().file_name();
    let slots = store.slots.lock().unwrap();
    slots.as_ref().and_then(|s| s.page(&name))
}

fn slots_len(dir: &Path) -> u64 {
    fs::metadata(dir.join(SLOTS_FILE)).unwrap().len()
}

fn record_files(dir: &Path) -> Vec<String> {
    names_in(dir, |n| n.ends_with(".json"))
}

#[test]
fn records_of_up_to_a_page_are_pages_of_the_slots_file() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), BOOT).unwrap();
    let (a_pending, a_committed) = pending_and_committed("aaa");
    store.put(&a_pending).unwrap();
    store.put(&a_committed).unwrap();
    store.put(&record("bbb")).unwrap();
    // No file of their own: two pages, the commit over the pending record's.
    assert!(record_files(store.dir()).is_empty());
    assert_eq!(slots_len(store.dir()), 2 * IN_PLACE_MAX as u64);
    assert_eq!(page_of(&store, "aaa"), Some(0));
    let bytes = fs::read(store.dir().join(SLOTS_FILE)).unwrap();
    let json = serde_json::to_vec(&a_committed).unwrap();
    assert_eq!(&bytes[..json.len()], json.as_slice());
    assert!(bytes[json.len()..IN_PLACE_MAX].iter().all(|b| *b == b' '));
    // A deleted record's page is blanked, and the next record takes it.
    store.delete(&a_committed.key()).unwrap();
    assert!(bytes_of_page(store.dir(), 0).iter().all(|b| *b == b' '));
    store.delete(&a_committed.key()).unwrap();
    store.put(&record("ccc")).unwrap();
    assert_eq!(page_of(&store, "ccc"), Some(0));
    assert_eq!(slots_len(store.dir()), 2 * IN_PLACE_MAX as u64);
    // Both readers read them back; the agent's open and its writes go on in the same pages.
    assert_eq!(
        Store::read(dir.path()).unwrap(),
        vec![record("bbb"), record("ccc")]
    );
    drop(store);
    let (store, records) = Store::open(dir.path(), BOOT).unwrap();
    assert_eq!(records, vec![record("bbb"), record("ccc")]);
    store.delete(&record("bbb").key()).unwrap();
    store.put(&record("ddd")).unwrap();
    assert_eq!(page_of(&store, "ddd"), Some(1));
    assert_eq!(
        Store::read(dir.path()).unwrap(),
        vec![record("ccc"), record("ddd")]
    );
}

fn bytes_of_page(dir: &Path, page: usize) -> Vec<u8> {
    let bytes = fs::read(dir.join(SLOTS_FILE)).unwrap();
    bytes[page * IN_PLACE_MAX..(page + 1) * IN_PLACE_MAX].to_vec()
}

#[test]
fn a_stocked_store_writes_a_burst_of_pods_without_extending_the_slots_file() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), BOOT).unwrap();
    assert!(store.claim_stock(), "an open store has no blank page");
    assert!(!store.claim_stock(), "one stock at a time");
    assert_eq!(store.stock().unwrap(), SLOT_STOCK);
    assert!(!store.claim_stock(), "stocked");
    let stocked = slots_len(store.dir());
    assert_eq!(stocked, (SLOT_STOCK * IN_PLACE_MAX) as u64);
    let mut written = Vec::new();
    for i in 0..SLOT_STOCK - SLOT_LOW {
        let (pending, committed) = pending_and_committed(&format!("p{i:04}"));
        store.put(&pending).unwrap();
        store.put(&committed).unwrap();
        written.push(committed);
    }
    assert_eq!(slots_len(store.dir()), stocked, "no page appended");
    assert!(!store.claim_stock(), "not below the low mark yet");
    store.put(&record("zzz")).unwrap();
    written.push(record("zzz"));
    assert!(store.claim_stock());
    assert_eq!(store.stock().unwrap(), SLOT_STOCK - SLOT_LOW + 1);
    assert!(record_files(store.dir()).is_empty());
    assert_eq!(Store::read(dir.path()).unwrap(), written);
    let (_, records) = Store::open(dir.path(), BOOT).unwrap();
    assert_eq!(records, written);
}

#[test]
fn a_record_that_outgrows_its_page_gets_a_file_which_wins_over_the_page() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), BOOT).unwrap();
    let small = record("aaa");
    let mut big = small.clone();
    big.state = RecordState::Committed;
    big.netns = format!("/run/netns/{}", "x".repeat(IN_PLACE_MAX));
    store.put(&small).unwrap();
    assert_eq!(page_of(&store, "aaa"), Some(0));
    store.put(&big).unwrap();
    assert_eq!(page_of(&store, "aaa"), None, "its page is blanked");
    assert_eq!(record_files(store.dir()), ["aaa:eth0.json"]);
    // It keeps its file, even once it fits a page again; its deletion removes the file.
    store.put(&small).unwrap();
    assert_eq!(page_of(&store, "aaa"), None);
    assert_eq!(Store::read(dir.path()).unwrap(), vec![small.clone()]);
    store.put(&big).unwrap();
    // A crash between the file's write and the page's blanking: the file is the newer.
    slots::write_page(
        &File::options()
            .write(true)
            .open(store.dir().join(SLOTS_FILE))
            .unwrap(),
        0,
        &serde_json::to_vec(&small).unwrap(),
    )
    .unwrap();
    assert_eq!(Store::read(dir.path()).unwrap(), vec![big.clone()]);
    drop(store);
    let (store, records) = Store::open(dir.path(), BOOT).unwrap();
    assert_eq!(records, vec![big.clone()]);
    assert!(bytes_of_page(store.dir(), 0).iter().all(|b| *b == b' '));
    store.delete(&big.key()).unwrap();
    assert!(record_files(store.dir()).is_empty());
    assert!(Store::read(dir.path()).unwrap().is_empty());
}

#[test]
fn retired_slots_leave_a_store_of_record_files_only() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), BOOT).unwrap();
    let meta = || -> serde_json::Value {
        serde_json::from_slice(&fs::read(dir.path().join("store.json")).unwrap()).unwrap()
    };
    assert_eq!(meta()["format"], SLOTS_STORE_FORMAT);
    let (pending, committed) = pending_and_committed("aaa");
    store.put(&committed).unwrap();
    store.put(&record("bbb")).unwrap();
    assert!(store.claim_stock());
    store.stock().unwrap();
    assert_eq!(store.retire_slots().unwrap(), 2);
    assert_eq!(store.retire_slots().unwrap(), 0, "once");
    // What an earlier agent reads: format 1, a file per record, no slots file.
    assert_eq!(meta()["format"], STORE_FORMAT);
    assert_eq!(meta()["bootId"], BOOT);
    assert!(!store.dir().join(SLOTS_FILE).exists());
    assert_eq!(
        record_files(store.dir()),
        ["aaa:eth0.json", "bbb:eth0.json"]
    );
    let file: AllocationRecord =
        serde_json::from_slice(&fs::read(store.dir().join("aaa:eth0.json")).unwrap()).unwrap();
    assert_eq!(file, committed);
    // Writes go on in files of their own, the padding of the pages left behind.
    store.put(&pending).unwrap();
    store.put(&record("ccc")).unwrap();
    store.delete(&record("bbb").key()).unwrap();
    assert_eq!(
        record_files(store.dir()),
        ["aaa:eth0.json", "ccc:eth0.json"]
    );
    assert_eq!(
        Store::read(dir.path()).unwrap(),
        vec![pending.clone(), record("ccc")]
    );
    // Opened again, the store has a slots file for new records; the old keep their files.
    drop(store);
    let (store, records) = Store::open(dir.path(), BOOT).unwrap();
    assert_eq!(records, vec![pending, record("ccc")]);
    assert_eq!(meta()["format"], SLOTS_STORE_FORMAT);
    store.put(&committed).unwrap();
    store.put(&record("ddd")).unwrap();
    assert_eq!(page_of(&store, "aaa"), None);
    assert_eq!(page_of(&store, "ddd"), Some(0));
}

#[test]
fn a_torn_page_of_a_previous_boot_is_blanked_one_of_this_boot_stops() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), BOOT).unwrap();
    store.put(&record("aaa")).unwrap();
    store.put(&record("bbb")).unwrap();
    let slots_path = store.dir().join(SLOTS_FILE);
    drop(store);
    let file = File::options().write(true).open(&slots_path).unwrap();
    slots::write_page(&file, 1, b"{\"format\":1,\"sta").unwrap();
    // Of this boot: nothing but damage explains it.
    let err = Store::open(dir.path(), BOOT).unwrap_err().to_string();
    assert!(
        err.contains("allocations/slots") && err.contains("page 1"),
        "{err}"
    );
    assert!(Store::read(dir.path()).is_err(), "read-only too");
    // Two pages holding one attachment: the same.
    slots::write_page(&file, 1, &serde_json::to_vec(&record("aaa")).unwrap()).unwrap();
    let err = Store::open(dir.path(), BOOT).unwrap_err().to_string();
    assert!(
        err.contains("page 1") && err.contains("as page 0 does"),
        "{err}"
    );
    // Of a previous boot: a power cut's, dropped and its page blanked.
    slots::write_page(&file, 1, b"{\"format\":1,\"sta").unwrap();
    let (store, records) = Store::open(dir.path(), "boot-2").unwrap();
    assert_eq!(records, vec![record("aaa")]);
    assert!(bytes_of_page(store.dir(), 1).iter().all(|b| *b == b' '));
    store.put(&record("ccc")).unwrap();
    assert_eq!(page_of(&store, "ccc"), Some(1));
    // A record of another format is not guessed at.
    let mut other = record("ddd");
    other.format = 9;
    slots::write_page(&file, 2, &serde_json::to_vec(&other).unwrap()).unwrap();
    let err = Store::open(dir.path(), "boot-3").unwrap_err().to_string();
    assert!(err.contains("page 2: record format 9"), "{err}");
}

#[test]
fn a_store_of_either_format_opens() {
    for format in [STORE_FORMAT, SLOTS_STORE_FORMAT] {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("store.json"),
            format!("{{\"format\":{format},\"bootId\":\"{BOOT}\"}}"),
        )
        .unwrap();
        Store::open(dir.path(), BOOT).unwrap();
        assert!(Store::read(dir.path()).unwrap().is_empty());
    }
}
