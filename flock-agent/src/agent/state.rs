//! The node's allocation state: the pools and the records that hold their addresses, one type
//! under one lock, so an address is never in the pools without its record or the reverse.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use flock_netns::AnycastMember;
use rand_core::Rng;

use crate::store::{AllocationRecord, AttachmentKey};

/// Pools, committed records, and the host veths of ADDs in progress.
#[derive(Debug)]
pub struct NodeState {
    /// The cluster network's pools.
    pools: flock_ipam::Pools,
    /// Each secondary network's pools, by name: made on first use (a record adopted at
    /// start-up, before the NodeConfig is known, holds its addresses here too), kept while
    /// they hold an address after the network left the NodeConfig.
    secondary: BTreeMap<String, flock_ipam::Pools>,
    records: BTreeMap<AttachmentKey, AllocationRecord>,
    /// Host veths of ADDs whose record is pending: not orphans, not free names.
    in_flight: BTreeSet<String>,
}

impl NodeState {
    /// Empty state over the node's CIDRs.
    pub fn new(pools: flock_ipam::Pools) -> NodeState {
        NodeState {
            pools,
            secondary: BTreeMap::new(),
            records: BTreeMap::new(),
            in_flight: BTreeSet::new(),
        }
    }

    /// The cluster network's pools (read-only: every change goes through a method that keeps
    /// records in step).
    pub fn pools(&self) -> &flock_ipam::Pools {
        &self.pools
    }

    /// A secondary network's pools, if it has any.
    pub fn network_pools(&self, network: &str) -> Option<&flock_ipam::Pools> {
        self.secondary.get(network)
    }

    /// The pools a network's addresses come from: the cluster network's (`None`) or a
    /// secondary one's, made empty if it has none yet.
    fn pools_of(&mut self, network: Option<&str>) -> &mut flock_ipam::Pools {
        match network {
            None => &mut self.pools,
            Some(name) => self.secondary.entry(name.to_owned()).or_insert_with(|| {
                flock_ipam::Pools::new(None, None).expect("pools without CIDRs")
            }),
        }
    }

    /// Sets the secondary networks' CIDRs; live allocations stay reserved, also in a network
    /// the NodeConfig no longer has (whose pools then hand out nothing).
    pub fn set_networks(
        &mut self,
        networks: &[flock_k8s_api::SecondaryNetwork],
    ) -> Result<(), flock_ipam::Error> {
        for n in networks {
            self.pools_of(Some(&n.name))
                .set_node_cidrs(n.cidr6, n.cidr4)?;
        }
        let gone: Vec<String> = self
            .secondary
            .keys()
            .filter(|k| !networks.iter().any(|n| &n.name == *k))
            .cloned()
            .collect();
        for name in gone {
            let pools = self.secondary.get_mut(&name).expect("listed above");
            if pools.snapshot().is_empty() {
                self.secondary.remove(&name);
            } else {
                pools.set_node_cidrs(None, None)?;
            }
        }
        Ok(())
    }

    /// Changes the node CIDRs; live allocations stay reserved.
    pub fn set_node_cidrs(
        &mut self,
        cidr6: Option<ipnet::Ipv6Net>,
        cidr4: Option<ipnet::Ipv4Net>,
    ) -> Result<(), flock_ipam::Error> {
        self.pools.set_node_cidrs(cidr6, cidr4)
    }

    /// The committed record of an attachment.
    pub fn record(&self, key: &AttachmentKey) -> Option<&AllocationRecord> {
        self.records.get(key)
    }

    /// Every committed record, in key order.
    pub fn records(&self) -> impl Iterator<Item = &AllocationRecord> {
        self.records.values()
    }

    /// Allocates the addresses of a new attachment on `network` (`None`: the cluster
    /// network).
    pub fn allocate(
        &mut self,
        network: Option<&str>,
        request: &flock_ipam::PodRequest,
        identity: &flock_embed::Identity<'_>,
        rng: &mut impl Rng,
    ) -> Result<flock_ipam::Allocation, flock_ipam::Error> {
        self.pools_of(network).allocate(request, identity, rng)
    }

    /// Takes a record found committed at start-up: its addresses are reserved. An address
    /// another record already holds (a store edited by hand) is returned, not reserved twice.
    pub fn adopt(&mut self, record: AllocationRecord) -> Vec<(IpAddr, flock_ipam::Error)> {
        let mut refused = Vec::new();
        let pools = self.pools_of(record.flock_network.as_deref());
        for addr in record.pooled_addresses() {
            if let Err(e) = pools.reserve(addr) {
                refused.push((addr, e));
            }
        }
        self.host_if_done(&record.host_if);
        self.records.insert(record.key(), record);
        refused
    }

    /// Records a committed ADD (its addresses were allocated by [`NodeState::allocate`]).
    pub fn commit(&mut self, record: AllocationRecord) {
        self.host_if_done(&record.host_if);
        self.records.insert(record.key(), record);
    }

    /// Releases an attachment's addresses and forgets its record; returns the record.
    pub fn remove(&mut self, key: &AttachmentKey) -> Option<AllocationRecord> {
        let record = self.records.remove(key)?;
        self.release_addresses(&record);
        Some(record)
    }

    /// Releases the addresses of a record that was never committed (a failed ADD).
    pub fn release_addresses(&mut self, record: &AllocationRecord) {
        let pools = self.pools_of(record.flock_network.as_deref());
        for addr in record.pooled_addresses() {
            pools.release(addr);
        }
    }

    /// Claims a host veth name for an ADD in progress; `false` when another attachment (committed
    /// or in progress) owns it.
    pub fn claim_host_if(&mut self, name: &str) -> bool {
        if self.owns_host_if(name) {
            return false;
        }
        self.in_flight.insert(name.to_owned())
    }

    /// The ADD that claimed `name` is over (committed or undone).
    pub fn host_if_done(&mut self, name: &str) {
        self.in_flight.remove(name);
    }

    /// Whether a committed record or an ADD in progress owns this host veth.
    pub fn owns_host_if(&self, name: &str) -> bool {
        self.in_flight.contains(name) || self.records.values().any(|r| r.host_if == name)
    }

    /// Every host veth that is owned (committed records and ADDs in progress).
    pub fn owned_host_ifs(&self) -> BTreeSet<String> {
        let mut owned: BTreeSet<String> =
            self.records.values().map(|r| r.host_if.clone()).collect();
        owned.extend(self.in_flight.iter().cloned());
        owned
    }

    /// Every anycast address with the local pods that carry it.
    pub fn anycast_members(&self) -> BTreeMap<IpAddr, Vec<AnycastMember>> {
        let mut members: BTreeMap<IpAddr, Vec<AnycastMember>> = BTreeMap::new();
        for r in self.records.values() {
            for a in &r.anycast {
                members.entry(*a).or_default().push(AnycastMember {
                    host_if: r.host_if.clone(),
                    pod_ip6: r.ipv6,
                });
            }
        }
        members
    }
}
