//! `kubectl flock sysdump`: one archive with what a bug report needs — each node's agent and
//! BIRD logs, BIRD's rendered configuration, protocols and routes, the routing tables, the
//! nftables ruleset, the store, the metrics, and the cluster's flock objects. What could not
//! be gathered is written to `errors.txt` in the archive, not left out silently.

use std::io::Write as _;
use std::path::Path;

use flock_agent::inspect::{Dump, NodeReport, Read};
use serde::Serialize;

use crate::error::{Error, Result};

/// A file of the archive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    /// Its path inside the archive.
    pub path: String,
    /// Its size in bytes.
    pub size: usize,
}

/// The archive being assembled.
#[derive(Debug, Default)]
pub struct Archive {
    root: String,
    files: Vec<(String, Vec<u8>)>,
    errors: Vec<String>,
}

impl Archive {
    /// An archive whose files are under `root/`.
    pub fn new(root: &str) -> Archive {
        Archive {
            root: root.to_owned(),
            ..Archive::default()
        }
    }

    /// Adds a file.
    pub fn add(&mut self, path: &str, content: impl Into<Vec<u8>>) {
        self.files
            .push((format!("{}/{path}", self.root), content.into()));
    }

    /// Adds a file from a source that may not have been read (its error goes to
    /// `errors.txt`).
    pub fn add_read(&mut self, path: &str, content: &Read<String>) {
        match content {
            Read::Ok(text) => self.add(path, text.as_bytes()),
            Read::Error(e) => self.error(format!("{path}: {e}")),
        }
    }

    /// Adds a list of objects as YAML, or what kept it from being read.
    pub fn add_list<T: Serialize>(&mut self, path: &str, list: Result<Vec<T>>) {
        match list {
            Ok(l) => self.add(path, yaml(&l)),
            Err(e) => self.error(format!("{path}: {e}")),
        }
    }

    /// Notes what could not be gathered.
    pub fn error(&mut self, what: String) {
        self.errors.push(what);
    }

    /// Adds a node's report: the report itself (without the raw texts) and each raw text.
    pub fn add_node(&mut self, node: &str, mut report: NodeReport) {
        let dump = report.dump.take();
        let json = serde_json::to_vec_pretty(&report).expect("a report serialises");
        self.add(&format!("nodes/{node}/report.json"), json);
        match &report.store {
            Read::Ok(store) => {
                let records: Vec<_> = store.iter().map(|a| &a.record).collect();
                let json = serde_json::to_vec_pretty(&records).expect("records serialise");
                self.add(&format!("nodes/{node}/store.json"), json);
            }
            Read::Error(e) => self.error(format!("nodes/{node}/store.json: {e}")),
        }
        let Some(Dump {
            bird_config,
            bird_protocols,
            bird_routes,
            ip,
            nft,
            metrics,
        }) = dump
        else {
            self.error(format!("nodes/{node}: the agent gave no raw texts"));
            return;
        };
        for (name, text) in [
            ("bird.conf", bird_config),
            ("bird-protocols.txt", bird_protocols),
            ("bird-routes.txt", bird_routes),
            ("ip.txt", ip),
            ("nftables.txt", nft),
            ("metrics.txt", metrics),
        ] {
            self.add_read(&format!("nodes/{node}/{name}"), &text);
        }
    }

    /// Writes the archive (gzip'd tar) to `path`; the entries written, `errors.txt` last
    /// when anything could not be gathered.
    pub fn write(mut self, path: &Path) -> Result<Vec<Entry>> {
        if !self.errors.is_empty() {
            let text = self.errors.join("\n") + "\n";
            self.add("errors.txt", text);
        }
        let io = |source| Error::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::create(path).map_err(io)?;
        let gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
        let mut tar = tar::Builder::new(gz);
        let mut entries = Vec::new();
        for (name, content) in &self.files {
            let mut header = tar::Header::new_gnu();
            header.set_size(content.len() as u64);
            header.set_mode(0o644);
            header.set_mtime(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0),
            );
            header.set_cksum();
            tar.append_data(&mut header, name, content.as_slice())
                .map_err(io)?;
            entries.push(Entry {
                path: name.clone(),
                size: content.len(),
            });
        }
        let mut gz = tar.into_inner().map_err(io)?;
        gz.flush().map_err(io)?;
        gz.finish().map_err(io)?.sync_all().map_err(io)?;
        Ok(entries)
    }
}

/// Objects as YAML.
pub fn yaml<T: Serialize>(v: &T) -> String {
    serde_yaml::to_string(v).unwrap_or_else(|e| format!("# not serialisable: {e}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_readable_archive_and_names_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dump.tar.gz");
        let mut a = Archive::new("flock-sysdump");
        a.add("cluster/nodeconfigs.yaml", "items: []\n");
        a.add_read(
            "nodes/n1/nftables.txt",
            &Read::Error("nft: not found".into()),
        );
        let entries = a.write(&path).unwrap();
        let names: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            names,
            [
                "flock-sysdump/cluster/nodeconfigs.yaml",
                "flock-sysdump/errors.txt"
            ]
        );
        let gz = flate2::read::GzDecoder::new(std::fs::File::open(&path).unwrap());
        let mut tar = tar::Archive::new(gz);
        let mut read = Vec::new();
        for e in tar.entries().unwrap() {
            let mut e = e.unwrap();
            let mut text = String::new();
            std::io::Read::read_to_string(&mut e, &mut text).unwrap();
            read.push((e.path().unwrap().display().to_string(), text));
        }
        assert_eq!(read[1].1, "nodes/n1/nftables.txt: nft: not found\n");
    }
}
