//! The packets flock's table logs, read back from the kernel: a rule's `log group` hands the
//! packet to nfnetlink_log, and one netlink socket bound to flock's group reads it — no
//! `ulogd`. Encoding of the bind request and decoding of the packet messages are pure and
//! tested on bytes; [`NflogSocket`] is the socket, opened in the node's namespace.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, SystemTime};

use flock_policy::Transport;
use netlink_sys::{Socket, protocols::NETLINK_NETFILTER};

use super::netlink::{Msg, NLM_F_ACK, NLM_F_REQUEST, messages, read_acks};

/// Bytes of each packet copied to the reader: an IPv6 header, a few extension headers and
/// the transport ports.
pub const COPY_RANGE: u32 = 160;

const NFNL_SUBSYS_ULOG: u16 = 4;
const NFULNL_MSG_PACKET: u16 = NFNL_SUBSYS_ULOG << 8;
const NFULNL_MSG_CONFIG: u16 = (NFNL_SUBSYS_ULOG << 8) | 1;
const NFULA_CFG_CMD: u16 = 1;
const NFULA_CFG_MODE: u16 = 2;
const NFULA_CFG_TIMEOUT: u16 = 4;
const NFULA_CFG_QTHRESH: u16 = 5;
const NFULNL_CFG_CMD_BIND: u8 = 1;
const NFULNL_COPY_PACKET: u8 = 2;
const NFULA_TIMESTAMP: u16 = 3;
const NFULA_PAYLOAD: u16 = 9;
const NFULA_PREFIX: u16 = 10;
const AF_UNSPEC: u8 = 0;

/// One packet as the kernel logged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedPacket {
    /// The rule's `log prefix`.
    pub prefix: String,
    /// When the kernel logged it, if the packet carried a timestamp.
    pub at: Option<SystemTime>,
    /// The packet from its IP header on, up to [`COPY_RANGE`] bytes.
    pub payload: Vec<u8>,
}

/// The request that binds this socket to `group`, copying [`COPY_RANGE`] bytes of each
/// packet, each packet sent as it comes (a queue threshold of 1: the kernel's default batches
/// up to 100 and held a lone packet for its flush timeout, 10 ms here).
pub fn encode_bind(group: u16, seq: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let mut msg = Msg::new(
        NFULNL_MSG_CONFIG,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        AF_UNSPEC,
        group,
    );
    msg.attr(NFULA_CFG_CMD, &[NFULNL_CFG_CMD_BIND]);
    let mut mode = COPY_RANGE.to_be_bytes().to_vec();
    mode.extend_from_slice(&[NFULNL_COPY_PACKET, 0]);
    msg.attr(NFULA_CFG_MODE, &mode);
    msg.attr(NFULA_CFG_TIMEOUT, &1u32.to_be_bytes()); // hundredths of a second
    msg.attr(NFULA_CFG_QTHRESH, &1u32.to_be_bytes());
    msg.finish(&mut out);
    out
}

/// The packets in one read from the socket; messages of other kinds are skipped, and a
/// malformed one ends the read.
pub fn decode(buf: &[u8]) -> Vec<LoggedPacket> {
    messages(buf)
        .map_while(Result::ok)
        // past the netlink header (16 bytes) and nfgenmsg (4)
        .filter(|(kind, m)| *kind == NFULNL_MSG_PACKET && m.len() >= 20)
        .map(|(_, m)| packet(&m[20..]))
        .collect()
}

fn packet(mut attrs: &[u8]) -> LoggedPacket {
    let mut logged = LoggedPacket {
        prefix: String::new(),
        at: None,
        payload: Vec::new(),
    };
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
        if len < 4 || len > attrs.len() {
            break;
        }
        let value = &attrs[4..len];
        match kind {
            NFULA_PREFIX => {
                let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
                logged.prefix = String::from_utf8_lossy(&value[..end]).into_owned();
            }
            NFULA_PAYLOAD => logged.payload = value.to_vec(),
            NFULA_TIMESTAMP if value.len() >= 16 => {
                let sec = u64::from_be_bytes(value[..8].try_into().unwrap_or_default());
                let usec = u64::from_be_bytes(value[8..16].try_into().unwrap_or_default());
                logged.at =
                    Some(SystemTime::UNIX_EPOCH + Duration::from_micros(sec * 1_000_000 + usec));
            }
            _ => {}
        }
        attrs = &attrs[len.next_multiple_of(4).min(attrs.len())..];
    }
    logged
}

/// Source, destination and transport of a packet from its IP header on; `None` when it is
/// too short to tell.
pub fn flow(payload: &[u8]) -> Option<(IpAddr, IpAddr, Transport)> {
    let version = payload.first()? >> 4;
    let (src, dst, mut proto, mut rest) = match version {
        4 => {
            let ihl = usize::from(payload.first()? & 0x0f) * 4;
            let src: [u8; 4] = payload.get(12..16)?.try_into().ok()?;
            let dst: [u8; 4] = payload.get(16..20)?.try_into().ok()?;
            (
                IpAddr::V4(Ipv4Addr::from(src)),
                IpAddr::V4(Ipv4Addr::from(dst)),
                *payload.get(9)?,
                payload.get(ihl..)?,
            )
        }
        6 => {
            let src: [u8; 16] = payload.get(8..24)?.try_into().ok()?;
            let dst: [u8; 16] = payload.get(24..40)?.try_into().ok()?;
            (
                IpAddr::V6(Ipv6Addr::from(src)),
                IpAddr::V6(Ipv6Addr::from(dst)),
                *payload.get(6)?,
                payload.get(40..)?,
            )
        }
        _ => return None,
    };
    // IPv6 extension headers: hop-by-hop, routing, destination options; a fragment header
    // is 8 bytes (only the first fragment has ports, and conntrack reassembles before us)
    while version == 6 && matches!(proto, 0 | 43 | 44 | 60) {
        let len = if proto == 44 {
            8
        } else {
            (usize::from(*rest.get(1)?) + 1) * 8
        };
        proto = *rest.first()?;
        rest = rest.get(len..)?;
    }
    let port = || rest.get(2..4).map(|p| u16::from_be_bytes([p[0], p[1]]));
    let transport = match proto {
        6 => Transport::Tcp(port()?),
        17 => Transport::Udp(port()?),
        132 => Transport::Sctp(port()?),
        1 => Transport::Icmp {
            kind: *rest.first()?,
            code: *rest.get(1)?,
        },
        58 => Transport::Icmpv6 {
            kind: *rest.first()?,
            code: *rest.get(1)?,
        },
        other => Transport::Other(other),
    };
    Some((src, dst, transport))
}

/// A netlink socket bound to flock's nfnetlink_log group in one namespace.
#[derive(Debug)]
pub struct NflogSocket {
    socket: Socket,
    buf: Vec<u8>,
}

impl NflogSocket {
    /// Opens the socket in the calling thread's namespace and binds it to `group`. Fails
    /// with the kernel's error when another socket holds the group (`EBUSY`).
    pub fn open(group: u16) -> io::Result<NflogSocket> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        socket.send(&encode_bind(group, 1), 0)?;
        read_acks(&mut socket, 1)?;
        Ok(NflogSocket {
            socket,
            buf: Vec::with_capacity(256 * 1024),
        })
    }

    /// Waits for the next packets. `ENOBUFS` means the kernel dropped some because this
    /// reader fell behind; the socket stays usable.
    pub fn recv(&mut self) -> io::Result<Vec<LoggedPacket>> {
        self.buf.clear();
        let n = self.socket.recv(&mut self.buf, 0)?;
        Ok(decode(&self.buf[..n.min(self.buf.len())]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::netlink::tests::hex;

    #[test]
    fn the_bind_request_is_laid_out_as_nfnetlink_log_reads_it() {
        let b = encode_bind(flock_policy::LOG_GROUP, 7);
        // header: length 56, type 0x0401, flags request|ack, seq 7, port 0
        assert_eq!(hex(&b[..16]), "38000000010405000700000000000000");
        // nfgenmsg: AF_UNSPEC, version 0, group 3650 big-endian
        assert_eq!(hex(&b[16..20]), "00000e42");
        // cmd bind; mode: range 160, copy packet; timeout 1; queue threshold 1
        assert_eq!(hex(&b[20..28]), "0500010001000000");
        assert_eq!(hex(&b[28..40]), "0a000200000000a002000000");
        assert_eq!(hex(&b[40..48]), "0800040000000001");
        assert_eq!(hex(&b[48..56]), "0800050000000001");
        assert_eq!(b.len(), 56);
    }

    fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut a = ((4 + value.len()) as u16).to_ne_bytes().to_vec();
        a.extend_from_slice(&kind.to_ne_bytes());
        a.extend_from_slice(value);
        while !a.len().is_multiple_of(4) {
            a.push(0);
        }
        a
    }

    fn message(kind: u16, attrs: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = attrs.concat();
        let mut m = ((20 + body.len()) as u32).to_ne_bytes().to_vec();
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(&[10, 0, 0x0e, 0x42]);
        m.extend_from_slice(&body);
        m
    }

    fn tcp6(src: &str, dst: &str, dport: u16) -> Vec<u8> {
        let mut p = vec![0x60, 0, 0, 0, 0, 20, 6, 64];
        p.extend_from_slice(&src.parse::<Ipv6Addr>().unwrap().octets());
        p.extend_from_slice(&dst.parse::<Ipv6Addr>().unwrap().octets());
        p.extend_from_slice(&40000u16.to_be_bytes());
        p.extend_from_slice(&dport.to_be_bytes());
        p.extend_from_slice(&[0; 16]);
        p
    }

    #[test]
    fn packets_are_decoded_and_other_messages_skipped() {
        let payload = tcp6("2001:db8::1", "2001:db8::2", 80);
        let mut ts = 1_800_000_000u64.to_be_bytes().to_vec();
        ts.extend_from_slice(&250_000u64.to_be_bytes());
        let mut buf = message(NFULNL_MSG_CONFIG, &[]);
        buf.extend(message(
            NFULNL_MSG_PACKET,
            &[
                attr(NFULA_PREFIX, b"flock drop ingress\0"),
                attr(NFULA_TIMESTAMP, &ts),
                attr(NFULA_PAYLOAD, &payload),
            ],
        ));
        let got = decode(&buf);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].prefix, "flock drop ingress");
        assert_eq!(got[0].payload, payload);
        assert_eq!(
            got[0].at,
            Some(SystemTime::UNIX_EPOCH + Duration::from_millis(1_800_000_000_250))
        );
        assert_eq!(
            flow(&got[0].payload),
            Some((
                "2001:db8::1".parse().unwrap(),
                "2001:db8::2".parse().unwrap(),
                Transport::Tcp(80)
            ))
        );
    }

    #[test]
    fn flows_of_both_families_past_extension_headers() {
        let mut v4 = vec![
            0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        v4.extend_from_slice(&[0x9c, 0x40, 0, 53, 0, 8, 0, 0]);
        assert_eq!(
            flow(&v4),
            Some((
                "10.0.0.1".parse().unwrap(),
                "10.0.0.2".parse().unwrap(),
                Transport::Udp(53)
            ))
        );
        // hop-by-hop (8 bytes) before an ICMPv6 echo request
        let mut v6 = tcp6("2001:db8::1", "2001:db8::2", 0)[..40].to_vec();
        v6[6] = 0;
        v6.extend_from_slice(&[58, 0, 0, 0, 0, 0, 0, 0, 128, 0, 0, 0]);
        assert_eq!(
            flow(&v6).map(|f| f.2),
            Some(Transport::Icmpv6 { kind: 128, code: 0 })
        );
        assert_eq!(flow(&v6[..30]), None, "a truncated header tells nothing");
        assert_eq!(flow(&[0x20]), None);
    }
}
