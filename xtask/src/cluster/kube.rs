//! Kubernetes from Debian's archive, built once into a cache keyed by version.
//!
//! No registry ships Kubernetes binaries to this machine, but Debian's archive ships the whole
//! source of Kubernetes 1.20.2 (vendored dependencies included) as the source package
//! `kubernetes`, and Go 1.19 as `golang-go`. [`ensure_built`] fetches the source package
//! (adding a `deb-src` entry when the machine has none), applies Debian's patches and the one
//! fix Go 1.19 needs (the vendored `reflect2` 1.0.1 crashes the apiserver the first time a
//! custom resource is written: it is replaced by Debian's 1.0.2), builds the binaries the
//! cluster and the e2e suite run, and copies them to [`KubeBuild::bin`]. The stamp file is
//! written last, so an interrupted build is simply redone; the Go build cache under
//! [`CACHE_DIR`] makes a rebuild take minutes instead of ten. The compiler runs under
//! `nice -n 19`, so it never slows other work on the machine down more than it must.

use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::sys;

/// Everything flock's automation caches across runs (kept by CI between jobs).
pub const CACHE_DIR: &str = "/var/cache/flock";
/// Kubernetes' version, as the binaries report it.
pub const VERSION: &str = "1.20.2";
/// The version of Debian's source package `kubernetes` that holds [`VERSION`] (bookworm).
pub const DEBIAN_VERSION: &str = "1.20.5+really1.20.2-1.1+deb12u1";
/// The binaries built, as `make WHAT=` names their packages.
const TARGETS: &[&str] = &[
    "cmd/kube-apiserver",
    "cmd/kube-controller-manager",
    "cmd/kube-scheduler",
    "cmd/kubelet",
    "cmd/kube-proxy",
    "cmd/kubectl",
    "test/e2e/e2e.test",
    "test/images/agnhost",
    // The suite's runner: runs `e2e.test` as parallel processes sharing one BeforeSuite.
    "vendor/github.com/onsi/ginkgo/ginkgo",
];
/// Debian packages the build needs.
const BUILD_PACKAGES: &[&str] = &[
    "golang-go",
    "golang-github-modern-go-reflect2-dev",
    "rsync",
    "make",
    "patch",
    "xz-utils",
];
/// Where the `deb-src` entry is added when apt has none.
const DEB_SRC_FILE: &str = "/etc/apt/sources.list.d/flock-deb-src.sources";
const DEB_SRC: &str =
    "# Added by `cargo xtask cluster`: Debian's source packages, for `apt-get source kubernetes`.
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
";
/// Where Debian's `golang-github-modern-go-reflect2-dev` puts reflect2 1.0.2.
const REFLECT2_SRC: &str = "/usr/share/gocode/src/github.com/modern-go/reflect2";
/// A build that makes no progress for this long is stuck (the cold build takes about 10
/// minutes of two busy cores).
const BUILD_LIMIT: Duration = Duration::from_secs(60 * 60);

/// A finished build: where its binaries are.
#[derive(Debug, Clone)]
pub struct KubeBuild {
    /// `kube-apiserver`, `kubelet`, `kubectl`, … (see [`TARGETS`]).
    pub bin: PathBuf,
}

impl KubeBuild {
    /// The path of one binary.
    pub fn tool(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }
}

/// `/var/cache/flock/kubernetes-1.20.2`.
pub fn version_dir() -> PathBuf {
    Path::new(CACHE_DIR).join(format!("kubernetes-{VERSION}"))
}

/// The stamp written last by a complete build; it names the source package.
fn stamp() -> PathBuf {
    version_dir().join("BUILT")
}

/// Returns the cached build, building it first when the cache has none (printing progress).
pub fn ensure_built() -> Result<KubeBuild> {
    let build = KubeBuild {
        bin: version_dir().join("bin"),
    };
    let complete = std::fs::read_to_string(stamp())
        .is_ok_and(|s| s.lines().next() == Some(DEBIAN_VERSION) && s.contains(FLOCK_FIXES))
        && TARGETS.iter().all(|t| build.tool(binary_name(t)).exists());
    if complete {
        return Ok(build);
    }
    let started = Instant::now();
    eprintln!(
        "cluster: building Kubernetes {VERSION} from Debian's source package {DEBIAN_VERSION} \
         into {} (once; about 10 minutes of two cores cold, 2 with a warm Go cache)",
        version_dir().display()
    );
    build_from_source(&build).with_context(|| {
        format!(
            "build Kubernetes {VERSION} (log: {})",
            version_dir().join("build.log").display()
        )
    })?;
    let took = started.elapsed();
    std::fs::write(
        stamp(),
        format!(
            "{DEBIAN_VERSION}\n{FLOCK_FIXES}\nbuilt in {:.0} s\n",
            took.as_secs_f64()
        ),
    )
    .with_context(|| format!("write {}", stamp().display()))?;
    eprintln!(
        "cluster: Kubernetes {VERSION} built in {}:{:02} min",
        took.as_secs() / 60,
        took.as_secs() % 60
    );
    Ok(build)
}

fn binary_name(target: &str) -> &str {
    target.rsplit('/').next().unwrap_or(target)
}

fn build_from_source(build: &KubeBuild) -> Result<()> {
    ensure_deb_src()?;
    sys::ensure_packages(BUILD_PACKAGES)?;
    let dir = version_dir();
    let download = dir.join("download");
    std::fs::create_dir_all(&download).with_context(|| format!("create {}", download.display()))?;
    let orig = download.join(format!(
        "kubernetes_{}.orig.tar.gz",
        DEBIAN_VERSION.split('-').next().unwrap_or(DEBIAN_VERSION)
    ));
    let debian = download.join(format!("kubernetes_{DEBIAN_VERSION}.debian.tar.xz"));
    if !orig.exists() || !debian.exists() {
        eprintln!("cluster: apt-get source --download-only kubernetes={DEBIAN_VERSION}");
        let out = Command::new("apt-get")
            .args(["source", "--download-only", "-qq"])
            .arg(format!("kubernetes={DEBIAN_VERSION}"))
            .current_dir(&download)
            .output()
            .context("spawn apt-get source")?;
        if !out.status.success() || !orig.exists() {
            bail!(
                "apt-get source --download-only kubernetes={DEBIAN_VERSION} failed ({}): {}\n\
                 (is Debian's archive reachable, and its deb-src index current? `apt-get update`)",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    // The tree's path stays the same from one build to the next, so the Go build cache
    // (which hashes source paths) is reused.
    let tree = dir.join("src");
    if tree.exists() {
        std::fs::remove_dir_all(&tree).with_context(|| format!("remove {}", tree.display()))?;
    }
    std::fs::create_dir_all(&tree).with_context(|| format!("create {}", tree.display()))?;
    eprintln!("cluster: unpacking {}", orig.display());
    run_quiet(
        Command::new("tar")
            .args(["xzf"])
            .arg(&orig)
            .args(["--strip-components=1", "-C"])
            .arg(&tree),
    )?;
    run_quiet(
        Command::new("tar")
            .args(["xJf"])
            .arg(&debian)
            .arg("-C")
            .arg(&tree),
    )?;
    apply_debian_patches(&tree)?;
    apply_flock_fixes(&tree)?;
    replace_reflect2(&tree)?;

    // Kubernetes' build scripts make their own GOPATH under _output and set GOCACHE inside
    // it: that directory is a link to the cache kept across runs.
    let go_cache = Path::new(CACHE_DIR).join("go-build");
    std::fs::create_dir_all(&go_cache).with_context(|| format!("create {}", go_cache.display()))?;
    let kube_gopath = tree.join("_output/local/go");
    std::fs::create_dir_all(&kube_gopath)
        .with_context(|| format!("create {}", kube_gopath.display()))?;
    std::os::unix::fs::symlink(&go_cache, kube_gopath.join("cache")).with_context(|| {
        format!(
            "link {} to {}",
            kube_gopath.join("cache").display(),
            go_cache.display()
        )
    })?;
    let log_path = dir.join("build.log");
    let mut log = std::fs::File::create(&log_path)
        .with_context(|| format!("create {}", log_path.display()))?;
    let what = TARGETS.join(" ");
    eprintln!(
        "cluster: nice -n 19 make WHAT=\"{what}\" (log: {})",
        log_path.display()
    );
    let mut child = Command::new("nice")
        .args(["-n", "19", "make"])
        .arg(format!("WHAT={what}"))
        .current_dir(&tree)
        .env("CGO_ENABLED", "0")
        .env("HOME", &dir)
        .env(
            "PATH",
            format!(
                "/usr/lib/go/bin:{}",
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawn make")?;
    // make prints little in ten minutes: relay its lines, and every 30 s say it is alive.
    let started = Instant::now();
    let done = AtomicBool::new(false);
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let status = std::thread::scope(|s| -> Result<std::process::ExitStatus> {
        for pipe in [
            stdout.map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
            stderr.map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let tx = tx.clone();
            s.spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
        }
        drop(tx);
        let done = &done;
        let go_cache = &go_cache;
        s.spawn(move || {
            let mut next = Duration::from_secs(30);
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let elapsed = started.elapsed();
                if elapsed >= next {
                    next += Duration::from_secs(30);
                    eprintln!(
                        "cluster: still building Kubernetes ({}:{:02} min, Go cache {} MB)",
                        elapsed.as_secs() / 60,
                        elapsed.as_secs() % 60,
                        dir_megabytes(go_cache)
                    );
                }
            }
        });
        for line in rx {
            let _ = writeln!(log, "{line}");
            if line.starts_with("+++") || line.contains("rror") {
                eprintln!("cluster: kube build: {line}");
            }
            if started.elapsed() > BUILD_LIMIT {
                let _ = child.kill();
            }
        }
        let status = child.wait().context("wait for make");
        done.store(true, Ordering::Relaxed);
        status
    })?;
    if !status.success() {
        let log_text = std::fs::read_to_string(&log_path).unwrap_or_default();
        let tail: Vec<&str> = log_text.lines().rev().take(30).collect();
        bail!(
            "make WHAT=\"{what}\" failed ({status}) after {:.0} s; last lines:\n{}",
            started.elapsed().as_secs_f64(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    let out_bin = tree.join("_output/bin");
    std::fs::create_dir_all(&build.bin)
        .with_context(|| format!("create {}", build.bin.display()))?;
    for target in TARGETS {
        let name = binary_name(target);
        let from = out_bin.join(name);
        let to = build.bin.join(name);
        // Beside it, then renamed over it: a running cluster may be executing the old one
        // (copying onto a running binary fails: "text file busy").
        let part = build.bin.join(format!(".{name}.part"));
        std::fs::copy(&from, &part)
            .with_context(|| format!("copy {} to {}", from.display(), part.display()))?;
        std::fs::rename(&part, &to)
            .with_context(|| format!("rename {} to {}", part.display(), to.display()))?;
    }
    // The binaries are what is kept; the tree (about 1 GB once built) is unpacked again by
    // the next rebuild, at the same path, so the Go cache still applies.
    std::fs::remove_dir_all(&tree).with_context(|| format!("remove {}", tree.display()))?;
    Ok(())
}

/// Adds [`DEB_SRC_FILE`] and runs `apt-get update` unless apt already knows the source
/// package.
fn ensure_deb_src() -> Result<()> {
    let known = Command::new("apt-cache")
        .args(["showsrc", "kubernetes"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(DEBIAN_VERSION))
        .unwrap_or(false);
    if known {
        return Ok(());
    }
    if std::fs::read_to_string(DEB_SRC_FILE).ok().as_deref() != Some(DEB_SRC) {
        eprintln!("cluster: adding {DEB_SRC_FILE} (deb-src of bookworm main)");
        std::fs::write(DEB_SRC_FILE, DEB_SRC).with_context(|| format!("write {DEB_SRC_FILE}"))?;
    }
    sys::run(Command::new("apt-get").args(["update", "-qq"]))
}

/// Applies `debian/patches/series` in order, as `dpkg-source -x` would.
fn apply_debian_patches(tree: &Path) -> Result<()> {
    let series = tree.join("debian/patches/series");
    let text =
        std::fs::read_to_string(&series).with_context(|| format!("read {}", series.display()))?;
    for patch in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let file = tree.join("debian/patches").join(patch);
        run_quiet(
            Command::new("patch")
                .args(["-p1", "--quiet", "-i"])
                .arg(&file)
                .current_dir(tree),
        )
        .with_context(|| format!("apply Debian's {patch}"))?;
    }
    Ok(())
}

/// Fixes of 1.20's e2e suite, each an upstream bug, applied after Debian's patches: (file,
/// text, replacement). Raising [`FLOCK_FIXES`] rebuilds a cached build.
const FIXES: &[(&str, &str, &str)] = &[(
    // The NetworkPolicy specs' client dials "SERVICE_IP:PORT", which an IPv6 Service address
    // makes "too many colons in address": every NetworkPolicy spec fails on an IPv6 cluster
    // before any policy is involved. Later releases join host and port (net.JoinHostPort).
    "test/e2e/network/network_policy.go",
    r#"fmt.Sprintf("for i in $(seq 1 5); do /agnhost connect %s:%d --protocol %s --timeout 8s && exit 0 || sleep 1; done; exit 1", targetService.Spec.ClusterIP, targetPort, connectProtocol)"#,
    r#"fmt.Sprintf("for i in $(seq 1 5); do /agnhost connect %s --protocol %s --timeout 8s && exit 0 || sleep 1; done; exit 1", net.JoinHostPort(targetService.Spec.ClusterIP, fmt.Sprint(targetPort)), connectProtocol)"#,
)];
/// The version of [`FIXES`], recorded in the build's stamp.
const FLOCK_FIXES: &str = "flock fixes: 1";

fn apply_flock_fixes(tree: &Path) -> Result<()> {
    for (file, text, replacement) in FIXES {
        let path = tree.join(file);
        let source =
            std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        if source.matches(text).count() != 1 {
            bail!("{file}: the text flock fixes is not there once: {text}");
        }
        std::fs::write(&path, source.replace(text, replacement))
            .with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}

/// Replaces the vendored reflect2 1.0.1 (crashes under Go 1.19) with Debian's 1.0.2.
fn replace_reflect2(tree: &Path) -> Result<()> {
    let vendored = tree.join("vendor/github.com/modern-go/reflect2");
    std::fs::remove_dir_all(&vendored).with_context(|| format!("remove {}", vendored.display()))?;
    run_quiet(
        Command::new("rsync")
            .args(["-a", "--exclude=*_test.go", "--exclude=test/"])
            .arg(format!("{REFLECT2_SRC}/"))
            .arg(format!("{}/", vendored.display())),
    )
    .context("copy reflect2 1.0.2 into the vendor tree")?;
    // Go checks vendor/modules.txt against go.mod's replace directives: both say 1.0.2.
    edit(
        &tree.join("go.mod"),
        "github.com/modern-go/reflect2 => github.com/modern-go/reflect2 v1.0.1\n",
        "github.com/modern-go/reflect2 => github.com/modern-go/reflect2 v1.0.2\n",
    )?;
    let modules = tree.join("vendor/modules.txt");
    edit(
        &modules,
        "# github.com/modern-go/reflect2 v1.0.1 => github.com/modern-go/reflect2 v1.0.1\n",
        "# github.com/modern-go/reflect2 v1.0.1 => github.com/modern-go/reflect2 v1.0.2\n",
    )?;
    edit(
        &modules,
        "# github.com/modern-go/reflect2 => github.com/modern-go/reflect2 v1.0.1\n",
        "# github.com/modern-go/reflect2 => github.com/modern-go/reflect2 v1.0.2\n",
    )
}

/// Replaces the one occurrence of `old` in `file` with `new`.
fn edit(file: &Path, old: &str, new: &str) -> Result<()> {
    let text = std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?;
    if !text.contains(old) {
        bail!("{} has no line {old:?}", file.display());
    }
    std::fs::write(file, text.replacen(old, new, 1))
        .with_context(|| format!("write {}", file.display()))
}

fn run_quiet(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("spawn {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The size of a directory tree in MB (0 when unreadable).
fn dir_megabytes(dir: &Path) -> u64 {
    Command::new("du")
        .args(["-sm"])
        .arg(dir)
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}
