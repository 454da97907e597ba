//! Kubernetes NetworkPolicy semantics for flock (work in progress). Pure: no I/O.
