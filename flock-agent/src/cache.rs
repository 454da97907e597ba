//! The one watch cache of the agent: a map of a kind's objects (as far as a user keeps them)
//! with a watcher's relist semantics, fed straight from `kube`'s watch events. Pure: no
//! client, no task; the NetworkPolicy caches ([`crate::policy::view`]) and the Service
//! caches ([`crate::services`]) are made of it.

use std::collections::BTreeMap;

use kube::ResourceExt;
use kube::runtime::watcher::Event;

/// How many objects one page of a listing holds (bounds the memory of a relist).
pub const PAGE_SIZE: u32 = 500;

/// `(namespace, name)`; namespaces themselves use an empty first part.
pub type ObjectKey = (String, String);

/// One cache of a kind, with a watcher's relist semantics: a relist (`Init` … `InitDone`)
/// replaces the whole content at once, so objects deleted while the watch was down go.
#[derive(Debug, Clone)]
pub struct Relist<V> {
    items: BTreeMap<ObjectKey, V>,
    relisting: Option<BTreeMap<ObjectKey, V>>,
    synced: bool,
}

impl<V> Default for Relist<V> {
    fn default() -> Self {
        Relist {
            items: BTreeMap::new(),
            relisting: None,
            synced: false,
        }
    }
}

impl<V: PartialEq> Relist<V> {
    /// A (re)list starts.
    pub fn init(&mut self) {
        self.relisting = Some(BTreeMap::new());
    }

    /// An object of the listing (`None`: one the agent does not keep).
    pub fn init_apply(&mut self, key: ObjectKey, value: Option<V>) {
        match (&mut self.relisting, value) {
            (Some(list), Some(v)) => {
                list.insert(key, v);
            }
            (Some(_), None) => {}
            (None, value) => {
                self.set(key, value);
            }
        }
    }

    /// The listing is complete; returns whether the content changed (the first listing
    /// always counts as a change: the cache became known).
    pub fn init_done(&mut self) -> bool {
        let first = !self.synced;
        self.synced = true;
        match self.relisting.take() {
            Some(list) => {
                let changed = list != self.items;
                self.items = list;
                changed || first
            }
            None => first,
        }
    }

    /// An object was added or modified (`None`: it is no longer one the agent keeps) or,
    /// with `None`, deleted; returns whether the content changed.
    pub fn set(&mut self, key: ObjectKey, value: Option<V>) -> bool {
        match value {
            Some(v) => {
                if self.items.get(&key) == Some(&v) {
                    return false;
                }
                self.items.insert(key, v);
                true
            }
            None => self.items.remove(&key).is_some(),
        }
    }

    /// Whether the first listing is complete.
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// The objects.
    pub fn items(&self) -> &BTreeMap<ObjectKey, V> {
        &self.items
    }

    /// One object.
    pub fn get(&self, key: &ObjectKey) -> Option<&V> {
        self.items.get(key)
    }

    /// How many objects.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// An object's key in a [`Relist`]: `(namespace, name)`, with an empty namespace for
/// cluster-scoped kinds.
pub fn object_key<K: kube::Resource>(object: &K) -> ObjectKey {
    (object.namespace().unwrap_or_default(), object.name_any())
}

impl<V: PartialEq> Relist<V> {
    /// Feeds one watch event, keeping what `convert` makes of each object (`None`: one not
    /// kept); returns whether the content changed.
    pub fn feed<K: kube::Resource>(
        &mut self,
        event: Event<K>,
        mut convert: impl FnMut(&K) -> Option<V>,
    ) -> bool {
        match event {
            Event::Apply(k) => self.set(object_key(&k), convert(&k)),
            Event::Delete(k) => self.set(object_key(&k), None),
            Event::Init => {
                self.init();
                false
            }
            Event::InitApply(k) => {
                self.init_apply(object_key(&k), convert(&k));
                false
            }
            Event::InitDone => self.init_done(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ns: &str, name: &str) -> ObjectKey {
        (ns.into(), name.into())
    }

    #[test]
    fn a_relist_replaces_the_content_and_drops_what_was_deleted_meanwhile() {
        let mut r: Relist<u32> = Relist::default();
        assert!(!r.is_synced());
        r.init();
        r.init_apply(key("a", "1"), Some(1));
        r.init_apply(key("a", "2"), Some(2));
        r.init_apply(key("a", "skip"), None);
        assert!(r.is_empty(), "a listing is not visible before it is done");
        assert!(r.init_done(), "the first listing counts as a change");
        assert!(r.is_synced());
        assert_eq!(r.len(), 2);
        assert!(!r.set(key("a", "1"), Some(1)), "same value: no change");
        assert!(r.set(key("a", "1"), Some(10)));
        assert!(r.set(key("a", "1"), None));
        assert!(!r.set(key("a", "1"), None), "already gone");
        // a relist after a watch outage: "a/2" was deleted meanwhile
        r.init();
        r.init_apply(key("a", "3"), Some(3));
        assert!(r.init_done());
        assert_eq!(r.items().keys().collect::<Vec<_>>(), [&key("a", "3")]);
        r.init();
        r.init_apply(key("a", "3"), Some(3));
        assert!(!r.init_done(), "the same listing again changes nothing");
    }
}
