//! `flock-agent`: the node daemon.

fn main() {
    std::process::exit(1);
}
