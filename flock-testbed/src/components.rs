//! The cluster's components, each built from its Go module and cached per version.
//!
//! No registry ships Kubernetes, containerd or etcd binaries to this machine, but the Go module
//! proxy serves their source. Each component has a wrapper module of its own under
//! `flock-testbed/go/` (its `go.mod` and `go.sum` committed) that requires the component at the
//! version of [`crate::versions`] and lists its commands as `tool`s (and imports the upstream
//! test packages it compiles, see `gomod`); one module per component, so that Go's
//! version selection never raises a dependency (grpc, otel, cri-api) above what that component
//! was released with. [`Component::ensure_built`] runs `go build` (or `go test -c` for a test
//! binary: `e2e.test`, the ClusterNetworkPolicy conformance suite) in that module under `nice
//! -n 19` and copies nothing: the binaries go straight to `/var/cache/flock/NAME-VERSION/bin`,
//! and a stamp written last names the recipe (a digest of the module files and the build
//! commands), so an interrupted or changed build is redone and a finished one is found at once.
//! The module and build caches live under [`cache_dir`] too, so a machine pays for a cold build
//! once.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use crate::sys;
use crate::versions::{self, Kubernetes};

/// Where the test bed caches across runs (kept between CI jobs on one machine), unless
/// [`CACHE_DIR_ENV`] names another folder.
pub const CACHE_DIR: &str = "/var/cache/flock";
/// Names another cache folder: a run with an empty one shows what a fresh machine pays.
pub const CACHE_DIR_ENV: &str = "FLOCK_CACHE_DIR";

/// Everything the test bed caches across runs: [`CACHE_DIR`], or the folder [`CACHE_DIR_ENV`]
/// names.
pub fn cache_dir() -> PathBuf {
    std::env::var_os(CACHE_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from(CACHE_DIR), PathBuf::from)
}
/// Debian packages a build needs: runc links libseccomp through cgo.
const BUILD_PACKAGES: &[&str] = &["gcc", "libc6-dev", "libseccomp-dev", "pkg-config"];
/// Where the machine image puts Go when it is not on `PATH`.
const GO_FALLBACK: &str = "/usr/local/go/bin/go";

/// How one binary of a component is built.
#[derive(Debug, Clone)]
pub struct Output {
    /// The file name under `bin/`.
    pub name: &'static str,
    /// The Go package (a `main` package, or the test package of [`Output::test_binary`]).
    pub package: String,
    /// `go test -c` (a test binary such as `e2e.test`) instead of `go build`.
    pub test_binary: bool,
    /// Link C code (runc's `nsenter` and seccomp); everything else is static Go.
    pub cgo: bool,
    /// `-tags`.
    pub tags: &'static [&'static str],
    /// `-ldflags` (version stamps, `-s -w`).
    pub ldflags: String,
}

/// One component at one version: its wrapper module and the binaries built from it.
#[derive(Debug, Clone)]
pub struct Component {
    /// `kubernetes`, `containerd`, …: the cache folder's stem.
    pub name: &'static str,
    /// The version built, as upstream spells it without `v`.
    pub version: String,
    /// The wrapper module's folder under `flock-testbed/go/`.
    pub module: String,
    /// The upstream Go module it requires.
    pub upstream: &'static str,
    /// Modules the wrapper requires at a version of their own: those upstream's `go.mod` does
    /// not name, which `go mod tidy` would otherwise take at their newest (a dependency
    /// without a `go.mod` of its own brings in its tests' imports), raising every module they
    /// need above what upstream was released with.
    pub pins: &'static [(&'static str, &'static str)],
    /// Changes to upstream's source for the test bed ([`Patch`]), each said where it is made
    /// and why.
    pub patches: &'static [Patch],
    /// What is built.
    pub outputs: Vec<Output>,
}

/// A change to upstream's source, made in a copy of it at build time (the module cache stays
/// as served).
#[derive(Debug, Clone, Copy)]
pub enum Patch {
    /// In `file` (relative to upstream's module root), `old` replaced by `new`: it must occur
    /// exactly `count` times, so a patch written for one version is refused by another.
    Replace {
        /// Relative to upstream's module root.
        file: &'static str,
        /// The text replaced.
        old: &'static str,
        /// What replaces it.
        new: &'static str,
        /// How many times `old` occurs in upstream's file.
        count: usize,
    },
    /// A file added to upstream's source.
    Add {
        /// Relative to upstream's module root.
        file: &'static str,
        /// Its content.
        text: &'static str,
    },
}

/// Makes each of `patches` in the source tree at `dir`.
fn apply_patches(dir: &Path, patches: &[Patch]) -> Result<()> {
    for patch in patches {
        match *patch {
            Patch::Replace {
                file,
                old,
                new,
                count,
            } => {
                let path = dir.join(file);
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("read {}", path.display()))?;
                let found = text.matches(old).count();
                if found != count {
                    bail!(
                        "{file} holds {found} of the text a patch replaces, not {count}: the \
                         patch is for another version:\n{old}"
                    );
                }
                std::fs::write(&path, text.replace(old, new))
                    .with_context(|| format!("write {}", path.display()))?;
            }
            Patch::Add { file, text } => {
                let path = dir.join(file);
                if path.exists() {
                    bail!("a patch adds {file}, which upstream has");
                }
                std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
            }
        }
    }
    Ok(())
}

/// A finished build: where its binaries are.
#[derive(Debug, Clone)]
pub struct Built {
    /// The folder holding every [`Output`].
    pub bin: PathBuf,
    /// How long the build took when it was made (from the stamp), if it recorded it.
    pub took: Option<Duration>,
    /// Built by this call (not found in the cache).
    pub fresh: bool,
}

impl Built {
    /// The path of one binary.
    pub fn tool(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }
}

/// Static Go, stripped: as upstream's release builds.
const STRIP: &str = "-s -w";

/// A Go build of Kubernetes `k`'s module: `package` into `name`, stamped with the release the
/// way `hack/lib/version.sh` stamps it (else the binaries say v0.0.0-master).
fn kube_output(k: Kubernetes, name: &'static str, package: &str) -> Output {
    let mut ldflags = STRIP.to_owned();
    for pkg in [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ] {
        let _ = write!(
            ldflags,
            " -X {pkg}.gitVersion=v{k} -X {pkg}.gitMajor=1 -X {pkg}.gitMinor={} \
             -X {pkg}.gitTreeState=clean",
            k.minor
        );
    }
    Output {
        name,
        package: package.to_owned(),
        test_binary: false,
        cgo: false,
        tags: &[],
        ldflags,
    }
}

/// Kubernetes `k` as a cluster runs it: the control plane, the kubelet, kube-proxy, kubectl.
pub fn kubernetes(k: Kubernetes) -> Component {
    let outputs = [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubelet",
        "kube-proxy",
        "kubectl",
    ]
    .into_iter()
    .map(|c| kube_output(k, c, &format!("k8s.io/kubernetes/cmd/{c}")))
    .collect();
    Component {
        name: "kubernetes",
        version: k.to_string(),
        module: k.module_dir(),
        upstream: "k8s.io/kubernetes",
        patches: &[],
        pins: &[],

        outputs,
    }
}

/// What Kubernetes `k`'s own suites need besides the cluster (`cargo xtask cluster e2e`):
/// our own `e2e.test` (the networking suites only, see `go/kubernetes-1.N/e2e`), agnhost and
/// the conntrack spec's client for the suites' images, and ginkgo to run it in parallel. A
/// component of its own, from the same module, so that a cluster comes up without it (on a fresh
/// machine, some 3.5 of Kubernetes' 23 minutes).
pub fn kubernetes_e2e(k: Kubernetes) -> Component {
    let outputs = vec![
        kube_output(k, "agnhost", "k8s.io/kubernetes/test/images/agnhost"),
        // The conntrack spec's client, which sends invalid TCP packets.
        kube_output(
            k,
            "regression-issue-74839",
            "k8s.io/kubernetes/test/images/regression-issue-74839",
        ),
        kube_output(k, "ginkgo", "github.com/onsi/ginkgo/v2/ginkgo"),
        Output {
            test_binary: true,
            ..kube_output(k, "e2e.test", "./e2e")
        },
    ];
    Component {
        name: "kubernetes-e2e",
        version: k.to_string(),
        module: k.module_dir(),
        upstream: "k8s.io/kubernetes",
        patches: &[],
        pins: &[],

        outputs,
    }
}

/// containerd 2, its runc shim and `ctr`, as containerd's Makefile builds them.
pub fn containerd() -> Component {
    containerd_release(
        versions::CONTAINERD,
        "containerd",
        "github.com/containerd/containerd/v2",
    )
}

/// containerd 1.7 (module `github.com/containerd/containerd`, before the `/v2` path), its
/// runc shim and `ctr`: the release line Kubernetes 1.35 and 1.36 still run on.
pub fn containerd_1_7() -> Component {
    containerd_release(
        versions::CONTAINERD_1_7,
        "containerd-1.7",
        "github.com/containerd/containerd",
    )
}

/// containerd `version` from its Go module `upstream`, with the wrapper module `module`.
fn containerd_release(version: &str, module: &str, upstream: &'static str) -> Component {
    let ldflags = format!(
        "{STRIP} -X {upstream}/version.Version=v{version} -X {upstream}/version.Package={upstream}"
    );
    let cmd = |name: &'static str, tags: &'static [&'static str]| Output {
        name,
        package: format!("{upstream}/cmd/{name}"),
        test_binary: false,
        cgo: false,
        tags,
        ldflags: ldflags.clone(),
    };
    Component {
        name: "containerd",
        version: version.to_owned(),
        module: module.to_owned(),
        upstream,
        patches: &[],
        pins: &[],

        outputs: vec![
            cmd("containerd", &["urfave_cli_no_docs", "no_btrfs"]),
            cmd(
                "containerd-shim-runc-v2",
                &["urfave_cli_no_docs", "no_grpc"],
            ),
            cmd("ctr", &["urfave_cli_no_docs", "no_btrfs"]),
        ],
    }
}

/// runc with seccomp (cgo: its `nsenter` is C).
pub fn runc() -> Component {
    let version = versions::RUNC;
    Component {
        name: "runc",
        version: version.to_owned(),
        module: "runc".to_owned(),
        upstream: "github.com/opencontainers/runc",
        patches: &[],
        pins: &[],

        outputs: vec![Output {
            name: "runc",
            package: "github.com/opencontainers/runc".to_owned(),
            test_binary: false,
            cgo: true,
            tags: &["seccomp", "urfave_cli_no_docs"],
            ldflags: format!("{STRIP} -X main.version={version}"),
        }],
    }
}

/// The etcd server.
pub fn etcd() -> Component {
    let version = versions::ETCD;
    Component {
        name: "etcd",
        version: version.to_owned(),
        module: "etcd".to_owned(),
        upstream: "go.etcd.io/etcd/server/v3",
        patches: &[],
        pins: &[],

        outputs: vec![Output {
            name: "etcd",
            package: "go.etcd.io/etcd/server/v3".to_owned(),
            test_binary: false,
            cgo: false,
            tags: &[],
            ldflags: STRIP.to_owned(),
        }],
    }
}

/// CoreDNS, with its default plugins.
pub fn coredns() -> Component {
    let version = versions::COREDNS;
    Component {
        name: "coredns",
        version: version.to_owned(),
        module: "coredns".to_owned(),
        upstream: "github.com/coredns/coredns",
        patches: &[],
        pins: &[],

        outputs: vec![Output {
            name: "coredns",
            package: "github.com/coredns/coredns".to_owned(),
            test_binary: false,
            cgo: false,
            tags: &[],
            ldflags: STRIP.to_owned(),
        }],
    }
}

/// The reference CNI plugins the test bed uses: loopback (every sandbox), ptp and host-local
/// (the comparisons), bridge (kube-router's pods), portmap, bandwidth and tuning (the chains).
pub fn cni_plugins() -> Component {
    let version = versions::CNI_PLUGINS;
    let plugin = |name: &'static str, dir: &str| Output {
        name,
        package: format!("github.com/containernetworking/plugins/plugins/{dir}/{name}"),
        test_binary: false,
        cgo: false,
        tags: &[],
        ldflags: format!(
            "{STRIP} -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=v{version}"
        ),
    };
    Component {
        name: "cni-plugins",
        version: version.to_owned(),
        module: "cni-plugins".to_owned(),
        upstream: "github.com/containernetworking/plugins",
        patches: &[],
        pins: &[],

        outputs: vec![
            plugin("loopback", "main"),
            plugin("ptp", "main"),
            plugin("bridge", "main"),
            plugin("host-local", "ipam"),
            plugin("portmap", "meta"),
            plugin("bandwidth", "meta"),
            plugin("tuning", "meta"),
        ],
    }
}

/// The package of network-policy-api's conformance suite (`TestConformance`), compiled with
/// `go test -c`; also the package its test events name.
pub const CNP_CONFORMANCE_PACKAGE: &str = "sigs.k8s.io/network-policy-api/conformance";

/// SIG Network's ClusterNetworkPolicy API (`cargo xtask cluster e2e --suite
/// cluster-network-policy`): its conformance suite as a test binary (`go test -c` of upstream's
/// package; the manifests it applies are embedded), and `test2json` from the same toolchain,
/// which turns the binary's `-test.v=test2json` output into test events. The cluster takes the
/// CRD from the same module ([`Component::source_dir`]).
pub fn network_policy_api() -> Component {
    Component {
        name: "network-policy-api",
        version: versions::NETWORK_POLICY_API.to_owned(),
        module: "network-policy-api".to_owned(),
        upstream: "sigs.k8s.io/network-policy-api",
        patches: &[],
        pins: &[],

        outputs: vec![
            Output {
                name: "conformance.test",
                package: CNP_CONFORMANCE_PACKAGE.to_owned(),
                test_binary: true,
                cgo: false,
                tags: &[],
                ldflags: STRIP.to_owned(),
            },
            Output {
                name: "test2json",
                package: "cmd/test2json".to_owned(),
                test_binary: false,
                cgo: false,
                tags: &[],
                ldflags: STRIP.to_owned(),
            },
        ],
    }
}

/// Every component a cluster of Kubernetes `k` runs, in build order (the small ones first).
pub fn cluster(k: Kubernetes) -> Vec<Component> {
    vec![
        cni_plugins(),
        runc(),
        etcd(),
        containerd(),
        coredns(),
        kubernetes(k),
    ]
}

/// The components the tests run beside the cluster's: containerd 1.7 (`flock-e2e`'s test of
/// the installed conflist on it).
pub fn others() -> Vec<Component> {
    vec![containerd_1_7()]
}

/// What the suites run against a cluster besides Kubernetes' own (`kubernetes_e2e`, which comes
/// from the Kubernetes module of the cluster's release): built only when a suite runs, or by
/// `cargo xtask cluster build`.
pub fn suites() -> Vec<Component> {
    vec![network_policy_api()]
}

/// Helm's command line, stamped with its version as its Makefile stamps it (else `helm
/// version` says v3.x-dev, and a chart's `kubeVersion` checks see no release).
pub fn helm() -> Component {
    let version = versions::HELM;
    Component {
        name: "helm",
        version: version.to_owned(),
        module: "helm".to_owned(),
        upstream: "helm.sh/helm/v3",
        patches: &[],
        pins: &[],

        outputs: vec![Output {
            name: "helm",
            package: "helm.sh/helm/v3/cmd/helm".to_owned(),
            test_binary: false,
            cgo: false,
            tags: &[],
            ldflags: format!(
                "{STRIP} -X helm.sh/helm/v3/internal/version.version=v{version} \
                 -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
            ),
        }],
    }
}

/// Multus's module path.
pub const MULTUS_MODULE: &str = "gopkg.in/k8snetworkplumbingwg/multus-cni.v4";

/// Multus, thick plugin: its daemon, its shim, the installer that copies the shim to the node
/// and the `passthru` plugin it copies beside it (what its image holds under
/// `/usr/src/multus-cni/bin`), stamped as its
/// `hack/build-go.sh` stamps them. The cluster takes its deployment manifest from the same
/// module ([`Component::source_dir`]).
pub fn multus() -> Component {
    let version = versions::MULTUS;
    let output = |name: &'static str, dir: &str| Output {
        name,
        package: format!("{MULTUS_MODULE}/cmd/{dir}"),
        test_binary: false,
        cgo: false,
        tags: &[],
        ldflags: format!(
            "{STRIP} -X {MULTUS_MODULE}/pkg/multus.version=v{version} \
             -X {MULTUS_MODULE}/pkg/multus.releaseStatus=,released"
        ),
    };
    Component {
        name: "multus",
        version: version.to_owned(),
        module: "multus".to_owned(),
        upstream: MULTUS_MODULE,
        patches: &[],
        pins: &[],

        outputs: vec![
            output("multus-daemon", "multus-daemon"),
            output("multus-shim", "multus-shim"),
            output("install_multus", "install_multus"),
            // the installer copies it beside the shim
            output("passthru", "passthru-cni"),
        ],
    }
}

/// The add-ons a cluster runs when asked: Multus (`--multus`).
pub fn addons() -> Vec<Component> {
    vec![multus()]
}

/// kube-router's module path.
pub const KUBE_ROUTER_MODULE: &str = "github.com/cloudnativelabs/kube-router/v2";

/// kube-router, stamped as its Makefile stamps it: a comparison peer (`cargo xtask cluster up
/// --cni kube-router`), run only inside the test bed.
pub fn kube_router() -> Component {
    let version = versions::KUBE_ROUTER;
    Component {
        name: "kube-router",
        version: version.to_owned(),
        module: "kube-router".to_owned(),
        upstream: KUBE_ROUTER_MODULE,
        patches: KUBE_ROUTER_PATCHES,
        // docker v25.0.3+incompatible (no go.mod) brings in its tests' imports: the versions
        // of its `vendor.mod`, which upstream's build resolves to.
        pins: &[
            (
                "github.com/Azure/go-ansiterm",
                "v0.0.0-20210617225240-d185dfc1b5a1",
            ),
            ("github.com/cenkalti/backoff/v4", "v4.2.1"),
            (
                "go.opentelemetry.io/otel/exporters/otlp/otlptrace",
                "v1.19.0",
            ),
            ("go.opentelemetry.io/proto/otlp", "v1.0.0"),
        ],

        outputs: vec![Output {
            name: "kube-router",
            package: format!("{KUBE_ROUTER_MODULE}/cmd/kube-router"),
            test_binary: false,
            cgo: false,
            tags: &[],
            ldflags: format!("{STRIP} -X {KUBE_ROUTER_MODULE}/pkg/version.Version=v{version}"),
        }],
    }
}

/// The one change to kube-router: its policy controller's IPv6 rules name the ipsets of a
/// policy's pods without the `inet6:` prefix the sets are created with, so `ip6tables-restore`
/// refuses the whole IPv6 ruleset ("Set KUBE-SRC-… doesn't exist") and the controller aborts
/// every sync — after which no policy change, of either family, is enforced (upstream's
/// issue cloudnativelabs/kube-router#1653, v2.1.0, fixed in later releases the module proxy
/// does not serve). The rules name each set as its family's ipset handler names it.
const KUBE_ROUTER_PATCHES: &[Patch] = &[Patch::Replace {
    file: "pkg/controllers/netpol/policy.go",
    old: "\t\targs = append(args, \"-m\", \"set\", \"--match-set\", srcIPSetName, \"src\")\n\t}\n\tif dstIPSetName != \"\" {\n\t\targs = append(args, \"-m\", \"set\", \"--match-set\", dstIPSetName, \"dst\")\n",
    new: "\t\targs = append(args, \"-m\", \"set\", \"--match-set\", npc.ipSetHandlers[ipFamily].Name(srcIPSetName), \"src\")\n\t}\n\tif dstIPSetName != \"\" {\n\t\targs = append(args, \"-m\", \"set\", \"--match-set\", npc.ipSetHandlers[ipFamily].Name(dstIPSetName), \"dst\")\n",
    count: 1,
}];

/// kube-network-policies' module path.
pub const KUBE_NETWORK_POLICIES_MODULE: &str = "sigs.k8s.io/kube-network-policies";

/// kube-network-policies (its one command, `cmd`, which upstream's image names `netpol`): a
/// comparison peer (`cargo xtask cluster up --policy kube-network-policies`), run only inside
/// the test bed.
pub fn kube_network_policies() -> Component {
    Component {
        name: "kube-network-policies",
        version: versions::KUBE_NETWORK_POLICIES.to_owned(),
        module: "kube-network-policies".to_owned(),
        upstream: KUBE_NETWORK_POLICIES_MODULE,
        patches: KUBE_NETWORK_POLICIES_PATCHES,
        pins: &[],

        outputs: vec![Output {
            name: "netpol",
            package: format!("{KUBE_NETWORK_POLICIES_MODULE}/cmd"),
            test_binary: false,
            cgo: false,
            tags: &[],
            ldflags: STRIP.to_owned(),
        }],
    }
}

/// The one change to kube-network-policies: the kernels the test bed runs on may lack
/// nftables' `queue` expression (`CONFIG_NFT_QUEUE`; this machine's does), and with it
/// upstream's ruleset fails to load as a whole and enforces nothing (it fails open, saying so
/// only in its log). Its three `queue` statements become the xtables `NFQUEUE` target through
/// nftables' compat expression, which such kernels have: the same rules, sets, chains and queue,
/// the same verdicts from the same userspace code.
const KUBE_NETWORK_POLICIES_PATCHES: &[Patch] = &[
    Patch::Replace {
        file: "pkg/networkpolicy/controller.go",
        old: "\tqueue := &expr.Queue{Num: uint16(c.config.QueueID)}\n\tif c.config.FailOpen {\n\t\tqueue.Flag = expr.QueueFlagBypass\n\t}\n",
        new: "\tqueue := nfqueueTarget(uint16(c.config.QueueID), c.config.FailOpen)\n",
        count: 2,
    },
    // the DNS agent's (run with --admin-network-policy)
    Patch::Replace {
        file: "pkg/networkpolicy/dnsagent.go",
        old: "&expr.Queue{Num: uint16(n.nfQueueID), Flag: expr.QueueFlagBypass},",
        new: "nfqueueTarget(uint16(n.nfQueueID), true),",
        count: 1,
    },
    Patch::Add {
        file: "pkg/networkpolicy/zz_testbed_nfqueue.go",
        text: include_str!("../go/kube-network-policies/patch/nfqueue.go.in"),
    },
];

/// The CNIs and policy engines flock is compared with in the test bed, built only when a
/// cluster runs one.
pub fn peers() -> Vec<Component> {
    vec![kube_router(), kube_network_policies()]
}

/// Every component with a wrapper module of its own besides the cluster's (whose Kubernetes
/// module is one per release): the tests', the suites', the tools, the add-ons and the peers.
pub fn beside_the_cluster() -> Vec<Component> {
    let mut all = others();
    all.extend(suites());
    all.extend(tools());
    all.extend(addons());
    all.extend(peers());
    all
}

/// The tools the test bed runs beside a cluster: Helm.
pub fn tools() -> Vec<Component> {
    vec![helm()]
}

/// The wrapper modules' folder: `flock-testbed/go`.
pub fn modules_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("go")
}

/// The Go toolchain: `go` on `PATH`, else where the machine image installs it.
pub fn go() -> Result<PathBuf> {
    let on_path = Command::new("go")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if on_path {
        return Ok(PathBuf::from("go"));
    }
    if Path::new(GO_FALLBACK).exists() {
        return Ok(PathBuf::from(GO_FALLBACK));
    }
    bail!(
        "no Go toolchain: `go` is not on PATH and {GO_FALLBACK} does not exist (the test bed \
         builds Kubernetes and its peers from Go modules with the machine's toolchain: Go \
         1.26.8 or newer, the highest `go` line of flock-testbed/go/*/go.mod)"
    )
}

/// `go ARGS…` with the test bed's caches, the machine's toolchain only (no toolchain
/// download) and the module files as committed (`-mod=readonly`).
pub fn go_command(dir: &Path) -> Result<Command> {
    let mut cmd = Command::new("nice");
    cmd.args(["-n", "19"])
        .arg(go()?)
        .current_dir(dir)
        .env("GOCACHE", cache_dir().join("go-build"))
        .env("GOMODCACHE", cache_dir().join("go-mod"))
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=readonly -buildvcs=false");
    Ok(cmd)
}

impl Component {
    /// `/var/cache/flock/NAME-VERSION`.
    pub fn dir(&self) -> PathBuf {
        cache_dir().join(format!("{}-{}", self.name, self.version))
    }

    /// The wrapper module's folder.
    pub fn module_dir(&self) -> PathBuf {
        modules_dir().join(&self.module)
    }

    fn stamp(&self) -> PathBuf {
        self.dir().join("BUILT")
    }

    /// The upstream module's files as Go's module cache holds them (read-only), for what a
    /// component ships besides Go code (network-policy-api's CRDs and manifests): downloaded
    /// through the module proxy when the cache lacks them, their hash checked against the
    /// wrapper's `go.sum`.
    pub fn source_dir(&self) -> Result<PathBuf> {
        let json = sys::output(
            go_command(&self.module_dir())?
                .args(["mod", "download", "-json"])
                .arg(format!("{}@v{}", self.upstream, self.version)),
        )?;
        let dir = json_field(&json, "Dir").with_context(|| {
            format!(
                "no Dir in `go mod download -json {}@v{}`: {json}",
                self.upstream, self.version
            )
        })?;
        Ok(PathBuf::from(dir))
    }

    /// Upstream's source with [`Component::patches`] applied, copied beside the component's
    /// binaries: a patched component is built there, as upstream's own module, with upstream's
    /// `go.mod` and `go.sum` (Go refuses to overlay files of the module cache).
    fn patched_source(&self) -> Result<PathBuf> {
        let source = self.source_dir()?;
        let dir = self.dir().join("src");
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("remove {}", dir.display()))?;
        }
        std::fs::create_dir_all(self.dir())
            .with_context(|| format!("create {}", self.dir().display()))?;
        // The module cache's files are read-only: copied writable.
        sys::run(
            Command::new("cp")
                .args(["-r", "--no-preserve=mode"])
                .arg(&source)
                .arg(&dir),
        )?;
        apply_patches(&dir, self.patches)
            .with_context(|| format!("patch {} v{}", self.upstream, self.version))?;
        Ok(dir)
    }

    /// What a build depends on: the module files and every build command. A stamp that names
    /// another recipe is a build to redo.
    fn recipe(&self) -> Result<String> {
        let mut hash = Sha256::new();
        for file in ["go.mod", "go.sum"] {
            let path = self.module_dir().join(file);
            let text = std::fs::read(&path).with_context(|| format!("read {}", path.display()))?;
            hash.update(&text);
        }
        hash.update(format!("{:?}", self.outputs).as_bytes());
        // Only when there are any: the recipes of the builds made before patches stay theirs.
        if !self.patches.is_empty() {
            hash.update(format!("{:?}", self.patches).as_bytes());
        }
        let digest = hash.finalize();
        Ok(digest.iter().fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        }))
    }

    /// The cached build, if complete and of the current recipe.
    pub fn cached(&self) -> Result<Option<Built>> {
        let recipe = self.recipe()?;
        let bin = self.dir().join("bin");
        let Ok(stamp) = std::fs::read_to_string(self.stamp()) else {
            return Ok(None);
        };
        let mut lines = stamp.lines();
        if lines.next() != Some(recipe.as_str())
            || !self.outputs.iter().all(|o| bin.join(o.name).exists())
        {
            return Ok(None);
        }
        let took = lines
            .find_map(|l| {
                l.strip_prefix("built in ")?
                    .strip_suffix(" s")?
                    .parse()
                    .ok()
            })
            .map(Duration::from_secs_f64);
        Ok(Some(Built {
            bin,
            took,
            fresh: false,
        }))
    }

    /// Returns the cached build, building it first when the cache has none (printing each
    /// binary's time).
    pub fn ensure_built(&self) -> Result<Built> {
        if let Some(built) = self.cached()? {
            return Ok(built);
        }
        if self.outputs.iter().any(|o| o.cgo) {
            sys::ensure_packages(BUILD_PACKAGES)?;
        }
        let bin = self.dir().join("bin");
        std::fs::create_dir_all(&bin).with_context(|| format!("create {}", bin.display()))?;
        eprintln!(
            "testbed: building {} {} from its Go module ({}) into {}",
            self.name,
            self.version,
            self.module_dir().display(),
            bin.display()
        );
        let started = Instant::now();
        let mut times = String::new();
        for output in &self.outputs {
            let t = Instant::now();
            self.build_one(output, &bin).with_context(|| {
                format!("build {} of {} {}", output.name, self.name, self.version)
            })?;
            let took = t.elapsed().as_secs_f64();
            eprintln!("testbed:   {} in {took:.0} s", output.name);
            let _ = writeln!(times, "{} {took:.1} s", output.name);
        }
        let took = started.elapsed();
        std::fs::write(
            self.stamp(),
            format!(
                "{}\nbuilt in {:.1} s\n{times}",
                self.recipe()?,
                took.as_secs_f64()
            ),
        )
        .with_context(|| format!("write {}", self.stamp().display()))?;
        eprintln!(
            "testbed: {} {} built in {}:{:02} min",
            self.name,
            self.version,
            took.as_secs() / 60,
            took.as_secs() % 60
        );
        Ok(Built {
            bin,
            took: Some(took),
            fresh: true,
        })
    }

    fn build_one(&self, output: &Output, bin: &Path) -> Result<()> {
        let mut cmd = if self.patches.is_empty() {
            go_command(&self.module_dir())?
        } else {
            go_command(&self.patched_source()?)?
        };
        cmd.arg(if output.test_binary { "test" } else { "build" });
        if output.test_binary {
            cmd.arg("-c");
        }
        cmd.arg("-trimpath")
            .arg("-o")
            .arg(bin.join(output.name))
            .arg(format!("-ldflags={}", output.ldflags));
        if !output.tags.is_empty() {
            cmd.arg(format!("-tags={}", output.tags.join(",")));
        }
        cmd.arg(&output.package)
            .env("CGO_ENABLED", if output.cgo { "1" } else { "0" });
        // Quiet unless it fails: the output of a failed build is in the error.
        sys::output(&mut cmd).map(drop)
    }
}

/// Builds (or finds) every component of `list`, then prints a table of each: version, where,
/// and the time its build took.
pub fn ensure_all(list: &[Component]) -> Result<Vec<Built>> {
    let built = list
        .iter()
        .map(Component::ensure_built)
        .collect::<Result<Vec<_>>>()?;
    let rows: Vec<Vec<String>> = list
        .iter()
        .zip(&built)
        .map(|(c, b)| {
            vec![
                c.name.to_owned(),
                c.version.clone(),
                match (b.took, b.fresh) {
                    (Some(t), true) => format!("{:.0} s (now)", t.as_secs_f64()),
                    (Some(t), false) => format!("{:.0} s (cached)", t.as_secs_f64()),
                    (None, _) => "cached".to_owned(),
                },
                b.bin.display().to_string(),
            ]
        })
        .collect();
    let mut out = String::new();
    sys::table(
        &mut out,
        &["component", "version", "build", "binaries"],
        &rows,
    );
    eprint!("{out}");
    Ok(built)
}

/// A string field of `go mod download -json`'s output.
pub(crate) fn json_field(json: &str, key: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(json).ok()?;
    value[key].as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `require` line of a wrapper module for `module`, if any.
    fn required(go_mod: &str, module: &str) -> Option<String> {
        go_mod.lines().find_map(|l| {
            let mut words = l.split_whitespace();
            let first = words.next()?;
            let (name, version) = if first == "require" {
                (words.next()?, words.next()?)
            } else {
                (first, words.next()?)
            };
            (name == module).then(|| version.to_owned())
        })
    }

    #[test]
    fn every_wrapper_module_requires_the_version_named_in_versions() {
        let mut all: Vec<Component> = versions::KUBERNETES
            .iter()
            .map(|k| kubernetes(*k))
            .collect();
        all.extend(
            cluster(Kubernetes::newest())
                .into_iter()
                .filter(|c| c.name != "kubernetes"),
        );
        all.extend(beside_the_cluster());
        for c in all {
            let path = c.module_dir().join("go.mod");
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(
                required(&text, c.upstream).as_deref(),
                Some(format!("v{}", c.version).as_str()),
                "{} must require {} v{}",
                path.display(),
                c.upstream,
                c.version
            );
            assert!(
                c.module_dir().join("go.sum").exists(),
                "{} has no go.sum",
                c.module
            );
        }
    }

    #[test]
    fn a_patch_changes_exactly_what_it_names_or_refuses() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("pkg")).unwrap();
        std::fs::write(dir.path().join("pkg/a.go"), "x := 1\ny := 2\nx := 1\n").unwrap();
        let replace = |count| Patch::Replace {
            file: "pkg/a.go",
            old: "x := 1\n",
            new: "x := f()\n",
            count,
        };
        let add = Patch::Add {
            file: "pkg/b.go",
            text: "func f() int { return 1 }\n",
        };
        let err = apply_patches(dir.path(), &[replace(1)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("pkg/a.go holds 2 of the text"), "{err}");
        apply_patches(dir.path(), &[replace(2), add]).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("pkg/a.go")).unwrap(),
            "x := f()\ny := 2\nx := f()\n"
        );
        assert!(dir.path().join("pkg/b.go").exists());
        let err = apply_patches(dir.path(), &[add]).unwrap_err().to_string();
        assert!(err.contains("adds pkg/b.go, which upstream has"), "{err}");
    }

    #[test]
    fn kubernetes_binaries_carry_their_version() {
        let k = kubernetes(Kubernetes::newest());
        let e2e = kubernetes_e2e(Kubernetes::newest());
        let apiserver = k
            .outputs
            .iter()
            .find(|o| o.name == "kube-apiserver")
            .unwrap();
        assert!(
            apiserver
                .ldflags
                .contains(&format!("gitVersion=v{}", Kubernetes::newest()))
        );
        let e2e_test = e2e.outputs.iter().find(|o| o.name == "e2e.test").unwrap();
        assert!(e2e_test.test_binary);
        assert_eq!(e2e_test.ldflags, apiserver.ldflags);
        assert_ne!(k.dir(), e2e.dir());
    }

    #[test]
    fn cnp_conformance_is_upstreams_test_package_with_test2json_beside() {
        let c = network_policy_api();
        let suite = c
            .outputs
            .iter()
            .find(|o| o.name == "conformance.test")
            .unwrap();
        assert!(suite.test_binary);
        assert_eq!(suite.package, CNP_CONFORMANCE_PACKAGE);
        assert!(suite.package.starts_with(c.upstream));
        let test2json = c.outputs.iter().find(|o| o.name == "test2json").unwrap();
        assert!(!test2json.test_binary && !test2json.cgo);
        assert!(c.dir().ends_with(format!(
            "network-policy-api-{}",
            versions::NETWORK_POLICY_API
        )));
    }
}
