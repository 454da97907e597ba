// Written by `cargo xtask cluster gomod` from flock-testbed/src/versions.rs.
module github.com/fritzlab/flock/testbed/network-policy-api

go 1.26.6

require sigs.k8s.io/network-policy-api v0.3.0
