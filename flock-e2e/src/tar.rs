//! A minimal, deterministic ustar writer: directories, regular files and
//! symlinks, owned by root, mtime 0 — enough for an image layer and an OCI
//! archive, and byte-for-byte reproducible so digests are stable.

const BLOCK: usize = 512;

/// Builds a tar archive in memory.
#[derive(Debug, Default)]
pub struct TarBuilder {
    bytes: Vec<u8>,
}

impl TarBuilder {
    /// An empty archive.
    pub fn new() -> TarBuilder {
        TarBuilder::default()
    }

    /// Adds a directory (`name` without trailing slash).
    pub fn dir(&mut self, name: &str, mode: u32) -> &mut Self {
        self.header(&format!("{name}/"), mode, 0, b'5', "");
        self
    }

    /// Adds a regular file with `contents`.
    pub fn file(&mut self, name: &str, mode: u32, contents: &[u8]) -> &mut Self {
        self.header(name, mode, contents.len() as u64, b'0', "");
        self.bytes.extend_from_slice(contents);
        let pad = (BLOCK - contents.len() % BLOCK) % BLOCK;
        self.bytes.extend(std::iter::repeat_n(0u8, pad));
        self
    }

    /// Adds a symbolic link `name` → `target`.
    pub fn symlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.header(name, 0o777, 0, b'2', target);
        self
    }

    /// Closes the archive (two zero blocks) and returns its bytes.
    pub fn finish(mut self) -> Vec<u8> {
        self.bytes.extend(std::iter::repeat_n(0u8, 2 * BLOCK));
        self.bytes
    }

    fn header(&mut self, name: &str, mode: u32, size: u64, kind: u8, link: &str) {
        // Names here are short paths we choose; ustar's 100-byte field is enough.
        assert!(
            name.len() < 100 && link.len() < 100,
            "tar entry name too long: {name}"
        );
        let mut h = [0u8; BLOCK];
        h[..name.len()].copy_from_slice(name.as_bytes());
        octal(&mut h[100..108], u64::from(mode));
        octal(&mut h[108..116], 0); // uid
        octal(&mut h[116..124], 0); // gid
        octal(&mut h[124..136], size);
        octal(&mut h[136..148], 0); // mtime
        h[148..156].fill(b' ');
        h[156] = kind;
        h[157..157 + link.len()].copy_from_slice(link.as_bytes());
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[265..269].copy_from_slice(b"root");
        h[297..301].copy_from_slice(b"root");
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        let field = format!("{sum:06o}\0 ");
        h[148..156].copy_from_slice(field.as_bytes());
        self.bytes.extend_from_slice(&h);
    }
}

/// Writes `value` as zero-padded octal, NUL-terminated, filling `field`.
fn octal(field: &mut [u8], value: u64) {
    let digits = field.len() - 1;
    let text = format!("{value:0digits$o}");
    field[..digits].copy_from_slice(&text.as_bytes()[text.len() - digits..]);
    field[digits] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn system_tar_reads_what_we_write() {
        let mut t = TarBuilder::new();
        t.dir("bin", 0o755)
            .file("bin/hello", 0o755, b"hello world\n")
            .symlink("bin/hi", "hello")
            .file("empty", 0o644, b"");
        let bytes = t.finish();
        assert_eq!(bytes.len() % BLOCK, 0);
        let dir = tempfile::tempdir().expect("tempdir");
        let archive = dir.path().join("t.tar");
        std::fs::write(&archive, &bytes).expect("write tar");
        let out = Command::new("tar")
            .arg("-tvf")
            .arg(&archive)
            .output()
            .expect("run tar");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(listing.contains("drwxr-xr-x root/root"), "{listing}");
        assert!(listing.contains("bin/hello"), "{listing}");
        assert!(listing.contains("bin/hi -> hello"), "{listing}");
        let out = Command::new("tar")
            .arg("-xOf")
            .arg(&archive)
            .arg("bin/hello")
            .output()
            .expect("run tar");
        assert_eq!(out.stdout, b"hello world\n");
    }

    #[test]
    fn archive_is_deterministic() {
        let build = || {
            let mut t = TarBuilder::new();
            t.file("a", 0o644, b"x");
            t.finish()
        };
        assert_eq!(build(), build());
    }
}
