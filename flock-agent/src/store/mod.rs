//! The allocation store under `--state-dir`: one small JSON record per attachment.
//!
//! Layout: `<state-dir>/store.json` (`{"format":2,"bootId":…}`), `<state-dir>/allocations/slots`
//! (records of up to a page, a page each: below) and `<state-dir>/allocations/
//! <containerId>:<ifName>.json` (a record of its own: one longer than a page, one an earlier
//! agent wrote, or every record once the agent has stopped).
//!
//! # Why records are written atomically but not fsync'd
//!
//! Every record is bound to the boot it was made in: its pod's network namespace, veth and
//! routes live in the kernel, and a reboot takes them all. After a power cut, start-up
//! releases every record of the previous boot whatever it says (DESIGN §7). So a record's
//! durability across a power cut buys nothing; what counts is that a crash of the *agent*
//! (kill -9, an OOM kill, a panic) never leaves a torn record nor loses a committed one. The
//! page cache survives the agent, and a rename is atomic: a record written to another file
//! and then renamed or exchanged onto its name (below) is, after any crash of the process,
//! either its old content or its new one. That costs a few microseconds; two fsyncs cost a
//! few hundred.
//!
//! What a power cut can do to such files — leave a record empty, truncated, missing, or
//! holding what its file held before (below) — is therefore harmless, and start-up tells the
//! two cases apart by the boot ID `store.json` holds (written with fsync, once per start): an
//! unreadable record of a previous boot, or one whose content names another attachment, is
//! dropped with a warning naming it; one of the current boot (which no power cut can
//! explain) stops the agent with an error naming the file — the store never silently starts
//! empty.
//!
//! # Why files are recycled
//!
//! A new file per write costs the filesystem an inode allocated and, once renamed over the
//! record or deleted, one freed: for a pod, two of each (pending, committed, deleted). That
//! is most of a record write's cost, and on ext4 without a journal it grows with every inode
//! freed in the last 30 seconds (the allocator skips them one by one), so a burst of pods
//! slows itself down. So the store keeps the files of replaced and deleted records as
//! *spares* (`.spare-<pid>-<n>`: a dot name, which no reader takes for a record and the next open
//! removes), writes a new record into a spare, and puts it in place with an atomic exchange
//! of names (`renameat2(RENAME_EXCHANGE)`): the record's name gets the new content, and the
//! spare's name the old, ready for the next write. A deleted record's file is renamed to a
//! spare. Every record name still holds, after any crash of the agent, a complete record:
//! a record's file is written in place only as the next section says, everything else is
//! written into spares. (A filesystem without the exchange gets a plain rename over the
//! record.)
//!
//! A pod's two writes still take a file more than they give back (its record keeps one), so
//! a burst of ADDs with no DEL between them would create a file per pod on the request's path
//! (0.04 ms on a quiet ext4, 0.2–0.25 ms after a few thousand files were freed, as a build or
//! the last burst's DELs free them). So, once the slots file below is retired (before, records
//! of up to a page are not files at all), the agent keeps the spares stocked off that path:
//! [`Store::stock`] creates them up to [`SPARE_STOCK`], on a blocking thread, whenever
//! [`Store::claim_stock`] finds them below [`SPARE_LOW`]. Each holds
//! a page of spaces: a record written into it is padded to that length (below), so no write
//! on a request's path extends a file, which costs ext4 a block allocated and the inode's
//! size changed (a pending record written into an empty spare took 0.050–0.055 ms at p50
//! in the bench, 0.035–0.044 when its spare had held a record as long).
//!
//! # Why the store keeps its directory open and remembers its files
//!
//! A record write is a handful of system calls, each of which, given a path, would walk it
//! from `/` again; the store holds the records' directory open and names files relative to
//! it. It also knows which records have a file (those it read at open and wrote since), so a
//! new record is renamed into place without first trying an exchange bound to fail, and how
//! long each file it wrote is, so a record written into a spare that held a longer one is
//! padded with spaces to that length (up to a page; truncated beyond it), rather than the
//! spare being cut. A file it did not write itself (one read at open) counts as of unknown
//! length and is always truncated.
//!
//! # Why the store keeps its files open
//!
//! A file's inode goes from spare to record and back, and only its name changes: so the
//! store keeps the files it created or wrote open (at most [`OPEN_FILES`]), and a write into
//! a spare it holds is one `pwrite`, without the `openat` and `close` around it. A pod's two
//! writes are then a `pwrite` and a rename each. A held spare removed behind the agent's
//! back is found when its rename fails, and made anew.
//!
//! # Why a record's second write goes in place
//!
//! An ADD writes its record twice, pending and then committed, and the rename of the second
//! write was a third of what the store cost an ADD (0.04 ms on ext4 here). So a record whose
//! file the store holds open and whose every version fits in [`IN_PLACE_MAX`] bytes is
//! rewritten in place: the new record, padded with spaces to the length of the old one
//! (JSON ends in any whitespace), in one `pwrite` at offset 0 from a page-aligned buffer of
//! one page. Linux copies such a write into the file's first page in one step: it checks
//! for a fatal signal before a page's copy, not within it, and the copy, from one page to
//! one page, is either whole or, when the buffer's page is unmapped under it, nothing
//! (`generic_perform_write`). So a process killed at any point leaves the file with the old
//! record or the new one. This rests on Linux's page cache, not on POSIX, as flock rests on
//! Linux anyway; it says nothing of a power cut, which the section above makes harmless.
//! One case is left, and it is not the rename's: a copy cut short because the buffer's page
//! was unmapped under it (memory compaction moving it) during those few hundred nanoseconds,
//! in a process whose SIGKILL arrived in that same instant, would leave the new record's
//! beginning before the old one's end. A test kills a process rewriting a record a hundred
//! times and reads it back whole each time (`store::tests`); the same test, with the write
//! split in two, finds a torn record within a few kills. A short or failed write, or a file
//! no longer linked (removed or replaced behind the agent's back), falls back to the
//! exchange, which puts a whole record in place whatever the file holds.
//!
//! # Why records live in the pages of one file
//!
//! Even recycled, a record file is a name, and a name costs the directory: a pod's pending
//! record renamed into place and its deleted record renamed to a spare are two finds and two
//! insertions in ext4's hashed directory (0.02–0.03 ms each here, the most of what the store
//! cost an ADD and a DEL). So a record of up to a page is not a file: it is a page of the
//! slots file (`allocations/slots`), written in place as a record's second write above is, in
//! one `pwrite` of a page from a page-aligned buffer at a page-aligned offset, whole after any
//! kill for the same reasons. A blank page (spaces) holds no record: a deleted record's page
//! is blanked, and a new record takes a blank page. [`Store::stock`] appends blank pages off
//! any request's path, as it stocked spares, so that no ADD extends the file.
//!
//! A record's page is found only by reading the file, so the file is read whole at open: a
//! page is a record, blank, or (as a record file can be) torn by a power cut or damage, and
//! the same rules apply, naming the file and the page. A record longer than a page gets a file
//! of its own as before; one that has a file of its own keeps it (a record of an earlier agent,
//! for one) and when both a page and a file hold an attachment (a record that outgrew its page
//! and was written into a file, then its page blanked, with a crash between), the file is the
//! newer and the page is blanked at open.
//!
//! An earlier agent reads record files only. So that a rollback finds every record, the
//! agent writes the slots' records into files of their own when it stops
//! ([`Store::retire_slots`]), removes the slots file and marks `store.json` with format 1;
//! while the slots file may hold records, `store.json` says format 2, which an earlier agent
//! refuses to open (naming the format) rather than start without them.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use flock_rpc::durable;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

mod read;
mod slots;
#[cfg(test)]
mod tests;

pub use slots::{SLOT_LOW, SLOT_STOCK, SLOTS_FILE};

/// The format of a record, and of a store whose every record is a file of its own.
pub const STORE_FORMAT: u32 = 1;

/// The format `store.json` says while the slots file may hold records (module documentation).
pub const SLOTS_STORE_FORMAT: u32 = 2;

/// Where an allocation is in its life cycle (DESIGN §7).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RecordState {
    /// Addresses chosen, the kernel may be half-programmed: undone at start-up.
    Pending,
    /// The kernel is programmed and the result was (or will be) returned.
    Committed,
}

/// The pod an allocation belongs to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID, when the runtime passed one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
}

/// One attachment's allocation: everything needed to rebuild its CNI result, check or tear
/// down its kernel state, and release its addresses.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AllocationRecord {
    /// The record format (`STORE_FORMAT`).
    pub format: u32,
    /// Pending or committed.
    pub state: RecordState,
    /// The CNI network name (GC is scoped to it).
    pub network: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub if_name: String,
    /// `CNI_NETNS` at ADD.
    pub netns: String,
    /// The kernel boot ID at ADD: a different one at start-up means the netns is gone.
    pub boot_id: String,
    /// The pod, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
    /// The pod's IPv6 address (a /128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<Ipv6Addr>,
    /// The pod's IPv4 address (a /32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<Ipv4Addr>,
    /// Extra fixed addresses (`addresses` annotation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<IpAddr>,
    /// Anycast addresses (`anycast` annotation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub anycast: Vec<IpAddr>,
    /// MTU of the veth pair.
    pub mtu: u32,
    /// The host-side veth.
    pub host_if: String,
    /// Host veth MAC, once known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host_mac: String,
    /// Pod interface MAC, once known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_mac: String,
    /// The secondary network (`spec.networks[].name`) the addresses come from; absent: the
    /// cluster network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flock_network: Option<String>,
    /// Whether the pod's default routes go through this attachment (absent: true, as every
    /// record of the cluster network).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub default_route: bool,
    /// Destinations the pod routes through this attachment besides the default routes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<ipnet::IpNet>,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

impl AllocationRecord {
    /// The attachment key: `(containerId, ifName)`.
    pub fn key(&self) -> AttachmentKey {
        AttachmentKey {
            container_id: self.container_id.clone(),
            if_name: self.if_name.clone(),
        }
    }

    /// Every address this record holds in the pools (pod addresses and fixed ones; anycast
    /// addresses are shared and not pooled).
    pub fn pooled_addresses(&self) -> Vec<IpAddr> {
        let mut v: Vec<IpAddr> = Vec::new();
        v.extend(self.ipv6.map(IpAddr::V6));
        v.extend(self.ipv4.map(IpAddr::V4));
        v.extend(self.addresses.iter().copied());
        v
    }
}

/// Identifies one attachment (CNI's container ID and interface name).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AttachmentKey {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub if_name: String,
}

impl AttachmentKey {
    /// The record's file: `<containerId>:<ifName>.json`. Neither part can hold a `:` (the
    /// shim's and the agent's validation refuse it), so no two keys share a file.
    pub(crate) fn file_name(&self) -> String {
        format!("{}:{}.json", self.container_id, self.if_name)
    }

    /// The file name of earlier agents (`<containerId>.<ifName>.json`), ambiguous (`a.b` +
    /// `c` and `a` + `b.c`): still read, and renamed when the agent opens the store.
    pub(crate) fn legacy_file_name(&self) -> String {
        format!("{}.{}.json", self.container_id, self.if_name)
    }
}

/// The durable store.
#[derive(Debug)]
pub struct Store {
    /// The state directory, holding `store.json` and `dir`.
    state_dir: PathBuf,
    /// The boot the store was opened in, for `store.json`.
    boot_id: String,
    dir: PathBuf,
    /// `dir`, open: every file is named relative to it.
    dir_fd: OwnedFd,
    /// The slots file, until [`Store::retire_slots`].
    slots: Mutex<Option<slots::Slots>>,
    spares: Mutex<Spares>,
    /// A [`Store::stock`] is claimed ([`Store::claim_stock`]) and not finished.
    stocking: AtomicBool,
    /// How many of its files the store holds open ([`Kept`]), at most [`OPEN_FILES`].
    kept: Arc<AtomicUsize>,
}

/// At most this many spare files are kept; a deleted record beyond them is unlinked.
const MAX_SPARES: usize = 256;

/// How many spares [`Store::stock`] keeps ready: a node's pods coming up at once (kubelet's
/// default of 110 pods a node) write no new file.
pub const SPARE_STOCK: usize = 128;

/// Below this many spares, [`Store::claim_stock`] asks for a [`Store::stock`].
pub const SPARE_LOW: usize = 32;

/// At most this many of its files the store keeps open (module documentation): the spare
/// stock and a node's pods (kubelet's default is 110) fit, far below the 1024 descriptors a
/// process may open by default. A file beyond them is opened by name when written.
pub const OPEN_FILES: usize = 256;

/// The longest record the store rewrites in place (module documentation): one page, the
/// smallest page size of every architecture Linux runs on.
pub const IN_PLACE_MAX: usize = 4096;

/// A buffer of one page, aligned to a page: a record rewritten in place is copied from it.
#[repr(C, align(4096))]
struct Page([u8; IN_PLACE_MAX]);

impl Page {
    /// What to write over a file holding `held` bytes ([`UNKNOWN_LEN`] if unknown) so that
    /// it ends up holding `bytes` and nothing of its old content: `bytes` followed by spaces
    /// up to `held` (JSON lets a record end in any whitespace), and that length, when both
    /// fit a page; `None` when they do not (then the file must be cut).
    fn over(bytes: &[u8], held: u64) -> Option<(Box<Page>, usize)> {
        let len = usize::try_from(held).ok()?.max(bytes.len());
        if len > IN_PLACE_MAX {
            return None;
        }
        Some((Page::padded(bytes), len))
    }

    /// `bytes` (at most a page) followed by spaces to a page's end.
    fn padded(bytes: &[u8]) -> Box<Page> {
        let mut page = Box::new(Page(BLANK_PAGE));
        page.0[..bytes.len()].copy_from_slice(bytes);
        page
    }
}

/// What a stocked spare holds: a page of spaces (module documentation).
const BLANK_PAGE: [u8; IN_PLACE_MAX] = [b' '; IN_PLACE_MAX];

/// The length of a file the store did not write itself: a spare of that length is truncated
/// whatever it is given.
const UNKNOWN_LEN: u64 = u64::MAX;

/// The files of replaced and deleted records, to be written again, and the records' files
/// (module documentation).
#[derive(Debug, Default)]
struct Spares {
    /// Each spare's name in the directory and what the store knows of it.
    files: Vec<(String, Known)>,
    /// Each record's file name and what the store knows of it.
    records: HashMap<String, Known>,
    /// This process's ID, for the spare names (`.spare-<pid>-<n>`).
    pid: u32,
    /// The filesystem refused `RENAME_EXCHANGE`: records are renamed over instead.
    no_exchange: bool,
}

/// What the store knows of one of its files.
#[derive(Debug)]
struct Known {
    /// The length of what it holds ([`UNKNOWN_LEN`] for a file read at open).
    len: u64,
    /// The file, while the store holds it open.
    file: Option<Kept>,
}

impl Known {
    /// A file the store did not write itself.
    fn unknown() -> Known {
        Known {
            len: UNKNOWN_LEN,
            file: None,
        }
    }
}

/// One of the files the store holds open; counted in [`Store::kept`] while it lives.
#[derive(Debug)]
struct Kept {
    file: File,
    count: Arc<AtomicUsize>,
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoreMeta {
    format: u32,
    /// The boot in which the agent last opened the store (absent in stores of earlier
    /// agents, which fsync'd every record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    boot_id: Option<String>,
}

impl Store {
    /// Opens (creating if needed) the store in `state_dir` in the boot `boot_id` and reads
    /// every record.
    ///
    /// Leftover temp files of interrupted writes are removed. A record that cannot be read
    /// or parsed is dropped with a warning when the store was last opened in another boot (a
    /// power cut), and is an error naming the file otherwise.
    pub fn open(state_dir: &Path, boot_id: &str) -> Result<(Store, Vec<AllocationRecord>)> {
        let dir = state_dir.join("allocations");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|source| Error::Store {
                op: "create directory",
                path: dir.clone(),
                source,
            })?;
        let previous_boot = read::check_meta(state_dir)?.and_then(|m| m.boot_id);
        let torn = match previous_boot {
            Some(b) if b != boot_id => read::Torn::DropWithWarning,
            _ => read::Torn::Stop,
        };
        let mut records = read::read_records(&dir, read::Access::Owner(torn))?;
        let named: HashSet<AttachmentKey> = records.iter().map(AllocationRecord::key).collect();
        let in_slots = read::read_slots(&dir, read::Access::Owner(torn), &named)?;
        // Durably, once per start: what tells the next start whether a torn record can
        // come from a power cut, and an earlier agent that the slots file may hold records.
        write_meta(state_dir, SLOTS_STORE_FORMAT, boot_id)?;
        let dir_fd = File::open(&dir)
            .map_err(|source| Error::Store {
                op: "open directory",
                path: dir.clone(),
                source,
            })?
            .into();
        let held = in_slots
            .records
            .iter()
            .map(|(page, r)| (r.key().file_name(), *page))
            .collect();
        let slots = slots::Slots::new(
            in_slots
                .file
                .expect("the agent's own open holds the slots file"),
            in_slots.count,
            in_slots.blank,
            held,
        );
        // No spares yet: the read removed the last run's, with every other dot file.
        let store = Store {
            state_dir: state_dir.to_owned(),
            boot_id: boot_id.to_owned(),
            dir,
            dir_fd,
            slots: Mutex::new(Some(slots)),
            spares: Mutex::new(Spares {
                records: records
                    .iter()
                    .map(|r| (r.key().file_name(), Known::unknown()))
                    .collect(),
                pid: std::process::id(),
                ..Spares::default()
            }),
            stocking: AtomicBool::new(false),
            kept: Arc::default(),
        };
        records.extend(in_slots.records.into_iter().map(|(_, r)| r));
        records.sort_by_key(AllocationRecord::key);
        Ok((store, records))
    }

    /// Reads every record without changing anything: safe beside a running agent (its
    /// in-flight temporary files are skipped, not removed). A state directory without a
    /// store holds no record.
    pub fn read(state_dir: &Path) -> Result<Vec<AllocationRecord>> {
        let dir = state_dir.join("allocations");
        if read::check_meta(state_dir)?.is_none() && !dir.exists() {
            return Ok(Vec::new());
        }
        // The slots first: an agent that stops meanwhile writes their records into files
        // before it removes the slots file (`Store::retire_slots`), so each is read in one or
        // the other, and a file wins, as at open.
        let in_slots = read::read_slots(&dir, read::Access::ReadOnly, &HashSet::new())?;
        let mut records = read::read_records(&dir, read::Access::ReadOnly)?;
        let named: HashSet<AttachmentKey> = records.iter().map(AllocationRecord::key).collect();
        records.extend(
            in_slots
                .records
                .into_iter()
                .map(|(_, r)| r)
                .filter(|r| !named.contains(&r.key())),
        );
        records.sort_by_key(AllocationRecord::key);
        Ok(records)
    }

    /// Writes (creates or replaces) a record atomically (see the module documentation for
    /// why without fsync): into its page of the slots file, or a blank one, when it fits a
    /// page and has no file of its own; into a file of its own otherwise ([`Store::put_file`]),
    /// and then its page, if it had one, is blanked.
    pub fn put(&self, record: &AllocationRecord) -> Result<()> {
        let bytes = serde_json::to_vec(record).expect("serialize allocation record");
        let name = record.key().file_name();
        if bytes.len() <= IN_PLACE_MAX && !self.spares().records.contains_key(&name) {
            let mut slots = self.slots.lock().expect("store slots lock");
            if let Some(slots) = slots.as_mut() {
                return slots.put(&name, &bytes).map_err(|source| Error::Store {
                    op: "write a page of",
                    path: self.dir.join(SLOTS_FILE),
                    source,
                });
            }
        }
        self.put_file(&name, &bytes)?;
        self.blank_page(&name).map(drop)
    }

    /// Blanks the record `name`'s page of the slots file; `false` when it has none.
    fn blank_page(&self, name: &str) -> Result<bool> {
        match self.slots.lock().expect("store slots lock").as_mut() {
            Some(slots) => slots.remove(name).map_err(|source| Error::Store {
                op: "blank a page of",
                path: self.dir.join(SLOTS_FILE),
                source,
            }),
            None => Ok(false),
        }
    }

    /// Writes the record `name` into a file of its own: into a spare file (a new one when
    /// there is none) exchanged with the record's name, whose old file becomes a spare, or
    /// renamed to it when there is no record yet (see the module documentation for why
    /// spares).
    fn put_file(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let name = name.to_owned();
        if self.rewrite_in_place(&name, bytes) {
            return Ok(());
        }
        let Taken { spare, known, old } = self.take_spare(&name);
        let held_open = known.as_ref().is_some_and(|k| k.file.is_some());
        let exchange = old.is_some() && !self.spares().no_exchange;
        let outcome = self.fill(&spare, known, bytes).and_then(|written| {
            match self.place(&spare, &name, exchange) {
                // The spare's name was removed behind the agent's back while the store held
                // its file open (someone tidied the dot files): made anew, placed again.
                Err((_, nix::errno::Errno::ENOENT)) if held_open => {
                    drop(written);
                    let written = self.fill(&spare, None, bytes)?;
                    self.place(&spare, &name, exchange)
                        .map(|placed| (written, placed))
                }
                placed => placed.map(|placed| (written, placed)),
            }
            .map_err(|(op, source)| Error::Store {
                op,
                path: self.dir.join(&name),
                source: source.into(),
            })
        });
        let mut spares = self.spares();
        match outcome {
            Ok((written, placed)) => {
                spares.records.insert(name, written);
                // Exchanged, the spare's name holds the record's old file: a spare again.
                // Renamed over, the old file is gone.
                if let (Placed::Exchanged, Some(old)) = (placed, old) {
                    spares.files.push((spare, old));
                }
                Ok(())
            }
            Err(e) => {
                // The record's file is as it was.
                if let Some(old) = old {
                    spares.records.insert(name, old);
                }
                drop(spares);
                // Whatever it holds now, it is a dot file: the next open removes it anyway.
                self.remove(&spare);
                Err(e)
            }
        }
    }

    /// Rewrites the record `name` in its own file when the store holds that file open, knows
    /// its length and both it and `bytes` fit in [`IN_PLACE_MAX`] (module documentation);
    /// `false` when it did not, and then whatever the file holds is left to the exchange of
    /// [`Store::put`] to replace.
    fn rewrite_in_place(&self, name: &str, bytes: &[u8]) -> bool {
        let (page, len, kept) = {
            let mut spares = self.spares();
            match spares.records.remove(name) {
                Some(Known {
                    len,
                    file: Some(kept),
                }) if let Some((page, len)) = Page::over(bytes, len) => (page, len, kept),
                Some(other) => {
                    spares.records.insert(name.to_owned(), other);
                    return false;
                }
                None => return false,
            }
        };
        // Still the record's file: one removed or renamed over behind the agent's back has
        // no link left; it is let go, and the exchange makes the record anew.
        let linked = kept.file.metadata().is_ok_and(|m| {
            use std::os::unix::fs::MetadataExt;
            m.nlink() > 0
        });
        let written = linked
            && kept
                .file
                .write_at(&page.0[..len], 0)
                .is_ok_and(|n| n == len);
        let known = match (written, linked) {
            (true, _) => Known {
                len: len as u64,
                file: Some(kept),
            },
            // A short or failed write: the exchange replaces the file, whatever it holds.
            (false, true) => Known {
                len: UNKNOWN_LEN,
                file: Some(kept),
            },
            (false, false) => Known::unknown(),
        };
        self.spares().records.insert(name.to_owned(), known);
        written
    }

    /// Puts the written spare `spare` in the record `name`'s place: exchanged with the
    /// record's file when `exchange` (it has one), renamed to it otherwise. On failure, the
    /// step that failed and its error.
    fn place(
        &self,
        spare: &str,
        name: &str,
        exchange: bool,
    ) -> std::result::Result<Placed, (&'static str, nix::errno::Errno)> {
        if exchange {
            match nix::fcntl::renameat2(
                &self.dir_fd,
                spare,
                &self.dir_fd,
                name,
                nix::fcntl::RenameFlags::RENAME_EXCHANGE,
            ) {
                Ok(()) => return Ok(Placed::Exchanged),
                // The record's file is gone (removed behind the agent's back): the spare
                // becomes it.
                Err(nix::errno::Errno::ENOENT) => {}
                Err(
                    nix::errno::Errno::EINVAL
                    | nix::errno::Errno::EOPNOTSUPP
                    | nix::errno::Errno::ENOSYS,
                ) => {
                    self.spares().no_exchange = true;
                }
                Err(e) => return Err(("exchange a spare file with", e)),
            }
        }
        // A new record (or a filesystem without the exchange): renamed into place.
        nix::fcntl::renameat(&self.dir_fd, spare, &self.dir_fd, name)
            .map(|()| Placed::Renamed)
            .map_err(|e| ("rename a spare file to", e))
    }

    /// Deletes a record; a missing record is not an error. Its page of the slots file is
    /// blanked; a file of its own is kept as a spare while there are fewer than
    /// [`MAX_SPARES`]. (A deletion a power cut undoes brings back a record of the previous
    /// boot, which start-up releases.)
    pub fn delete(&self, key: &AttachmentKey) -> Result<()> {
        let name = key.file_name();
        if self.blank_page(&name)? && !self.spares().records.contains_key(&name) {
            return Ok(());
        }
        let (spare, known) = {
            let mut spares = self.spares();
            let known = spares.records.remove(&name).unwrap_or_else(Known::unknown);
            let spare = (spares.files.len() < MAX_SPARES).then(|| spares.name());
            (spare, known)
        };
        let outcome = match &spare {
            Some(spare) => {
                nix::fcntl::renameat(&self.dir_fd, name.as_str(), &self.dir_fd, spare.as_str())
            }
            None => nix::unistd::unlinkat(
                &self.dir_fd,
                name.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            ),
        };
        match outcome {
            Ok(()) => {
                if let Some(spare) = spare {
                    self.spares().files.push((spare, known));
                }
                Ok(())
            }
            Err(nix::errno::Errno::ENOENT) => Ok(()),
            Err(source) => Err(Error::Store {
                op: "delete",
                path: self.dir.join(name),
                source: source.into(),
            }),
        }
    }

    /// Whether the caller should run [`Store::stock`] now: the slots file's blank pages are
    /// below [`SLOT_LOW`] (or, once it is retired, the spares below [`SPARE_LOW`]) and no other
    /// stock is claimed. A `true` claims it; [`Store::stock`] releases it.
    pub fn claim_stock(&self) -> bool {
        let low = match self.slots.lock().expect("store slots lock").as_ref() {
            Some(slots) => slots.low(),
            None => self.spares().files.len() < SPARE_LOW,
        };
        low && self
            .stocking
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Appends blank pages to the slots file until [`SLOT_STOCK`] are blank (or, once it is
    /// retired, creates spare files of a page of spaces until there are [`SPARE_STOCK`]): a
    /// few milliseconds, for a blocking thread, off any request's path. Returns how many pages
    /// or files it added. Records written meanwhile are written as usual.
    pub fn stock(&self) -> Result<usize> {
        let outcome = self.stock_pages();
        self.stocking.store(false, Ordering::Release);
        outcome
    }

    fn stock_pages(&self) -> Result<usize> {
        /// Pages appended with the lock held, at most: records are written meanwhile.
        const CHUNK: usize = 16;
        let mut added = 0;
        loop {
            let mut slots = self.slots.lock().expect("store slots lock");
            let Some(slots) = slots.as_mut() else {
                drop(slots);
                return self.stock_files().map(|files| added + files);
            };
            match slots.stock(CHUNK) {
                Ok(0) => return Ok(added),
                Ok(n) => added += n,
                Err(source) => {
                    return Err(Error::Store {
                        op: "append blank pages to",
                        path: self.dir.join(SLOTS_FILE),
                        source,
                    });
                }
            }
        }
    }

    /// Writes every record of the slots file into a file of its own, removes the slots file
    /// and marks `store.json` with [`STORE_FORMAT`], so that an earlier agent reads the store
    /// whole (module documentation); every record is written into a file of its own from then
    /// on. For an agent that stops; returns how many records it moved. On an error, the slots
    /// file stays, and `store.json` says so.
    pub fn retire_slots(&self) -> Result<usize> {
        // Held throughout: no record is written into a page meanwhile.
        let mut guard = self.slots.lock().expect("store slots lock");
        let Some(slots) = guard.as_ref() else {
            return Ok(0);
        };
        let slots_path = self.dir.join(SLOTS_FILE);
        let records = slots.records().map_err(|source| Error::Store {
            op: "read",
            path: slots_path.clone(),
            source,
        })?;
        for (name, bytes) in &records {
            self.put_file(name, bytes)?;
        }
        nix::unistd::unlinkat(
            &self.dir_fd,
            SLOTS_FILE,
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        )
        .map_err(|source| Error::Store {
            op: "remove",
            path: slots_path,
            source: source.into(),
        })?;
        *guard = None;
        write_meta(&self.state_dir, STORE_FORMAT, &self.boot_id)?;
        Ok(records.len())
    }

    fn stock_files(&self) -> Result<usize> {
        let mut created = 0;
        loop {
            let spare = {
                let spares = self.spares();
                if spares.files.len() >= SPARE_STOCK {
                    return Ok(created);
                }
                spares.name()
            };
            // Created without the lock held: writers go on taking the spares there are.
            match self.fill(&spare, None, &BLANK_PAGE) {
                Ok(known) => self.spares().files.push((spare, known)),
                Err(e) => {
                    self.remove(&spare);
                    return Err(e);
                }
            }
            created += 1;
        }
    }

    /// A spare file to write the record `name` into: its name and what the store knows of it
    /// (`None`: still to be created), and the record's own file, taken out of the records
    /// for the write (`None`: the record has none yet).
    fn take_spare(&self, name: &str) -> Taken {
        let mut spares = self.spares();
        let old = spares.records.remove(name);
        let (spare, known) = match spares.files.pop() {
            Some((file, known)) => (file, Some(known)),
            None => (spares.name(), None),
        };
        Taken { spare, known, old }
    }

    /// Holds `file` open, unless [`OPEN_FILES`] are already held.
    fn keep(&self, file: File) -> Option<Kept> {
        if self.kept.fetch_add(1, Ordering::Relaxed) >= OPEN_FILES {
            self.kept.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(Kept {
            file,
            count: self.kept.clone(),
        })
    }

    /// Writes `bytes` into the spare file `spare`: a new one (`known` is `None`; mode 0600
    /// whatever the umask), or an existing one, through the file the store holds open or
    /// opened by name, overwritten in place (no new inode) and, when `bytes` is shorter than
    /// what it held, padded with spaces to that length when it fits a page, truncated
    /// otherwise. Returns what the store knows of the spare then.
    fn fill(&self, spare: &str, known: Option<Known>, bytes: &[u8]) -> Result<Known> {
        use nix::fcntl::OFlag;
        use nix::sys::stat::Mode;
        let step = |op: &'static str| {
            move |source: std::io::Error| Error::Store {
                op,
                path: self.dir.join(spare),
                source,
            }
        };
        let open = |flags: OFlag| {
            nix::fcntl::openat(
                &self.dir_fd,
                spare,
                flags | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o600),
            )
            .map(File::from)
            .map_err(std::io::Error::from)
        };
        let existing = match known {
            None => None,
            Some(Known {
                len,
                file: Some(kept),
            }) => Some((Handle::Kept(kept), len)),
            Some(Known { len, file: None }) => match open(OFlag::empty()) {
                Ok(file) => Some((Handle::Opened(file), len)),
                // Removed behind the agent's back (someone tidied the dot files): made anew.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(step("open the spare file")(e)),
            },
        };
        let (handle, held) = match existing {
            Some(found) => found,
            None => {
                // Not `O_EXCL`: a dot file of that name can only be a leftover (a removal at
                // open that failed), which `O_TRUNC` empties.
                let file =
                    open(OFlag::O_CREAT | OFlag::O_TRUNC).map_err(step("create the spare file"))?;
                file.set_permissions(fs::Permissions::from_mode(0o600))
                    .map_err(step("chmod the spare file"))?;
                (Handle::Opened(file), 0)
            }
        };
        let file = match &handle {
            Handle::Kept(kept) => &kept.file,
            Handle::Opened(file) => file,
        };
        // Shorter than what the spare held: padded with spaces when that fits a page (a cut
        // is a second system call and a truncation in the filesystem's journal: 0.015 ms of
        // every ADD whose pending record went into a deleted one's file), cut otherwise.
        let over = Page::over(bytes, held);
        let bytes = match &over {
            Some((page, len)) => &page.0[..*len],
            None => bytes,
        };
        file.write_all_at(bytes, 0)
            .map_err(step("write the spare file"))?;
        if (bytes.len() as u64) < held {
            file.set_len(bytes.len() as u64)
                .map_err(step("truncate the spare file"))?;
        }
        let file = match handle {
            Handle::Kept(kept) => Some(kept),
            Handle::Opened(file) => self.keep(file),
        };
        Ok(Known {
            len: bytes.len() as u64,
            file,
        })
    }

    /// Removes a file of the directory, whatever it is; a failure is left to the next open.
    fn remove(&self, name: &str) {
        let _ = nix::unistd::unlinkat(&self.dir_fd, name, nix::unistd::UnlinkatFlags::NoRemoveDir);
    }

    fn spares(&self) -> std::sync::MutexGuard<'_, Spares> {
        self.spares.lock().expect("store spares lock")
    }

    /// Whether a record could be written now: creates and removes an empty file in the
    /// records' directory (no fsync: this asks the filesystem, it stores nothing). Cheap
    /// enough for every STATUS. The name is not a record's (no `.json`), so a crash between
    /// the two steps leaves a file the loader skips.
    pub fn probe_writable(&self) -> Result<()> {
        static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = self.dir.join(format!(".probe-{n}"));
        fs::write(&path, b"").map_err(|source| Error::Store {
            op: "write a probe file in",
            path: path.clone(),
            source,
        })?;
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::Store {
                op: "remove the probe file",
                path,
                source,
            }),
        }
    }

    /// The directory holding the records.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// What [`Store::take_spare`] hands a write.
struct Taken {
    spare: String,
    known: Option<Known>,
    old: Option<Known>,
}

/// How [`Store::place`] put a record in place.
#[derive(Clone, Copy)]
enum Placed {
    Exchanged,
    Renamed,
}

/// A spare being written: a file the store held open, or one opened for the write.
enum Handle {
    Kept(Kept),
    Opened(File),
}

/// Spare names handed out so far in this process, by every store: `n` of `.spare-<pid>-<n>`.
static SPARES_NAMED: AtomicU64 = AtomicU64::new(0);

impl Spares {
    /// A new spare name: `.spare-<pid>-<n>`, as the temporary files of `flock_rpc::durable`
    /// carry the pid. `n` counts across the process, not the store: a store opened again in
    /// the same process (an agent restarted in place, a test's restart) while the last one's
    /// [`Store::stock`] still runs must not be handed a name that one creates with `O_TRUNC`,
    /// or the spaces it writes land in a record written meanwhile into that file.
    fn name(&self) -> String {
        let n = SPARES_NAMED.fetch_add(1, Ordering::Relaxed) + 1;
        format!(".spare-{}-{n}", self.pid)
    }
}

/// Writes `store.json`, durably: the store's format and the boot it was opened in.
fn write_meta(state_dir: &Path, format: u32, boot_id: &str) -> Result<()> {
    let bytes = serde_json::to_vec(&StoreMeta {
        format,
        boot_id: Some(boot_id.to_owned()),
    })
    .expect("serialize store meta");
    write_durably(state_dir, "store.json", &bytes, 0o600)
}

/// Writes `bytes` to `dir/name` so that after a crash the file holds either its old content
/// or the new one, never a mix (`flock_rpc::durable`, shared with the shim's DEL queue).
pub fn write_durably(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> Result<()> {
    durable::write_file(dir, name, bytes, mode)
        .map(drop)
        .map_err(store_error)
}

pub(crate) fn store_error(e: durable::DurableError) -> Error {
    Error::Store {
        op: e.op,
        path: e.path,
        source: e.source,
    }
}
