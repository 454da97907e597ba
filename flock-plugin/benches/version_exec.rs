//! The cost a runtime pays per CNI call before flock does any work: exec the
//! release shim with `CNI_COMMAND=VERSION` and wait for its reply.
//!
//! Time the shim as it ships (static, musl), from a copy: `cargo bench` relinks
//! `target/release/flock` with glibc. The command is in `flock-plugin/README.md`.
//! `FLOCK_SHIM_BIN` names the binary (default `target/release/flock`). Goal:
//! median ≤ 2 ms.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use criterion::{Criterion, criterion_group, criterion_main};

fn shim_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("FLOCK_SHIM_BIN") {
        return PathBuf::from(p);
    }
    // flock-plugin → workspace root.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    root.join("target/release/flock")
}

fn version_exec(c: &mut Criterion) {
    let bin = shim_bin();
    assert!(
        bin.exists(),
        "{} not found: build the shim as flock-plugin/README.md says and set FLOCK_SHIM_BIN",
        bin.display()
    );
    let run = || {
        let out = Command::new(&bin)
            .env_clear()
            .env("CNI_COMMAND", "VERSION")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .expect("exec the shim");
        assert!(out.status.success(), "VERSION failed: {out:?}");
        assert!(
            out.stdout.starts_with(b"{\"cniVersion\""),
            "unexpected reply: {out:?}"
        );
        out.stdout.len()
    };
    run();
    c.bench_function("shim_version_exec", |b| b.iter(run));
}

criterion_group!(benches, version_exec);
criterion_main!(benches);
