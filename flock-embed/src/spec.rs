//! The spec: presets, field lists, parsing and canonical text.

use std::fmt;
use std::str::FromStr;

use crate::{Error, Layout, Result};

/// The widest a single field may be: a field takes the low bits of a 64-bit hash.
pub const MAX_FIELD_BITS: u8 = 64;

/// One kind of field of a spec (DESIGN §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Field {
    /// FNV-1a 64 of the pod's namespace.
    Ns,
    /// FNV-1a 64 of the workload name ([`crate::workload_name`]).
    App,
    /// FNV-1a 64 of the first container's image, else of the container ID.
    Image,
    /// FNV-1a 64 of the pod name.
    Pod,
    /// The collision counter: 0 for the first pod, incremented on collision.
    N,
    /// Random bits.
    Rand,
}

impl Field {
    /// The name used in specs.
    pub const fn name(self) -> &'static str {
        match self {
            Field::Ns => "ns",
            Field::App => "app",
            Field::Image => "image",
            Field::Pod => "pod",
            Field::N => "n",
            Field::Rand => "rand",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "ns" => Field::Ns,
            "app" => Field::App,
            "image" => Field::Image,
            "pod" => Field::Pod,
            "n" => Field::N,
            "rand" => Field::Rand,
            _ => return None,
        })
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A field with its width in bits (`ns:16`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FieldWidth {
    /// What the bits come from.
    pub field: Field,
    /// How many bits, 1..=64.
    pub bits: u8,
}

/// The named presets of DESIGN §4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Preset {
    /// All host bits random (the default).
    Random,
    /// `ns:16,app:24,image:8,n:8`, then random.
    Workload,
}

/// A parsed ip-algo spec: a preset or a list of fields, placed from the most
/// significant host bit down; host bits left over at the low end are random.
///
/// ```
/// use flock_embed::IpAlgo;
/// let algo: IpAlgo = "ns:16, app:24,n:8".parse()?;
/// assert_eq!(algo.to_string(), "ns:16,app:24,n:8");
/// assert_eq!(algo.counter_bits(), Some(8));
/// assert_eq!(IpAlgo::workload().to_string(), "workload");
/// # Ok::<(), flock_embed::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IpAlgo {
    preset: Option<Preset>,
    fields: Vec<FieldWidth>,
}

impl Default for IpAlgo {
    fn default() -> Self {
        Self::random()
    }
}

impl IpAlgo {
    /// The `random` preset: every host bit random.
    pub fn random() -> Self {
        Self {
            preset: Some(Preset::Random),
            fields: Vec::new(),
        }
    }

    /// The `workload` preset: `ns:16,app:24,image:8,n:8`, then random.
    pub fn workload() -> Self {
        Self {
            preset: Some(Preset::Workload),
            fields: vec![
                FieldWidth {
                    field: Field::Ns,
                    bits: 16,
                },
                FieldWidth {
                    field: Field::App,
                    bits: 24,
                },
                FieldWidth {
                    field: Field::Image,
                    bits: 8,
                },
                FieldWidth {
                    field: Field::N,
                    bits: 8,
                },
            ],
        }
    }

    /// Parses a spec: `random`, `workload`, or `field:bits` items separated by
    /// commas (whitespace around items is ignored). Host-length checks are
    /// separate: see [`IpAlgo::layout`] / [`IpAlgo::validate_for`].
    pub fn parse(spec: &str) -> Result<Self> {
        let trimmed = spec.trim();
        match trimmed {
            "" => return Err(Error::Empty),
            "random" => return Ok(Self::random()),
            "workload" => return Ok(Self::workload()),
            _ => {}
        }
        let mut fields = Vec::new();
        let mut seen_counter = false;
        for (index, raw) in trimmed.split(',').enumerate() {
            let item = raw.trim();
            if item.is_empty() {
                return Err(Error::EmptyItem {
                    spec: spec.to_owned(),
                    position: index + 1,
                });
            }
            let (name, width) = match item.split_once(':') {
                Some((name, width)) => (name.trim(), Some(width.trim())),
                None => (item, None),
            };
            let field = Field::from_name(name).ok_or_else(|| Error::UnknownField {
                spec: spec.to_owned(),
                field: name.to_owned(),
            })?;
            let width = width.ok_or_else(|| Error::MissingWidth {
                spec: spec.to_owned(),
                item: item.to_owned(),
            })?;
            let bits: u32 = width
                .parse()
                .ok()
                .filter(|_| width.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| Error::BadWidth {
                    spec: spec.to_owned(),
                    field: name.to_owned(),
                    width: width.to_owned(),
                })?;
            if bits == 0 {
                return Err(Error::ZeroWidth {
                    spec: spec.to_owned(),
                    field: name.to_owned(),
                });
            }
            if bits > u32::from(MAX_FIELD_BITS) {
                return Err(Error::WidthTooLarge {
                    spec: spec.to_owned(),
                    field: name.to_owned(),
                    bits,
                });
            }
            if field == Field::N {
                if seen_counter {
                    return Err(Error::CounterTwice {
                        spec: spec.to_owned(),
                    });
                }
                seen_counter = true;
            }
            // `bits` ≤ 64 was checked just above.
            let bits = u8::try_from(bits).unwrap_or(MAX_FIELD_BITS);
            fields.push(FieldWidth { field, bits });
        }
        Ok(Self {
            preset: None,
            fields,
        })
    }

    /// The preset this spec was written as, if any.
    pub fn preset(&self) -> Option<Preset> {
        self.preset
    }

    /// The fields in order, from the most significant host bit down.
    pub fn fields(&self) -> &[FieldWidth] {
        &self.fields
    }

    /// The sum of the field widths: the host bits the spec needs at least.
    pub fn bits_needed(&self) -> u32 {
        self.fields.iter().map(|f| u32::from(f.bits)).sum()
    }

    /// Whether the spec has a counter `n`.
    pub fn has_counter(&self) -> bool {
        self.counter_bits().is_some()
    }

    /// The width of the counter `n`, if the spec has one.
    pub fn counter_bits(&self) -> Option<u8> {
        self.fields
            .iter()
            .find(|f| f.field == Field::N)
            .map(|f| f.bits)
    }

    /// Whether the spec uses the workload identity at all (`random` does not).
    pub fn uses_identity(&self) -> bool {
        self.fields
            .iter()
            .any(|f| matches!(f.field, Field::Ns | Field::App | Field::Image | Field::Pod))
    }

    /// Places the spec in a host part of `host_bits` bits (`128 - prefix`),
    /// failing if the fields do not fit.
    pub fn layout(&self, host_bits: u8) -> Result<Layout> {
        Layout::new(self, host_bits)
    }

    /// Checks the spec against a host length without keeping the layout.
    pub fn validate_for(&self, host_bits: u8) -> Result<()> {
        self.layout(host_bits).map(drop)
    }

    /// Convenience for one derivation: [`IpAlgo::layout`] then
    /// [`Layout::host_bits`]. Callers deriving many addresses should keep the
    /// [`Layout`].
    pub fn host_bits(
        &self,
        host_bits: u8,
        identity: &crate::Identity<'_>,
        n: u64,
        rng: &mut impl rand_core::Rng,
    ) -> Result<u128> {
        Ok(self.layout(host_bits)?.host_bits(identity, n, rng))
    }

    /// A human-readable layout of the spec in a CIDR of `prefix_len` bits
    /// (see [`Layout::explain`]).
    pub fn explain(&self, prefix_len: u8) -> Result<String> {
        let host_bits = 128u8.checked_sub(prefix_len).ok_or(Error::HostBits {
            host_bits: prefix_len,
        })?;
        Ok(self.layout(host_bits)?.explain())
    }
}

impl FromStr for IpAlgo {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

impl fmt::Display for IpAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.preset {
            Some(Preset::Random) => return f.write_str("random"),
            Some(Preset::Workload) => return f.write_str("workload"),
            None => {}
        }
        for (i, field) in self.fields.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}:{}", field.field, field.bits)?;
        }
        Ok(())
    }
}
