//! `cniVersion`: parsing, ordering, the supported set and the VERSION reply.
//!
//! A leaf of the crate: it depends on no other module ([`crate::error`] turns a
//! [`VersionParseError`] into CNI error 1).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A CNI specification version (`major.minor.patch`), ordered numerically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CniVersion {
    /// Major number.
    pub major: u16,
    /// Minor number.
    pub minor: u16,
    /// Patch number.
    pub patch: u16,
}

impl CniVersion {
    /// CNI 0.4.0 (introduced CHECK).
    pub const V0_4_0: CniVersion = CniVersion::new(0, 4, 0);
    /// CNI 1.0.0 (dropped `version` on ips).
    pub const V1_0_0: CniVersion = CniVersion::new(1, 0, 0);
    /// CNI 1.1.0 (STATUS, GC, interface `mtu`/`socketPath`/`pciID`, route attributes).
    pub const V1_1_0: CniVersion = CniVersion::new(1, 1, 0);
    /// The versions this crate speaks, oldest first.
    pub const SUPPORTED: [CniVersion; 3] = [Self::V0_4_0, Self::V1_0_0, Self::V1_1_0];
    /// The newest supported version.
    pub const LATEST: CniVersion = Self::V1_1_0;

    /// Builds a version from its three numbers.
    pub const fn new(major: u16, minor: u16, patch: u16) -> CniVersion {
        CniVersion {
            major,
            minor,
            patch,
        }
    }

    /// Whether this crate can speak this version.
    pub fn is_supported(self) -> bool {
        Self::SUPPORTED.contains(&self)
    }

    /// Whether CHECK exists in this version (0.4.0 and later).
    pub fn has_check(self) -> bool {
        self >= Self::V0_4_0
    }

    /// Whether STATUS and GC exist in this version (1.1.0 and later).
    pub fn has_status_and_gc(self) -> bool {
        self >= Self::V1_1_0
    }
}

impl fmt::Display for CniVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// A `cniVersion` that is not `major.minor.patch` (as a CNI error: code 1,
/// incompatible version, see [`crate::error`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cniVersion {value:?}: expected major.minor.patch")]
pub struct VersionParseError {
    /// The string that failed to parse.
    pub value: String,
}

impl FromStr for CniVersion {
    type Err = VersionParseError;

    /// Parses `major.minor.patch` (each a decimal number that fits in 16 bits).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || VersionParseError {
            value: s.to_owned(),
        };
        let mut parts = s.split('.');
        let mut next = || -> Result<u16, VersionParseError> {
            let p = parts.next().ok_or_else(bad)?;
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            p.parse().map_err(|_| bad())
        };
        let v = CniVersion::new(next()?, next()?, next()?);
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(v)
    }
}

impl Serialize for CniVersion {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for CniVersion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The reply to `CNI_COMMAND=VERSION`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionInfo {
    /// The version this reply is written in.
    #[serde(rename = "cniVersion")]
    pub cni_version: CniVersion,
    /// Every version the plugin supports.
    #[serde(rename = "supportedVersions")]
    pub supported_versions: Vec<CniVersion>,
}

impl VersionInfo {
    /// The reply for a plugin supporting `supported` (must not be empty; the
    /// reply is written in the newest of them).
    pub fn new(supported: &[CniVersion]) -> VersionInfo {
        let cni_version = supported
            .iter()
            .copied()
            .max()
            .unwrap_or(CniVersion::LATEST);
        VersionInfo {
            cni_version,
            supported_versions: supported.to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_orders_and_rejects() {
        let v: CniVersion = "1.1.0".parse().unwrap();
        assert_eq!(v, CniVersion::V1_1_0);
        assert!(CniVersion::V0_4_0 < CniVersion::V1_0_0);
        assert!("0.10.0".parse::<CniVersion>().unwrap() > "0.4.0".parse().unwrap());
        assert!(!"0.3.1".parse::<CniVersion>().unwrap().has_check());
        for bad in [
            "", "1", "1.0", "1.0.0.0", "a.b.c", "1..0", "-1.0.0", "1.0.0 ",
        ] {
            let e = bad.parse::<CniVersion>().unwrap_err();
            assert_eq!(e.value, bad);
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn version_reply() {
        let v = serde_json::to_value(VersionInfo::new(&CniVersion::SUPPORTED)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"cniVersion":"1.1.0","supportedVersions":["0.4.0","1.0.0","1.1.0"]})
        );
    }
}
