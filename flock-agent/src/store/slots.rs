//! The slots file: records of up to a page, each in a page of its own, rewritten in place
//! (the module documentation of `store` says why).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use super::{IN_PLACE_MAX, Page};

/// The slots file's name in the records' directory: no `.json`, so no reader of record files
/// takes it for one.
pub const SLOTS_FILE: &str = "slots";

/// How many blank pages [`Store::stock`](super::Store::stock) keeps ready in the slots file:
/// a node's pods coming up at once (kubelet's default of 110 pods a node) extend no file.
pub const SLOT_STOCK: usize = 128;

/// Below this many blank pages, [`Store::claim_stock`](super::Store::claim_stock) asks for a
/// stock.
pub const SLOT_LOW: usize = 32;

/// The length of a page of the slots file.
const PAGE: u64 = IN_PLACE_MAX as u64;

/// The slots file, open for reading and writing, and which of its pages hold which record.
#[derive(Debug)]
pub(super) struct Slots {
    file: File,
    /// How many pages the file holds (its last may be short: written whole when it is used).
    count: u64,
    /// Pages that hold no record.
    blank: Vec<u64>,
    /// Each record in the file, by its file name (`AttachmentKey::file_name`), and its page.
    held: HashMap<String, u64>,
}

impl Slots {
    pub(super) fn new(file: File, count: u64, blank: Vec<u64>, held: HashMap<String, u64>) -> Self {
        Slots {
            file,
            count,
            blank,
            held,
        }
    }

    /// The record `name`'s page, if the file holds it.
    #[cfg(test)]
    pub(super) fn page(&self, name: &str) -> Option<u64> {
        self.held.get(name).copied()
    }

    /// Writes `bytes` (at most a page) as the record `name`: over its page, or into a blank
    /// one (the file's next page when none is left). The page is the record's from then on,
    /// whatever the write does: a failed write may have landed, and a later write or
    /// removal of the record must go to the same page.
    pub(super) fn put(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let page = match self.held.get(name) {
            Some(&page) => page,
            None => {
                let page = self.blank.pop().unwrap_or_else(|| {
                    self.count += 1;
                    self.count - 1
                });
                self.held.insert(name.to_owned(), page);
                page
            }
        };
        write_page(&self.file, page, bytes)
    }

    /// Blanks the record `name`'s page; `false` when the file does not hold it.
    pub(super) fn remove(&mut self, name: &str) -> io::Result<bool> {
        let Some(&page) = self.held.get(name) else {
            return Ok(false);
        };
        write_page(&self.file, page, b"")?;
        self.held.remove(name);
        self.blank.push(page);
        Ok(true)
    }

    /// Whether fewer than [`SLOT_LOW`] pages are blank.
    pub(super) fn low(&self) -> bool {
        self.blank.len() < SLOT_LOW
    }

    /// Appends blank pages, at most `most`, towards [`SLOT_STOCK`]; how many it appended.
    pub(super) fn stock(&mut self, most: usize) -> io::Result<usize> {
        let n = SLOT_STOCK.saturating_sub(self.blank.len()).min(most);
        if n == 0 {
            return Ok(0);
        }
        let spaces = vec![b' '; n * IN_PLACE_MAX];
        self.file.write_all_at(&spaces, self.count * PAGE)?;
        // Popped from the end: the lowest of them first.
        self.blank.extend((self.count..self.count + n as u64).rev());
        self.count += n as u64;
        Ok(n)
    }

    /// Every record in the file: its name and what its page holds, without the padding.
    pub(super) fn records(&self) -> io::Result<Vec<(String, Vec<u8>)>> {
        let mut out = Vec::with_capacity(self.held.len());
        for (name, &page) in &self.held {
            let mut bytes = vec![0; IN_PLACE_MAX];
            let n = read_page(&self.file, page, &mut bytes)?;
            bytes.truncate(n);
            out.push((name.clone(), trim(&bytes).to_vec()));
        }
        out.sort();
        Ok(out)
    }
}

/// Writes `bytes`, padded with spaces to a page, over page `page` of `file`, in one `pwrite`
/// from a page-aligned buffer (the module documentation of `store` says why that is whole
/// after a kill).
pub(super) fn write_page(file: &File, page: u64, bytes: &[u8]) -> io::Result<()> {
    match file.write_at(&Page::padded(bytes).0, page * PAGE)? {
        n if n == IN_PLACE_MAX => Ok(()),
        n => Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("wrote {n} of a page's {IN_PLACE_MAX} bytes"),
        )),
    }
}

/// Reads page `page` of `file` into `buf` (a page long); how many bytes it holds (fewer for a
/// short last page).
pub(super) fn read_page(file: &File, page: u64, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], page * PAGE + n as u64)? {
            0 => break,
            read => n += read,
        }
    }
    Ok(n)
}

/// How many pages a file of `len` bytes holds.
pub(super) fn pages(len: u64) -> u64 {
    len.div_ceil(PAGE)
}

/// A page without its padding: a blank page (spaces, or zeros the filesystem filled a hole
/// with) is empty.
pub(super) fn trim(bytes: &[u8]) -> &[u8] {
    let end = bytes
        .iter()
        .rposition(|&b| b != b' ' && b != 0)
        .map_or(0, |i| i + 1);
    &bytes[..end]
}
