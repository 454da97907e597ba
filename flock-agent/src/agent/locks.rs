//! Per-container locks: requests for one container are serialised, different containers run
//! in parallel, and an entry lives only while someone holds or waits for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Container ID → its lock.
pub(super) type ContainerLocks = Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>;

/// Holds one container's lock; owns what it needs, so it can move into a background task
/// (the veth deletion after a DEL keeps the container locked until the veth is gone).
pub(super) struct ContainerGuard {
    locks: Arc<ContainerLocks>,
    container_id: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl ContainerGuard {
    /// Waits for and takes the lock of `container_id`.
    pub(super) async fn lock(locks: &Arc<ContainerLocks>, container_id: &str) -> ContainerGuard {
        let lock = locks
            .lock()
            .expect("container locks")
            .entry(container_id.to_owned())
            .or_default()
            .clone();
        ContainerGuard {
            locks: locks.clone(),
            container_id: container_id.to_owned(),
            guard: Some(lock.lock_owned().await),
        }
    }
}

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        self.guard.take();
        let mut locks = self.locks.lock().expect("container locks");
        // Only the map still holds the mutex: nobody waits for it, the entry can go.
        if locks
            .get(&self.container_id)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            locks.remove(&self.container_id);
        }
    }
}
