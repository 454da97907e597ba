//! A stand-in Kubernetes node: a network namespace, containerd with the CRI
//! plugin using a given conflist (or a CNI conf dir an installer filled) and
//! CNI bin dir, the pause image imported, and a hook that runs before
//! containerd starts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use flock_testkit::Netns;
use tempfile::TempDir;

use crate::config::{ContainerdConfig, Snapshotter};
use crate::containerd::Containerd;
use crate::cri::CriClient;
use crate::image::PauseImage;
use crate::{Error, Result};

/// Runs once the node namespace and the harness directory exist, before
/// containerd starts: start an agent inside `node` (anything it spawns
/// there is killed when the node is dropped), write files it needs.
pub type BeforeStart = Box<
    dyn FnOnce(&Netns, &Path) -> std::result::Result<(), Box<dyn std::error::Error + Send + Sync>>
        + Send,
>;

/// Where the CRI plugin's CNI configuration comes from.
#[derive(Clone, Debug)]
pub enum CniConf {
    /// A conflist the harness writes into its own conf dir, `DIR/net.d`.
    Conflist {
        /// The conflist (JSON text).
        text: String,
        /// Its file name (libcni loads `*.conflist`).
        file: String,
    },
    /// A conf dir as an installer (`flock-agent install-cni`) left it, used as is.
    Dir(PathBuf),
}

/// What a node runs: which CNI, from where, and what to start first.
pub struct NodeSetup {
    /// The CNI configuration the CRI plugin loads.
    pub cni_conf: CniConf,
    /// Where the CRI plugin looks for the plugins the conflist names.
    pub cni_bin_dir: PathBuf,
    /// Runs before containerd starts.
    pub before_start: Option<BeforeStart>,
    /// The pause image's reference.
    pub image_name: String,
    /// containerd's snapshotter.
    pub snapshotter: Snapshotter,
    /// How long to wait for the CRI plugin to report NetworkReady.
    pub ready_timeout: Duration,
    /// The folder of the containerd release to run, when not the default
    /// ([`crate::program`]).
    pub containerd_dir: Option<PathBuf>,
}

impl std::fmt::Debug for NodeSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeSetup")
            .field("cni_conf", &self.cni_conf)
            .field("cni_bin_dir", &self.cni_bin_dir)
            .field("before_start", &self.before_start.is_some())
            .field("image_name", &self.image_name)
            .field("snapshotter", &self.snapshotter)
            .field("containerd_dir", &self.containerd_dir)
            .finish_non_exhaustive()
    }
}

impl NodeSetup {
    /// A node whose CRI plugin uses `conflist` (written as `10-e2e.conflist`)
    /// with plugins from `cni_bin_dir`; no hook, image `flock.test/pause:e2e`,
    /// overlayfs.
    pub fn new(conflist: impl Into<String>, cni_bin_dir: impl Into<PathBuf>) -> NodeSetup {
        NodeSetup::with_cni_conf(
            CniConf::Conflist {
                text: conflist.into(),
                file: "10-e2e.conflist".into(),
            },
            cni_bin_dir,
        )
    }

    /// A node whose CRI plugin reads the conf dir `conf_dir` and the bin dir
    /// `cni_bin_dir` as an installer filled them, as on a real node; otherwise
    /// as [`NodeSetup::new`].
    pub fn installed(conf_dir: impl Into<PathBuf>, cni_bin_dir: impl Into<PathBuf>) -> NodeSetup {
        NodeSetup::with_cni_conf(CniConf::Dir(conf_dir.into()), cni_bin_dir)
    }

    fn with_cni_conf(cni_conf: CniConf, cni_bin_dir: impl Into<PathBuf>) -> NodeSetup {
        NodeSetup {
            cni_conf,
            cni_bin_dir: cni_bin_dir.into(),
            before_start: None,
            image_name: "flock.test/pause:e2e".into(),
            snapshotter: Snapshotter::default(),
            ready_timeout: Duration::from_secs(30),
            containerd_dir: None,
        }
    }

    /// Runs the containerd (with its `ctr` and shim) in `dir` rather than the default one.
    pub fn containerd_dir(mut self, dir: impl Into<PathBuf>) -> NodeSetup {
        self.containerd_dir = Some(dir.into());
        self
    }

    /// Sets the hook that runs before containerd starts.
    pub fn before_start<F>(mut self, hook: F) -> NodeSetup
    where
        F: FnOnce(
                &Netns,
                &Path,
            ) -> std::result::Result<(), Box<dyn std::error::Error + Send + Sync>>
            + Send
            + 'static,
    {
        self.before_start = Some(Box::new(hook));
        self
    }
}

/// A running stand-in node. Dropping it kills containerd, its shims and
/// sandboxes, then whatever runs in the node namespace, deletes the
/// namespace, then the directory.
#[derive(Debug)]
pub struct E2eNode {
    // Field order is drop order.
    containerd: Containerd,
    netns: Netns,
    image: PauseImage,
    dir: TempDir,
}

impl E2eNode {
    /// Creates the node namespace and a temp dir, writes the conflist to
    /// `DIR/net.d` (or uses the installed conf dir), runs the hook, builds the
    /// pause image, starts containerd (blocking while it comes up), imports
    /// the image and waits until the CRI plugin reports the runtime and the
    /// network ready.
    pub async fn start(setup: NodeSetup) -> Result<E2eNode> {
        let dir = tempfile::Builder::new()
            .prefix("flock-e2e-")
            .tempdir()
            .map_err(|source| Error::Io {
                op: "create harness directory",
                path: std::env::temp_dir(),
                source,
            })?;
        let netns = Netns::new("ctd");
        let conf_dir = match setup.cni_conf {
            CniConf::Dir(conf_dir) => conf_dir,
            CniConf::Conflist { text, file } => {
                let conf_dir = dir.path().join("net.d");
                std::fs::create_dir_all(&conf_dir).map_err(|source| Error::Io {
                    op: "create CNI conf dir",
                    path: conf_dir.clone(),
                    source,
                })?;
                let conflist_path = conf_dir.join(file);
                std::fs::write(&conflist_path, text).map_err(|source| Error::Io {
                    op: "write conflist",
                    path: conflist_path,
                    source,
                })?;
                conf_dir
            }
        };
        if let Some(hook) = setup.before_start {
            hook(&netns, dir.path()).map_err(|source| Error::BeforeStart { source })?;
        }
        let image = PauseImage::build(&setup.image_name, dir.path())?;
        let mut config =
            ContainerdConfig::in_dir(dir.path(), &setup.cni_bin_dir, &conf_dir, &setup.image_name);
        config.snapshotter = setup.snapshotter;
        config.bin_dir = setup.containerd_dir;
        let ctr = config.program("ctr");
        let containerd = Containerd::start(&netns.path(), config, dir.path())?;
        let node = E2eNode {
            containerd,
            netns,
            image,
            dir,
        };
        node.image
            .import(&ctr, node.containerd.socket(), setup.snapshotter.as_str())?;
        node.cri().await?.wait_ready(setup.ready_timeout).await?;
        Ok(node)
    }

    /// The node's network namespace.
    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// The containerd it runs.
    pub fn containerd(&self) -> &Containerd {
        &self.containerd
    }

    /// The output of `ip ARGS…` run inside a sandbox's network namespace (as containerd
    /// mounted it); panics with `ip`'s stderr if it fails, as a test wants.
    pub fn ip_in_sandbox(&self, netns_path: &Path, args: &[&str]) -> String {
        let out = self
            .containerd
            .command_in_netns(netns_path, "ip")
            .args(args)
            .output()
            .expect("run ip in sandbox netns");
        assert!(
            out.status.success(),
            "ip {args:?} in {}: {}",
            netns_path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The harness directory (config, log, root, state, `net.d` unless the
    /// conf dir was installed elsewhere).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The imported pause image.
    pub fn image(&self) -> &PauseImage {
        &self.image
    }

    /// A new CRI client on containerd's socket.
    pub async fn cri(&self) -> Result<CriClient> {
        CriClient::connect(self.containerd.socket()).await
    }
}
