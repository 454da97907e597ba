//! containerd's configuration, the one renderer of the workspace: version 3 for containerd 2
//! (what the test bed's nodes and the harness run), version 2 for containerd 1.6 and 1.7 (the
//! releases Kubernetes 1.35 and 1.36 still run on).

use std::path::{Path, PathBuf};

/// The snapshotter containerd unpacks images with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Snapshotter {
    /// overlayfs (needs a filesystem overlay can sit on; ext4 here).
    #[default]
    Overlayfs,
    /// Plain copies: works on any filesystem, slower for big images.
    Native,
}

impl Snapshotter {
    /// containerd's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Snapshotter::Overlayfs => "overlayfs",
            Snapshotter::Native => "native",
        }
    }
}

/// Everything that varies between two harness instances' containerd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerdConfig {
    /// Persistent data (content store, snapshots).
    pub root: PathBuf,
    /// Runtime state (sockets of shims, sandbox netns pins).
    pub state: PathBuf,
    /// The gRPC socket (containerd API and CRI).
    pub socket: PathBuf,
    /// Where the CRI plugin finds CNI plugin binaries.
    pub cni_bin_dir: PathBuf,
    /// Where the CRI plugin reads the conflist.
    pub cni_conf_dir: PathBuf,
    /// The image reference of the sandbox image.
    pub sandbox_image: String,
    /// The snapshotter for images.
    pub snapshotter: Snapshotter,
    /// runc, when not the one on `PATH`.
    pub runc: Option<PathBuf>,
    /// The folder of `containerd`, `ctr` and `containerd-shim-runc-v2` to run, when not those
    /// [`crate::program`] finds (another containerd release beside the default one).
    pub bin_dir: Option<PathBuf>,
    /// Pin sandbox network namespaces under [`ContainerdConfig::state`] rather than the
    /// machine's `/run/netns` (a harness sharing the machine); a node that has its own
    /// `/run/netns` leaves them there, where the CNI agent looks.
    pub netns_under_state: bool,
    /// NRI's socket (containerd 2): under [`ContainerdConfig::state`] unless a node of its
    /// own puts it where NRI plugins look for it (`/var/run/nri/nri.sock`).
    pub nri_socket: PathBuf,
}

impl ContainerdConfig {
    /// The config for a harness rooted at `dir` (root, state and socket
    /// beneath it).
    pub fn in_dir(dir: &Path, cni_bin_dir: &Path, cni_conf_dir: &Path, image: &str) -> Self {
        ContainerdConfig {
            root: dir.join("root"),
            state: dir.join("state"),
            socket: dir.join("containerd.sock"),
            cni_bin_dir: cni_bin_dir.to_owned(),
            cni_conf_dir: cni_conf_dir.to_owned(),
            sandbox_image: image.to_owned(),
            snapshotter: Snapshotter::default(),
            runc: None,
            bin_dir: None,
            netns_under_state: true,
            nri_socket: dir.join("state").join("nri.sock"),
        }
    }

    /// `containerd`, `ctr` or the shim: from [`ContainerdConfig::bin_dir`] when set, else
    /// [`crate::program`]'s.
    pub fn program(&self, name: &str) -> PathBuf {
        match &self.bin_dir {
            Some(dir) => dir.join(name),
            None => crate::program(name),
        }
    }

    /// Renders the TOML for containerd 2 (config version 3). The choices are those of
    /// [`ContainerdConfig::render_v2`], under version 3's plugin names, and:
    /// - NRI's socket under our state unless [`ContainerdConfig::nri_socket`] says otherwise
    ///   (NRI is on by default, one socket per machine otherwise);
    /// - the sandbox image as the pinned image `sandbox` (the kubelet no longer names it);
    /// - `bin_dirs`, the list that replaced `bin_dir`.
    pub fn render(&self) -> String {
        let q = |p: &Path| toml_string(&p.display().to_string());
        let runc = self.runc_binary_option();
        format!(
            r#"version = 3
root = {root}
state = {state}
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.erofs"]

[grpc]
  address = {socket}

[ttrpc]
  address = {ttrpc}

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[plugins.'io.containerd.internal.v1.opt']
  path = {opt}

[plugins.'io.containerd.nri.v1.nri']
  socket_path = {nri}

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = {snapshotter}

  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = {image}

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = {netns_under_state}
  enable_selinux = false
  disable_apparmor = true
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true

  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"

    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = {runc_root}{runc}

  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [{bin_dir}]
    conf_dir = {conf_dir}
    max_conf_num = 1
"#,
            root = q(&self.root),
            state = q(&self.state),
            socket = q(&self.socket),
            ttrpc = toml_string(&format!("{}.ttrpc", self.socket.display())),
            opt = q(&self.root.join("opt")),
            nri = q(&self.nri_socket),
            image = toml_string(&self.sandbox_image),
            snapshotter = toml_string(self.snapshotter.as_str()),
            netns_under_state = self.netns_under_state,
            runc_root = q(&self.state.join("runc")),
            bin_dir = q(&self.cni_bin_dir),
            conf_dir = q(&self.cni_conf_dir),
        )
    }

    /// Renders the TOML for containerd 1.6 and 1.7 (config version 2). Notes on the choices:
    /// - `restrict_oom_score_adj`: root here lacks CAP_SYS_RESOURCE.
    /// - `netns_mounts_under_state_dir`: sandbox netns pins live under our
    ///   state dir, not the machine's `/run/netns`.
    /// - runc's state under ours, not the machine's `/run/containerd/runc`.
    /// - no TCP, no streaming on a fixed port: two instances can run at once.
    /// - `max_conf_num = 1`: the CRI plugin uses the first conflist, as
    ///   kubelet's containerd does.
    pub fn render_v2(&self) -> String {
        let q = |p: &Path| toml_string(&p.display().to_string());
        let runc = self.runc_binary_option();
        format!(
            r#"version = 2
root = {root}
state = {state}
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = {socket}

[ttrpc]
  address = {ttrpc}

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = {image}
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = {netns_under_state}
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = {snapshotter}
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = {runc_root}{runc}

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {bin_dir}
    conf_dir = {conf_dir}
    max_conf_num = 1
"#,
            root = q(&self.root),
            state = q(&self.state),
            socket = q(&self.socket),
            ttrpc = toml_string(&format!("{}.ttrpc", self.socket.display())),
            image = toml_string(&self.sandbox_image),
            snapshotter = toml_string(self.snapshotter.as_str()),
            netns_under_state = self.netns_under_state,
            runc_root = q(&self.state.join("runc")),
            bin_dir = q(&self.cni_bin_dir),
            conf_dir = q(&self.cni_conf_dir),
        )
    }
}

impl ContainerdConfig {
    /// runc's `BinaryName` option line, when runc is not the one on `PATH`.
    fn runc_binary_option(&self) -> String {
        match &self.runc {
            Some(path) => format!(
                "\n        BinaryName = {}",
                toml_string(&path.display().to_string())
            ),
            None => String::new(),
        }
    }
}

/// A TOML basic string (JSON's escaping is a subset TOML accepts).
fn toml_string(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_snapshot() {
        let cfg = ContainerdConfig::in_dir(
            Path::new("/tmp/e2e"),
            Path::new("/usr/lib/cni"),
            Path::new("/tmp/e2e/net.d"),
            "flock.test/pause:e2e",
        );
        insta::assert_snapshot!(cfg.render());
    }

    #[test]
    fn config_v2_snapshot() {
        let mut cfg = ContainerdConfig::in_dir(
            Path::new("/tmp/e2e"),
            Path::new("/usr/lib/cni"),
            Path::new("/tmp/e2e/net.d"),
            "flock.test/pause:e2e",
        );
        cfg.runc = Some("/opt/runc".into());
        insta::assert_snapshot!(cfg.render_v2());
    }

    #[test]
    fn paths_with_quotes_are_escaped() {
        assert_eq!(toml_string(r#"/a"b\c"#), r#""/a\"b\\c""#);
    }
}
