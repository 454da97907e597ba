//! Prints the BIRD 2 configuration of a dual-stack node with one IPv6
//! neighbor, a pod address outside the node CIDRs and an anycast address.
//!
//! `cargo run -p flock-bird --example render > bird.conf && bird -p -c bird.conf`

use flock_bird::{BirdModel, Community, NeighborSpec, render};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = BirdModel {
        router_id: "10.0.0.1".into(),
        asn: 64512,
        neighbors: vec![NeighborSpec {
            address: "2001:db8::fe".into(),
            asn: 65000,
            bfd: true,
            ..Default::default()
        }],
        graceful_restart: Some(120),
        cidrs: vec!["2001:db8:0:1::/64".parse()?, "10.244.1.0/24".parse()?],
        addresses: vec!["2001:db8:beef::10".parse()?],
        anycast: vec!["2001:db8:face::53".parse()?],
        communities: vec![Community::Standard(64512, 100)],
        ..Default::default()
    };
    print!("{}", render(&model.validate()?));
    Ok(())
}
