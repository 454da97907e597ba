//! A spec placed in a host part, and the derivation of host bits.

use std::fmt::Write as _;
use std::hash::Hasher as _;

use crate::{Error, Field, IpAlgo, Result};

/// FNV-1a 64 of a string's bytes (no terminator), the hash of every field.
pub fn fnv1a64(s: &str) -> u64 {
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(s.as_bytes());
    hasher.finish()
}

/// The workload identity a pod's host bits are derived from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Identity<'a> {
    /// The pod's namespace (`ns`).
    pub namespace: &'a str,
    /// The workload name from [`crate::workload_name`] (`app`).
    pub workload: &'a str,
    /// The first container's image reference, if known (`image`).
    pub image: Option<&'a str>,
    /// The pod's name (`pod`).
    pub pod: &'a str,
    /// The sandbox container ID; `image` hashes it when there is no image.
    pub container_id: &'a str,
}

impl Identity<'_> {
    /// The string a hashed field is taken from; `None` for `n` and `rand`.
    fn source(&self, field: Field) -> Option<&str> {
        match field {
            Field::Ns => Some(self.namespace),
            Field::App => Some(self.workload),
            Field::Image => Some(match self.image {
                Some(image) if !image.is_empty() => image,
                _ => self.container_id,
            }),
            Field::Pod => Some(self.pod),
            Field::N | Field::Rand => None,
        }
    }
}

/// One run of bits of a host part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// The field, or `None` for the random bits left over at the low end.
    pub field: Option<Field>,
    /// Shift of the segment's least significant bit from the host part's LSB.
    pub shift: u8,
    /// Width in bits (1..=128; only the leftover run can exceed 64).
    pub bits: u8,
}

impl Segment {
    /// Whether the bits of this segment are random.
    pub fn is_random(&self) -> bool {
        matches!(self.field, None | Some(Field::Rand))
    }
}

/// An [`IpAlgo`] placed in a host part of a given length: fields from the
/// most significant bit down, leftover low bits random.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    spec: String,
    host_bits: u8,
    segments: Vec<Segment>,
    random_bits: u8,
    counter: Option<Segment>,
    fixed_hash: bool,
}

/// The low `bits` bits set.
pub(crate) const fn mask(bits: u32) -> u128 {
    if bits >= 128 {
        u128::MAX
    } else {
        (1u128 << bits) - 1
    }
}

impl Layout {
    pub(crate) fn new(algo: &IpAlgo, host_bits: u8) -> Result<Self> {
        if host_bits > 128 {
            return Err(Error::HostBits { host_bits });
        }
        let needed = algo.bits_needed();
        if needed > u32::from(host_bits) {
            return Err(Error::Overflow {
                spec: algo.to_string(),
                needed,
                host_bits,
                prefix_len: 128 - host_bits,
            });
        }
        let mut segments = Vec::with_capacity(algo.fields().len() + 1);
        let mut top = host_bits; // bits not yet placed, counted from the LSB
        for field in algo.fields() {
            top -= field.bits;
            segments.push(Segment {
                field: Some(field.field),
                shift: top,
                bits: field.bits,
            });
        }
        if top > 0 {
            segments.push(Segment {
                field: None,
                shift: 0,
                bits: top,
            });
        }
        let random_bits = segments
            .iter()
            .filter(|s| s.is_random())
            .map(|s| s.bits)
            .sum();
        Ok(Self {
            spec: algo.to_string(),
            host_bits,
            counter: segments.iter().copied().find(|s| s.field == Some(Field::N)),
            fixed_hash: algo.uses_identity(),
            segments,
            random_bits,
        })
    }

    /// Host bits of the CIDR this layout is for.
    pub fn host_len(&self) -> u8 {
        self.host_bits
    }

    /// The runs of bits, from the most significant down.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// How many host bits are random (`rand` fields plus the leftover).
    pub fn random_bits(&self) -> u8 {
        self.random_bits
    }

    /// Width of the counter `n`, if any.
    pub fn counter_bits(&self) -> Option<u8> {
        self.counter.map(|s| s.bits)
    }

    /// How many counter values exist (`2^width`), if there is a counter.
    pub fn counter_values(&self) -> Option<u128> {
        self.counter.map(|s| mask(u32::from(s.bits)) + 1)
    }

    /// Whether any bit depends on the identity.
    pub fn uses_identity(&self) -> bool {
        self.fixed_hash
    }

    /// The host bits for `identity` with counter `n` (low bits of `n` taken)
    /// and random bits drawn from `rng` (nothing is drawn when the layout has
    /// no random bit).
    pub fn host_bits(
        &self,
        identity: &Identity<'_>,
        n: u64,
        rng: &mut (impl rand_core::Rng + ?Sized),
    ) -> u128 {
        let random = if self.random_bits == 0 {
            0
        } else {
            let high = u128::from(rng.next_u64());
            let low = u128::from(rng.next_u64());
            (high << 64) | low
        };
        self.host_bits_with(identity, n, random)
    }

    /// Like [`Layout::host_bits`] with the random bits given: the random runs
    /// take successive low bits of `random`, in segment order.
    pub fn host_bits_with(&self, identity: &Identity<'_>, n: u64, random: u128) -> u128 {
        let mut out = 0u128;
        let mut random = random;
        for segment in &self.segments {
            let bits = u32::from(segment.bits);
            let value = match segment.field {
                None | Some(Field::Rand) => {
                    let v = random;
                    random = random.checked_shr(bits).unwrap_or(0);
                    v
                }
                Some(Field::N) => u128::from(n),
                Some(field) => u128::from(fnv1a64(identity.source(field).unwrap_or_default())),
            };
            out |= (value & mask(bits)) << segment.shift;
        }
        out
    }

    /// Which address bits hold what, one line per run, bits numbered from
    /// the address's most significant bit (0) to 127.
    pub fn explain(&self) -> String {
        let prefix = 128 - self.host_bits;
        let mut out = format!(
            "ip-algo {:?} in a /{prefix} ({} host bits):\n",
            self.spec, self.host_bits
        );
        let line = |out: &mut String, start: u32, end: u32, bits: u32, name: &str, what: &str| {
            let _ = writeln!(
                out,
                "  bits {:>3}..{:<3} {:>3} bits  {:<6} {what}",
                start, end, bits, name
            );
        };
        if prefix > 0 {
            let p = u32::from(prefix);
            line(&mut out, 0, p - 1, p, "prefix", "the CIDR's network bits");
        }
        for segment in &self.segments {
            let bits = u32::from(segment.bits);
            let end = 127 - u32::from(segment.shift);
            let start = end + 1 - bits;
            let (name, what) = match segment.field {
                None => ("rand", "random (left over)".to_owned()),
                Some(Field::Rand) => ("rand", "random".to_owned()),
                Some(Field::N) => ("n", format!("collision counter, 0..={}", mask(bits))),
                Some(Field::Ns) => (
                    "ns",
                    format!("low {bits} bits of FNV-1a 64 of the namespace"),
                ),
                Some(Field::App) => (
                    "app",
                    format!("low {bits} bits of FNV-1a 64 of the workload name"),
                ),
                Some(Field::Image) => (
                    "image",
                    format!(
                        "low {bits} bits of FNV-1a 64 of the first image (else the container ID)"
                    ),
                ),
                Some(Field::Pod) => (
                    "pod",
                    format!("low {bits} bits of FNV-1a 64 of the pod name"),
                ),
            };
            line(&mut out, start, end, bits, name, &what);
        }
        out
    }
}
