//! flock's own binaries as a cluster runs them: the agent, the pool controller and the shim,
//! built by cargo, the shim linked statically against musl.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::sys;

/// The packages of flock's image: the agent, the pool controller and the shim.
pub const FLOCK: &[&str] = &["flock-agent", "flock-controller", "flock-plugin"];

/// Builds `packages` (`--release`, or the dev profile) and returns their directory
/// (`target/release` or `target/debug`).
///
/// The shim (`flock-plugin`) is linked statically, against musl rather than glibc
/// ([`shim_rustc_flags`], `flock-plugin/musl.specs`, Debian's `musl-dev`, installed when
/// missing). Static: the runtime execs it on the host, whose C library may be older than the
/// builder's, and an exec that loads no shared objects is about 0.3 ms faster. musl: glibc's
/// start-up sizes the CPU's caches with about 70 `CPUID` instructions, and in a virtual machine
/// each traps to the hypervisor; a static glibc shim took 0.54 ms of CPU per `VERSION` here,
/// the musl one takes 0.10 ms (`perf stat -r 500`). `cargo rustc` gives the flags to that one
/// binary; in `RUSTFLAGS` they would reach the proc-macro crates, which cannot be linked
/// statically.
pub fn build(packages: &[&str], release: bool) -> Result<PathBuf> {
    let dir = target_dir().join(if release { "release" } else { "debug" });
    let profile: &[&str] = if release { &["--release"] } else { &[] };
    let others: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| *p != "flock-plugin")
        .collect();
    if !others.is_empty() {
        let mut args = vec!["build"];
        args.extend(profile);
        for p in &others {
            args.extend(["-p", p]);
        }
        sys::cargo(args)?;
    }
    if packages.contains(&"flock-plugin") {
        sys::ensure_packages(&["musl-dev"])?;
        let specs = workspace_root().join("flock-plugin/musl.specs");
        let mut args: Vec<String> = vec!["rustc".into()];
        args.extend(profile.iter().map(|s| s.to_string()));
        args.extend(["-p", "flock-plugin", "--bin", "flock", "--"].map(String::from));
        args.extend(shim_rustc_flags(&specs));
        sys::cargo(args)?;
    }
    Ok(dir)
}

/// Builds the shim as [`build`] does (dev profile) and copies it to
/// `target/debug/node-shim/flock`, out of the way of cargo, which puts its own (glibc) link
/// back in `target/debug` on its next build of `flock-plugin`; returns the copy's path.
pub fn build_shim_copy() -> Result<PathBuf> {
    let dir = build(&["flock-plugin"], false)?;
    let copy_dir = dir.join("node-shim");
    std::fs::create_dir_all(&copy_dir).with_context(|| format!("create {}", copy_dir.display()))?;
    // Absolute: the tests that exec it run in their package's directory.
    let copy = std::path::absolute(copy_dir.join("flock"))
        .with_context(|| format!("resolve {}", copy_dir.display()))?;
    // Not over the file: a test of the last run may still hold it open for exec.
    let part = copy_dir.join("flock.part");
    std::fs::copy(dir.join("flock"), &part)
        .with_context(|| format!("copy the shim to {}", part.display()))?;
    std::fs::rename(&part, &copy).with_context(|| format!("rename to {}", copy.display()))?;
    Ok(copy)
}

/// What `cargo rustc -p flock-plugin --bin flock -- …` is given to link the shim statically
/// against musl with `specs` (`flock-plugin/musl.specs`); `deploy/Dockerfile` and
/// `docs/install.md` spell the same flags.
/// - `--cfg flock_musl` defines the one glibc symbol the standard library's unwinder needs.
/// - `-C linker=gcc`: for the default `cc`, rustc links with its own `lld` and puts that
///   directory first among gcc's search prefixes, where the specs' `-L .%s` (gcc's own
///   directory, for `libgcc_eh`) would find it instead.
pub fn shim_rustc_flags(specs: &Path) -> Vec<String> {
    vec![
        "--cfg".into(),
        "flock_musl".into(),
        "-C".into(),
        "target-feature=+crt-static".into(),
        "-C".into(),
        "linker=gcc".into(),
        "-C".into(),
        format!("link-arg=-specs={}", specs.display()),
    ]
}

/// Cargo's target folder ([`crate::sys::use_target_dir`], else `CARGO_TARGET_DIR`, else
/// `target/` of the workspace).
pub fn target_dir() -> PathBuf {
    chosen_target_dir().unwrap_or_else(|| workspace_root().join("target"))
}

/// The target folder chosen for every cargo ([`crate::sys::use_target_dir`], else
/// `CARGO_TARGET_DIR`), if one was: a crate of a workspace of its own (`fuzz/`) builds there too.
pub fn chosen_target_dir() -> Option<PathBuf> {
    crate::sys::target_dir_override()
        .map(Path::to_owned)
        .or_else(|| std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from))
}

/// The workspace's root folder.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}
