//! A typed model of what a flock node tells BIRD 2 and a deterministic renderer
//! of the complete configuration.
//!
//! Pure: no I/O. Writing the file and calling `birdc` is the agent's job.
