//! [`IpPrefix`]: an address with a prefix length, written `addr/len`.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{CniError, ErrorCode};

/// An IP address with a prefix length (`2001:db8::5/128`, `10.0.0.0/8`), as
/// CNI results carry them. The address keeps its host bits (an interface
/// address is `10.1.2.3/24`, not `10.1.2.0/24`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IpPrefix {
    addr: IpAddr,
    len: u8,
}

impl IpPrefix {
    /// `addr/len`; error 6 when `len` exceeds the family's width (32 or 128).
    pub fn new(addr: IpAddr, len: u8) -> Result<IpPrefix, CniError> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if len > max {
            return Err(CniError::new(
                ErrorCode::DecodingFailure,
                format!("invalid prefix length {len} for {addr}: at most {max}"),
            ));
        }
        Ok(IpPrefix { addr, len })
    }

    /// The address (host bits kept).
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.len
    }

    /// Whether this is an IPv4 prefix.
    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }
}

impl fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for IpPrefix {
    type Err = CniError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| {
            CniError::new(
                ErrorCode::DecodingFailure,
                format!("invalid prefix {s:?}: {why}"),
            )
        };
        let (a, l) = s.split_once('/').ok_or_else(|| bad("expected addr/len"))?;
        let addr: IpAddr = a.parse().map_err(|_| bad("bad address"))?;
        if l.is_empty() || l.len() > 3 || !l.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("bad prefix length"));
        }
        let len: u8 = l.parse().map_err(|_| bad("bad prefix length"))?;
        IpPrefix::new(addr, len).map_err(|_| bad("prefix length too long"))
    }
}

impl Serialize for IpPrefix {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for IpPrefix {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        for s in ["2001:db8::5/128", "10.1.2.3/24", "0.0.0.0/0", "::/0"] {
            assert_eq!(s.parse::<IpPrefix>().unwrap().to_string(), s);
        }
        for bad in [
            "10.0.0.1",
            "10.0.0.1/33",
            "::/129",
            "x/1",
            "10.0.0.1/",
            "10.0.0.1/+1",
            "::/0001",
        ] {
            let e = bad.parse::<IpPrefix>().unwrap_err();
            assert_eq!(e.code, ErrorCode::DecodingFailure);
            assert!(e.msg.contains(bad), "{}", e.msg);
        }
    }
}
