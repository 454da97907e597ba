//! What the node announces over BGP: the NodeConfig's BGP setup, the node CIDRs (and those of
//! the secondary networks it announces) as aggregates, and individually every pod address outside them (the `addresses` annotation,
//! pods left over from a CIDR change) and every anycast address. Pure.

use flock_bird::BirdModel;

use crate::store::AllocationRecord;
use flock_k8s_api::NodeSettings;

/// The BIRD model of this node, `None` without BGP settings.
pub fn bird_model<'a>(
    settings: &NodeSettings,
    records: impl IntoIterator<Item = &'a AllocationRecord>,
) -> Option<BirdModel> {
    let mut model = settings.bgp.clone()?;
    let cidrs = model.cidrs.clone();
    for record in records {
        // a secondary network the node does not announce (or no longer has): none of it
        if let Some(network) = &record.flock_network
            && !settings.network(network).is_some_and(|n| n.announce)
        {
            continue;
        }
        for addr in record.pooled_addresses() {
            if !cidrs.iter().any(|c| c.contains(&addr)) {
                model.addresses.push(addr);
            }
        }
        model.anycast.extend(record.anycast.iter().copied());
    }
    Some(model)
}
