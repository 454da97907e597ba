//! The cluster's images, all made on this machine: no registry is reachable.
//!
//! - flock's image, as a user builds it: `deploy/Dockerfile` built by podman (`--target
//!   prebuilt`, the release binaries built on the host as its context) on a Debian base image
//!   made here with `mmdebstrap` and `podman import` (`--build-arg BASE=`). `--network host`:
//!   podman creates no bridge and its `RUN apt-get` reaches Debian's archive.
//! - the sandbox ("pause") image and the workloads' image, busybox-static packed as OCI
//!   archives in Rust (flock-e2e's image writer).
//!
//! - for `cargo xtask cluster e2e` ([`build_e2e`]), the images the release's e2e suite runs,
//!   under the exact names its `e2e.test --list-images` gives: agnhost (the binary built from
//!   the same release, on the Debian base with the tools its specs exec), busybox, pause,
//!   nginx, the DNS probers and the conntrack specs' images; and ([`build_named`]) the same
//!   agnhost under the name network-policy-api's conformance manifests pin.
//!
//! Every archive is imported into each node's containerd (`ctr -n k8s.io images import`).
//! The base root filesystem and podman's storage (with its layer cache) are kept under
//! `/var/cache/flock`, so a warm run rebuilds only the layer holding the binaries.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use flock_e2e::{PauseImage, TarBuilder, oci_archive};

use super::RUN_DIR;
use super::kube::{KubeBuild, cache_dir};
use crate::sys;

/// The sandbox image every node's containerd runs pods in.
pub const PAUSE: &str = "localhost/flockcluster/pause:1";
/// The workloads' image: busybox, serving its hostname over HTTP on port 80.
pub const NET: &str = "localhost/flockcluster/net:1";
/// flock's image as built here (the only change to `deploy/daemonset.yaml`).
pub const FLOCK: &str = "localhost/flock:cluster";
/// The Debian base image made locally (`BASE` of the Dockerfile).
const BASE: &str = "localhost/debian:bookworm-slim";
/// Where Debian's busybox-static puts its binary.
const BUSYBOX: &str = "/bin/busybox";

/// The workloads' entry point: write the pod's name as the index page and serve it.
const NET_ENTRYPOINT: [&str; 3] = [
    "/bin/sh",
    "-c",
    "mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 80 -h /www",
];

/// `RUN_DIR/images`: the archives of this run.
fn dir() -> PathBuf {
    Path::new(RUN_DIR).join("images")
}

/// podman with its storage under [`cache_dir`] (not the machine's `/var/lib/containers`),
/// cgroupfs (no systemd here), no event log, and the runc the cluster runs (built from its
/// module, cached) as its OCI runtime once there is one: Debian's crun 1.8 refuses a machine
/// whose cgroup v2 hierarchy holds a controller beside the v1 ones ("cgroups in hybrid mode
/// not supported", `hugetlb` on some machines), runc runs there.
fn podman() -> Command {
    let cache = cache_dir().join("podman");
    let mut cmd = Command::new("podman");
    if let Ok(Some(runc)) = crate::components::runc().cached() {
        cmd.arg("--runtime").arg(runc.tool("runc"));
    }
    cmd.arg("--root")
        .arg(cache.join("storage"))
        .arg("--runroot")
        .arg(cache.join("run"))
        .arg("--tmpdir")
        .arg(cache.join("tmp"))
        .arg("--network-config-dir")
        .arg(cache.join("networks"))
        .args([
            "--cgroup-manager",
            "cgroupfs",
            "--events-backend",
            "none",
            "--storage-driver",
            "overlay",
        ]);
    cmd
}

/// The archives [`build_all`] made for this cluster (for a node that joins later).
pub fn built() -> Result<Vec<PathBuf>> {
    let mut archives: Vec<PathBuf> = std::fs::read_dir(dir())
        .with_context(|| format!("read {}", dir().display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".oci.tar"))
        .collect();
    archives.sort();
    if archives.len() < 3 {
        bail!(
            "{} lacks the cluster's image archives: {archives:?}",
            dir().display()
        );
    }
    Ok(archives)
}

/// Builds every image and returns the archives to import into each node.
pub fn build_all(bins: &Path, repo: &Path, kube: &KubeBuild) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir()).with_context(|| format!("create {}", dir().display()))?;
    let pause = PauseImage::build(PAUSE, &dir()).context("build the pause image")?;
    let net = build_net_image()?;
    let coredns = build_coredns_image(kube)?;
    let flock = build_flock_image(bins, repo)?;
    Ok(vec![pause.archive, net, coredns, flock])
}

/// CoreDNS under upstream's name (`deploy/coredns.yaml` of the test bed runs it): the static
/// binary built from its Go module, alone in its root filesystem, as upstream's image is.
fn build_coredns_image(kube: &KubeBuild) -> Result<PathBuf> {
    let binary = std::fs::read(kube.coredns())
        .with_context(|| format!("read {}", kube.coredns().display()))?;
    let mut layer = TarBuilder::new();
    for d in ["etc", "tmp"] {
        layer.dir(d, 0o755);
    }
    layer.file("coredns", 0o755, &binary);
    layer.file("etc/passwd", 0o644, b"root:x:0:0:root:/:/sbin/nologin\n");
    let archive = dir().join("coredns.oci.tar");
    std::fs::write(
        &archive,
        oci_archive(&coredns_image(), &["/coredns"], &layer.finish()),
    )
    .with_context(|| format!("write {}", archive.display()))?;
    Ok(archive)
}

/// CoreDNS's image name, as `deploy/coredns.yaml` of the test bed names it.
pub fn coredns_image() -> String {
    format!(
        "registry.k8s.io/coredns/coredns:v{}",
        crate::versions::COREDNS
    )
}

/// A root filesystem of busybox-static with every applet linked in `/bin`.
fn busybox_rootfs() -> Result<Vec<u8>> {
    Ok(busybox_layer()?.finish())
}

/// Multus's thick image as its project's `images/Dockerfile.thick` lays it out: its daemon,
/// shim, installer and `passthru` plugin under `/usr/src/multus-cni/bin`, the daemon the entry point; on
/// busybox instead of Debian (the binaries are static; a shell is there to look around);
/// named `name`.
pub fn build_multus_image(multus: &crate::components::Built, name: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir()).with_context(|| format!("create {}", dir().display()))?;
    let mut layer = busybox_layer()?;
    for d in [
        "usr",
        "usr/src",
        "usr/src/multus-cni",
        "usr/src/multus-cni/bin",
        "run",
        "var",
    ] {
        layer.dir(d, 0o755);
    }
    // as on Debian: the daemon looks for a sandbox's namespace under /var/run/netns, which
    // its DaemonSet mounts at /run/netns
    layer.symlink("var/run", "/run");
    for name in ["multus-daemon", "multus-shim", "install_multus", "passthru"] {
        let binary = std::fs::read(multus.tool(name))
            .with_context(|| format!("read {}", multus.tool(name).display()))?;
        layer.file(&format!("usr/src/multus-cni/bin/{name}"), 0o755, &binary);
    }
    let archive = dir().join("multus.oci.tar");
    std::fs::write(
        &archive,
        oci_archive(
            name,
            &["/usr/src/multus-cni/bin/multus-daemon"],
            &layer.finish(),
        ),
    )
    .with_context(|| format!("write {}", archive.display()))?;
    Ok(archive)
}

/// kube-router's image as its project's Dockerfile lays it out (the binary at
/// `/usr/local/bin/kube-router`, the entry point, with the iptables, ipset and iproute2 it
/// runs), on the Debian base instead of Alpine; named `name`. Cached under
/// `cache_dir()/images/peers` until the binary changes.
pub fn build_kube_router_image(binary: &Path, name: &str) -> Result<PathBuf> {
    let dir = peers_dir()?;
    build_debian_image(
        &dir,
        &E2eImage {
            name: name.to_owned(),
            containerfile: format!(
                "FROM {BASE}\n\
                 RUN apt-get update && apt-get install -y --no-install-recommends \
                 iptables ipset iproute2 && rm -rf /var/lib/apt/lists/*\n\
                 COPY kube-router /usr/local/bin/kube-router\n\
                 WORKDIR /root\n\
                 ENTRYPOINT [\"/usr/local/bin/kube-router\"]\n"
            ),
            files: vec![("kube-router", binary.to_owned())],
        },
    )
}

/// An image of one static binary at `path` on busybox (a shell to look around), named
/// `name`, without an entry point: the pod's `args` are its command, as they replace the `CMD`
/// of kube-network-policies' own image (distroless, `/bin/netpol`).
pub fn build_static_image(binary: &Path, path: &str, name: &str) -> Result<PathBuf> {
    let dir = peers_dir()?;
    let archive = dir.join(format!("{}.oci.tar", archive_stem(name)));
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if modified(&archive).is_some() && modified(&archive) >= modified(binary) {
        return Ok(archive);
    }
    let bytes = std::fs::read(binary).with_context(|| format!("read {}", binary.display()))?;
    let mut layer = busybox_layer()?;
    layer.file(path, 0o755, &bytes);
    let part = dir.join(format!("{}.part.tar", archive_stem(name)));
    std::fs::write(&part, oci_archive(name, &[], &layer.finish()))
        .with_context(|| format!("write {}", part.display()))?;
    std::fs::rename(&part, &archive).with_context(|| format!("rename to {}", archive.display()))?;
    Ok(archive)
}

/// `cache_dir()/images/peers`, created: the peers' images, kept across clusters.
fn peers_dir() -> Result<PathBuf> {
    let dir = cache_dir().join("images/peers");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(dir)
}

/// [`busybox_rootfs`], open for more files.
fn busybox_layer() -> Result<TarBuilder> {
    let busybox = std::fs::read(BUSYBOX)
        .with_context(|| format!("read {BUSYBOX} (apt-get install busybox-static)"))?;
    let applets = sys::output(Command::new(BUSYBOX).arg("--list"))?;
    let mut layer = TarBuilder::new();
    for d in ["bin", "dev", "etc", "proc", "sys", "www"] {
        layer.dir(d, 0o755);
    }
    layer.dir("tmp", 0o1777);
    layer.file("bin/busybox", 0o755, &busybox);
    for applet in applets.lines().map(str::trim) {
        if !applet.is_empty() && applet != "busybox" {
            layer.symlink(&format!("bin/{applet}"), "busybox");
        }
    }
    layer.file("etc/passwd", 0o644, b"root:x:0:0:root:/:/bin/sh\n");
    layer.file("etc/group", 0o644, b"root:x:0:\n");
    Ok(layer)
}

fn build_net_image() -> Result<PathBuf> {
    let archive = dir().join("net.oci.tar");
    std::fs::write(
        &archive,
        oci_archive(NET, &NET_ENTRYPOINT, &busybox_rootfs()?),
    )
    .with_context(|| format!("write {}", archive.display()))?;
    Ok(archive)
}

/// The Debian base image: a minbase root filesystem from Debian's archive (cached), imported
/// into podman under [`BASE`] unless podman has it.
fn ensure_base_image() -> Result<()> {
    let exists = podman()
        .args(["image", "exists", BASE])
        .status()
        .is_ok_and(|s| s.success());
    if exists {
        return Ok(());
    }
    let images = cache_dir().join("images");
    std::fs::create_dir_all(&images).with_context(|| format!("create {}", images.display()))?;
    let tar = images.join("debian-bookworm-minbase.tar");
    if !tar.exists() {
        eprintln!("cluster: mmdebstrap --variant=minbase bookworm (the image's base, once)");
        let part = images.join("debian-bookworm-minbase.part.tar");
        sys::output(
            Command::new("mmdebstrap")
                .args(["--variant=minbase", "--format=tar", "--quiet", "bookworm"])
                .arg(&part)
                .arg("http://deb.debian.org/debian"),
        )?;
        std::fs::rename(&part, &tar).with_context(|| format!("rename to {}", tar.display()))?;
    }
    sys::output(podman().arg("import").arg(&tar).arg(BASE))?;
    Ok(())
}

/// flock's image from `deploy/Dockerfile`, stage `prebuilt`, with the binaries in `bins`.
fn build_flock_image(bins: &Path, repo: &Path) -> Result<PathBuf> {
    build_flock_image_as(bins, repo, FLOCK, "flock")
}

/// flock's image named `image` from the binaries in `bins` and the Dockerfile of `repo`
/// (`deploy/Dockerfile`'s `prebuilt` stage), saved as `NAME.oci.tar`; a revision without a
/// controller of its own has no `flock-controller`, and its Dockerfile copies none.
pub fn build_flock_image_as(bins: &Path, repo: &Path, image: &str, name: &str) -> Result<PathBuf> {
    ensure_base_image()?;
    let context = dir().join(format!("{name}-context"));
    if context.exists() {
        std::fs::remove_dir_all(&context)
            .with_context(|| format!("empty {}", context.display()))?;
    }
    std::fs::create_dir_all(&context).with_context(|| format!("create {}", context.display()))?;
    for bin in ["flock-agent", "flock-controller", "flock"] {
        if bin == "flock-controller" && !bins.join(bin).exists() {
            continue;
        }
        std::fs::copy(bins.join(bin), context.join(bin))
            .with_context(|| format!("copy {} into the image context", bins.join(bin).display()))?;
    }
    let log = Path::new(RUN_DIR).join("logs/podman-build.log");
    let out = podman()
        .args([
            "build",
            "--network",
            "host",
            "--pull=never",
            "--target",
            "prebuilt",
        ])
        .arg("--build-arg")
        .arg(format!("BASE={BASE}"))
        .arg("-f")
        .arg(repo.join("deploy/Dockerfile"))
        .args(["-t", image])
        .arg(&context)
        .output()
        .context("spawn podman build")?;
    let mut text = out.stdout.clone();
    text.extend_from_slice(&out.stderr);
    std::fs::write(&log, &text).with_context(|| format!("write {}", log.display()))?;
    if !out.status.success() {
        let text = String::from_utf8_lossy(&text);
        let tail: Vec<&str> = text.lines().rev().take(20).collect();
        anyhow::bail!(
            "podman build of deploy/Dockerfile failed ({}); end of {}:\n{}",
            out.status,
            log.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    let archive = dir().join(format!("{name}.oci.tar"));
    sys::output(
        podman()
            .args(["save", "--format", "oci-archive", "-o"])
            .arg(&archive)
            .arg(image),
    )?;
    Ok(archive)
}

/// What every Debian-based DNS test image adds: the DNS tools (`dig`, the DNS specs' probers).
const DNS_PACKAGES: &str = "dnsutils";
/// What the agnhost image adds to the Debian base: the tools the suite's tests exec in it, as
/// upstream's image has them (bind-tools, curl, netcat, iproute2, iperf, bash, util-linux,
/// socat). Beside them, as upstream's image has: `/coredns` (the DNS specs run it as a
/// nameserver of their own), `/uploads` (netexec), `/agnhost-2` (the entrypoint tests),
/// `/localhost.crt` + `/localhost.key` (porter's TLS ports; made at build) and the user 1000
/// `user-defined-in-image`.
const AGNHOST_PACKAGES: &str = "curl wget netcat-openbsd iproute2 iputils-ping dnsutils iptables \
     iperf bash openssl util-linux socat";

/// One test image made with podman on the Debian base: a Containerfile and the files its
/// context holds.
struct E2eImage {
    name: String,
    containerfile: String,
    files: Vec<(&'static str, PathBuf)>,
}

/// How the test bed makes the suite's image `name` (as `e2e.test --list-images` names it),
/// from the binaries of `kube`; `None` for an image the network suites do not run.
fn debian_image(name: &str, kube: &KubeBuild) -> Option<E2eImage> {
    let repo = name.rsplit_once(':').map_or(name, |(r, _)| r);
    let image = |containerfile: String, files: Vec<(&'static str, PathBuf)>| {
        Some(E2eImage {
            name: name.to_owned(),
            containerfile,
            files,
        })
    };
    match repo {
        "registry.k8s.io/e2e-test-images/agnhost" => image(
            format!(
                "FROM {BASE}\n\
                 RUN apt-get update && apt-get install -y --no-install-recommends \
                 {AGNHOST_PACKAGES} && rm -rf /var/lib/apt/lists/*\n\
                 COPY agnhost /agnhost\n\
                 COPY coredns /coredns\n\
                 RUN mkdir /uploads && ln -s agnhost /agnhost-2 \
                 && useradd -u 1000 -M user-defined-in-image \
                 && openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=localhost \
                 -keyout /localhost.key -out /localhost.crt\n\
                 WORKDIR /\n\
                 ENTRYPOINT [\"/agnhost\"]\n\
                 CMD [\"pause\"]\n"
            ),
            vec![
                ("agnhost", kube.tool("agnhost")),
                ("coredns", kube.coredns()),
            ],
        ),
        // The DNS specs' probers of glibc's resolver (`getent`) and dig.
        "registry.k8s.io/e2e-test-images/glibc-dns-testing"
        | "registry.k8s.io/e2e-test-images/jessie-dnsutils" => image(
            format!(
                "FROM {BASE}\n\
                 RUN apt-get update && apt-get install -y --no-install-recommends \
                 {DNS_PACKAGES} && rm -rf /var/lib/apt/lists/*\n\
                 COPY coredns /coredns\n"
            ),
            vec![("coredns", kube.coredns())],
        ),
        // The EndpointSlice and Endpoints specs' web server.
        "registry.k8s.io/e2e-test-images/nginx" => image(
            format!(
                "FROM {BASE}\n\
                 RUN apt-get update && apt-get install -y --no-install-recommends nginx-light \
                 && rm -rf /var/lib/apt/lists/* \
                 && ln -sf /dev/stdout /var/log/nginx/access.log \
                 && ln -sf /dev/stderr /var/log/nginx/error.log\n\
                 EXPOSE 80\n\
                 CMD [\"nginx\", \"-g\", \"daemon off;\"]\n"
            ),
            vec![],
        ),
        // The conntrack spec's client of invalid packets, built from the same release.
        "registry.k8s.io/e2e-test-images/regression-issue-74839" => image(
            format!(
                "FROM {BASE}\n\
                 COPY regression-issue-74839 /regression-issue-74839\n\
                 ENTRYPOINT [\"/regression-issue-74839\"]\n"
            ),
            vec![(
                "regression-issue-74839",
                kube.tool("regression-issue-74839"),
            )],
        ),
        // kube-proxy's spec that reads conntrack entries on the node.
        "registry.k8s.io/build-image/distroless-iptables" => image(
            format!(
                "FROM {BASE}\n\
                 RUN apt-get update && apt-get install -y --no-install-recommends iptables \
                 conntrack && rm -rf /var/lib/apt/lists/*\n"
            ),
            vec![],
        ),
        _ => None,
    }
}

/// Builds the images the e2e suite of `kube`'s release runs, under the names its `e2e.test
/// --list-images` gives: pause and busybox in Rust, the others with podman on the Debian base
/// from the binaries of the same release (agnhost, CoreDNS, …); the images only other suites
/// run (storage, apps, …) are not made. Returns their archives, kept under
/// `cache_dir()/images/e2e` (an image is rebuilt only when a file of its context is newer than
/// its archive or its Containerfile changed).
pub fn build_e2e(kube: &KubeBuild) -> Result<Vec<PathBuf>> {
    let dir = e2e_dir()?;
    let listed = sys::output(Command::new(kube.tool("e2e.test")).arg("--list-images"))?;
    let mut archives = Vec::new();
    for name in listed.lines().map(str::trim).filter(|l| !l.is_empty()) {
        archives.extend(build_test_image(&dir, kube, name)?);
    }
    Ok(archives)
}

/// Builds the images another suite's manifests name (network-policy-api's conformance suite:
/// agnhost under the tag it pins), each by the recipe [`build_e2e`] has for its repository
/// whatever the tag, from the binaries of `kube`'s release; fails on an image the test bed has
/// no recipe for.
///
/// With `sctp` false (a kernel without SCTP) agnhost's `porter`, which the suite runs only to
/// serve SCTP and which exits when it cannot, idles instead, so its pods become ready and the
/// suite's SCTP probes time out (the caller does not judge those).
pub fn build_named(kube: &KubeBuild, names: &[String], sctp: bool) -> Result<Vec<PathBuf>> {
    let dir = e2e_dir()?;
    names
        .iter()
        .map(|name| {
            let agnhost = name.starts_with("registry.k8s.io/e2e-test-images/agnhost:");
            if !sctp
                && agnhost
                && let Some(mut image) = debian_image(name, kube)
            {
                if !image.containerfile.contains("COPY agnhost /agnhost\n") {
                    anyhow::bail!(
                        "{name}: its recipe no longer copies agnhost to /agnhost, so porter \
                         cannot be made to idle on this kernel without SCTP"
                    );
                }
                image.containerfile = image.containerfile.replace(
                    "COPY agnhost /agnhost\n",
                    "COPY agnhost /agnhost.bin\n\
                     RUN printf '#!/bin/sh\\n# no SCTP in this kernel: porter idles\\n\
                     if [ \"$1\" = porter ] && [ ! -e /proc/net/sctp ]; then exec sleep infinity; fi\\n\
                     exec /agnhost.bin \"$@\"\\n' > /agnhost && chmod 755 /agnhost\n",
                );
                return build_debian_image(&dir, &image);
            }
            build_test_image(&dir, kube, name)?
                .with_context(|| format!("the test bed makes no image {name}"))
        })
        .collect()
}

/// `cache_dir()/images/e2e`, created.
fn e2e_dir() -> Result<PathBuf> {
    let dir = cache_dir().join("images/e2e");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(dir)
}

/// The archive of test image `name` in `dir`, made unless up to date; `None` for an image the
/// test bed has no recipe for.
fn build_test_image(dir: &Path, kube: &KubeBuild, name: &str) -> Result<Option<PathBuf>> {
    let repo = name.rsplit_once(':').map_or(name, |(r, _)| r);
    if repo == "registry.k8s.io/pause" {
        let own = dir.join(archive_stem(name));
        std::fs::create_dir_all(&own).with_context(|| format!("create {}", own.display()))?;
        let pause = PauseImage::build(name, &own).with_context(|| format!("build {name}"))?;
        Ok(Some(pause.archive))
    } else if repo == "registry.k8s.io/e2e-test-images/busybox" {
        build_busybox(dir, name).map(Some)
    } else if let Some(image) = debian_image(name, kube) {
        build_debian_image(dir, &image).map(Some)
    } else {
        Ok(None)
    }
}

/// busybox under `name`: the root filesystem imported by podman with upstream's CMD, no
/// entry point.
fn build_busybox(dir: &Path, name: &str) -> Result<PathBuf> {
    let rootfs = dir.join("busybox-rootfs.tar");
    std::fs::write(&rootfs, busybox_rootfs()?)
        .with_context(|| format!("write {}", rootfs.display()))?;
    sys::output(
        podman()
            .arg("import")
            .args(["--change", r#"CMD ["sh"]"#])
            .args(["--change", "ENV PATH=/bin"])
            .arg(&rootfs)
            .arg(name),
    )?;
    let archive = dir.join(format!("{}.oci.tar", archive_stem(name)));
    save(name, &archive)?;
    Ok(archive)
}

/// A file name for the archive of image `name`: its last path part, tag included.
fn archive_stem(name: &str) -> String {
    name.rsplit('/')
        .next()
        .unwrap_or(name)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// `podman build` of one image on the Debian base, unless its archive is up to date.
fn build_debian_image(dir: &Path, image: &E2eImage) -> Result<PathBuf> {
    let stem = archive_stem(&image.name);
    let archive = dir.join(format!("{stem}.oci.tar"));
    let context = dir.join(format!("{stem}-context"));
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let built_from = std::fs::read_to_string(context.join("Containerfile")).unwrap_or_default();
    let stale = modified(&archive).is_none()
        || built_from != image.containerfile
        || image
            .files
            .iter()
            .any(|(_, from)| modified(&archive) < modified(from));
    if !stale {
        return Ok(archive);
    }
    ensure_base_image()?;
    std::fs::create_dir_all(&context).with_context(|| format!("create {}", context.display()))?;
    for (name, from) in &image.files {
        std::fs::copy(from, context.join(name))
            .with_context(|| format!("copy {} into {}", from.display(), context.display()))?;
    }
    std::fs::write(context.join("Containerfile"), &image.containerfile)
        .with_context(|| format!("write the Containerfile in {}", context.display()))?;
    eprintln!("cluster: e2e: podman build {}", image.name);
    sys::output(
        podman()
            .args(["build", "--network", "host", "--pull=never", "-t"])
            .arg(&image.name)
            .arg("-f")
            .arg(context.join("Containerfile"))
            .arg(&context),
    )?;
    let part = dir.join(format!("{stem}.part.tar"));
    save(&image.name, &part)?;
    std::fs::rename(&part, &archive).with_context(|| format!("rename to {}", archive.display()))?;
    Ok(archive)
}

/// `podman save` of `image` as an OCI archive (it keeps its name for `ctr images import`).
fn save(image: &str, archive: &Path) -> Result<()> {
    if archive.exists() {
        std::fs::remove_file(archive).with_context(|| format!("remove {}", archive.display()))?;
    }
    sys::output(
        podman()
            .args(["save", "--format", "oci-archive", "-o"])
            .arg(archive)
            .arg(image),
    )?;
    Ok(())
}

/// Imports an archive into the `k8s.io` namespace of the containerd at `socket`.
pub fn import(kube: &KubeBuild, socket: &Path, archive: &Path) -> Result<()> {
    sys::output(
        Command::new(kube.ctr())
            .arg("--address")
            .arg(socket)
            .args(["--namespace", "k8s.io", "images", "import"])
            .args(["--snapshotter", "overlayfs"])
            .arg(archive),
    )?;
    Ok(())
}
