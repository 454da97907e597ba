// Written by `cargo xtask cluster gomod` from flock-testbed/src/components.rs.

//go:build tools

// Package tests names the upstream test packages the test bed compiles with
// `go test -c`. A dependency's test package is in the module's package graph only
// when imported, and `go mod tidy` keeps the sums of its tests' dependencies only
// for a package in that graph. The build tag keeps this file out of every build.
package tests

import (
	_ "sigs.k8s.io/network-policy-api/conformance"
)
