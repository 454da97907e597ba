//! Set and verdict-map elements of flock's table sent straight to nf_tables over netlink:
//! one batch (one transaction, all or nothing), no `nft` process. Exec'ing `nft -f` costs
//! about 2 ms per transaction on its own (process start, libnftables, its cache), twice the
//! ADD budget; a batch of a few elements costs tens of microseconds. Chains and whole tables
//! still go through `nft -f`, whose parser this module does not try to be.
//!
//! Encoding only ([`encode_batch`], pure, tested byte for byte) and one socket
//! ([`ElementSocket`]) opened in the node's namespace and kept: a netlink socket stays in the
//! namespace it was created in, whichever thread uses it later.

use std::io;
use std::net::IpAddr;

use flock_policy::{Element, ElementOp, Member, TABLE};
use netlink_sys::{Socket, protocols::NETLINK_NETFILTER};

pub(super) const NLMSG_ERROR: u16 = 2;
pub(super) const NLM_F_REQUEST: u16 = 0x1;
pub(super) const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NLA_F_NESTED: u16 = 0x8000;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFPROTO_INET: u8 = 1;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
/// `NFT_JUMP` (-3) as the kernel reads it: a big-endian u32.
const NFT_JUMP: u32 = 0xffff_fffd;
const IFNAMSIZ: usize = 16;

/// Most elements one batch carries; larger updates go through `nft -f`.
pub const MAX_BATCH_ELEMENTS: usize = 256;

/// A netlink message being written: attributes appended, nests closed by offset.
pub(super) struct Msg {
    buf: Vec<u8>,
}

impl Msg {
    pub(super) fn new(kind: u16, flags: u16, seq: u32, family: u8, res_id: u16) -> Msg {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, set in finish
        buf.extend_from_slice(&kind.to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
        buf.extend_from_slice(&[family, 0]); // nfgenmsg: family, NFNETLINK_V0
        buf.extend_from_slice(&res_id.to_be_bytes());
        Msg { buf }
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    pub(super) fn attr(&mut self, kind: u16, data: &[u8]) {
        let len = u16::try_from(4 + data.len()).unwrap_or(u16::MAX);
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn string(&mut self, kind: u16, s: &str) {
        let mut data = s.as_bytes().to_vec();
        data.push(0);
        self.attr(kind, &data);
    }

    fn nest(&mut self, kind: u16) -> usize {
        let at = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        at
    }

    fn end(&mut self, at: usize) {
        let len = u16::try_from(self.buf.len() - at).unwrap_or(u16::MAX);
        self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    pub(super) fn finish(mut self, out: &mut Vec<u8>) {
        self.pad();
        let len = u32::try_from(self.buf.len()).unwrap_or(u32::MAX);
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        out.extend_from_slice(&self.buf);
    }
}

/// The key bytes of an element as the set's type lays them out: addresses in network order,
/// each part of a concatenation padded to 4 bytes, interface names to `IFNAMSIZ`.
fn key(element: &Element) -> Vec<u8> {
    let addr = |a: &IpAddr| match a {
        IpAddr::V6(a) => a.octets().to_vec(),
        IpAddr::V4(a) => a.octets().to_vec(),
    };
    match element {
        Element::Member(Member::Addr(a)) => addr(a),
        Element::Member(Member::AddrPort(a, p)) => {
            let mut k = addr(a);
            k.extend_from_slice(&p.to_be_bytes());
            k.extend_from_slice(&[0, 0]);
            k
        }
        Element::Jump { host_if, .. } => {
            let mut k = host_if.as_bytes().to_vec();
            k.resize(IFNAMSIZ, 0);
            k
        }
    }
}

/// The batch that applies `ops` in order as one transaction: one message per run of
/// operations of the same verb and set, each asking for an acknowledgement. Returns the
/// bytes and how many acknowledgements to expect.
pub fn encode_batch(ops: &[ElementOp], first_seq: u32) -> (Vec<u8>, usize) {
    let mut out = Vec::new();
    let mut seq = first_seq;
    let res_id = NFNL_SUBSYS_NFTABLES;
    Msg::new(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq, 0, res_id).finish(&mut out);
    let mut messages = 0;
    let mut i = 0;
    while i < ops.len() {
        let first = &ops[i];
        let (kind, flags) = if first.add {
            (NFT_MSG_NEWSETELEM, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE)
        } else {
            (NFT_MSG_DELSETELEM, NLM_F_REQUEST | NLM_F_ACK)
        };
        seq += 1;
        let mut msg = Msg::new(
            (NFNL_SUBSYS_NFTABLES << 8) | kind,
            flags,
            seq,
            NFPROTO_INET,
            0,
        );
        msg.string(NFTA_SET_ELEM_LIST_TABLE, TABLE);
        msg.string(NFTA_SET_ELEM_LIST_SET, &first.set);
        let list = msg.nest(NFTA_SET_ELEM_LIST_ELEMENTS);
        while i < ops.len() && ops[i].add == first.add && ops[i].set == first.set {
            let element = msg.nest(NFTA_LIST_ELEM);
            let k = msg.nest(NFTA_SET_ELEM_KEY);
            msg.attr(NFTA_DATA_VALUE, &key(&ops[i].element));
            msg.end(k);
            if let (true, Element::Jump { chain, .. }) = (first.add, &ops[i].element) {
                let data = msg.nest(NFTA_SET_ELEM_DATA);
                let verdict = msg.nest(NFTA_DATA_VERDICT);
                msg.attr(NFTA_VERDICT_CODE, &NFT_JUMP.to_be_bytes());
                msg.string(NFTA_VERDICT_CHAIN, chain);
                msg.end(verdict);
                msg.end(data);
            }
            msg.end(element);
            i += 1;
        }
        msg.end(list);
        msg.finish(&mut out);
        messages += 1;
    }
    seq += 1;
    Msg::new(NFNL_MSG_BATCH_END, NLM_F_REQUEST, seq, 0, res_id).finish(&mut out);
    (out, messages)
}

/// A netlink socket of nf_tables in one namespace.
#[derive(Debug)]
pub struct ElementSocket {
    socket: Socket,
    seq: u32,
}

impl ElementSocket {
    /// Opens the socket in the calling thread's namespace (the caller enters the node's).
    pub fn open() -> io::Result<ElementSocket> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        Ok(ElementSocket { socket, seq: 1 })
    }

    /// Applies `ops` as one transaction; the error is the kernel's for the first message it
    /// refused (nothing of the batch is applied then).
    pub fn apply(&mut self, ops: &[ElementOp]) -> io::Result<()> {
        let (batch, expected) = encode_batch(ops, self.seq);
        self.seq = self
            .seq
            .wrapping_add(u32::try_from(expected).unwrap_or(0) + 2);
        self.socket.send(&batch, 0)?;
        read_acks(&mut self.socket, expected)
    }
}

/// The netlink messages of one read, each as its type and its whole bytes (header
/// included); an `Err` ends the walk where a message's length does not fit.
pub(super) fn messages(buf: &[u8]) -> impl Iterator<Item = io::Result<(u16, &[u8])>> {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at + 16 > buf.len() {
            return None;
        }
        let len = u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap_or_default());
        let kind = u16::from_ne_bytes(buf[at + 4..at + 6].try_into().unwrap_or_default());
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len < 16 || at + len > buf.len() {
            at = buf.len();
            return Some(Err(io::Error::other(
                "malformed netlink message from netfilter",
            )));
        }
        let message = &buf[at..at + len];
        at += len.next_multiple_of(4);
        Some(Ok((kind, message)))
    })
}

/// Reads `expected` acknowledgements from `socket`; the error is the kernel's for the first
/// message it refused.
pub(super) fn read_acks(socket: &mut Socket, expected: usize) -> io::Result<()> {
    let mut answered = 0;
    let mut refused: Option<io::Error> = None;
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    while answered < expected {
        buf.clear();
        let n = socket.recv(&mut buf, 0)?;
        for message in messages(&buf[..n.min(buf.len())]) {
            let (kind, message) = message?;
            if kind == NLMSG_ERROR && message.len() >= 20 {
                answered += 1;
                let code = i32::from_ne_bytes(message[16..20].try_into().unwrap_or_default());
                if code < 0 && refused.is_none() {
                    refused = Some(io::Error::from_raw_os_error(-code));
                }
            }
        }
    }
    match refused {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::policy) fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn a_batch_is_begin_one_message_per_set_and_verb_and_end() {
        let ops = [
            ElementOp {
                add: false,
                set: "ingress_pods".into(),
                element: Element::Jump {
                    host_if: "flock0000000a".into(),
                    chain: String::new(),
                },
            },
            ElementOp {
                add: true,
                set: "ingress_pods".into(),
                element: Element::Jump {
                    host_if: "flock0000000b".into(),
                    chain: "ingress_0123456789abcdef".into(),
                },
            },
            ElementOp {
                add: true,
                set: "port0_v6".into(),
                element: Element::Member(Member::AddrPort("2001:db8::1".parse().unwrap(), 80)),
            },
            ElementOp {
                add: true,
                set: "port0_v6".into(),
                element: Element::Member(Member::AddrPort("2001:db8::2".parse().unwrap(), 443)),
            },
        ];
        let (bytes, messages) = encode_batch(&ops, 7);
        assert_eq!(messages, 3, "delete, add to the map, add to the set");
        let mut at = 0;
        let mut seen = Vec::new();
        while at < bytes.len() {
            let len = u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            assert_eq!(len % 4, 0);
            let kind = u16::from_ne_bytes(bytes[at + 4..at + 6].try_into().unwrap());
            let seq = u32::from_ne_bytes(bytes[at + 8..at + 12].try_into().unwrap());
            seen.push((kind, seq, hex(&bytes[at..at + len])));
            at += len;
        }
        let kinds: Vec<(u16, u32)> = seen.iter().map(|(k, s, _)| (*k, *s)).collect();
        assert_eq!(
            kinds,
            [
                (0x10, 7),
                (0x0a0e, 8),
                (0x0a0c, 9),
                (0x0a0c, 10),
                (0x11, 11)
            ]
        );
        let add_jump = &seen[2].2;
        // key: "flock0000000b" padded to 16 bytes; verdict: jump (-3) to the chain
        assert!(
            add_jump.contains(&hex(b"flock0000000b\0\0\0")),
            "{add_jump}"
        );
        assert!(add_jump.contains("fffffffd"), "{add_jump}");
        assert!(add_jump.contains(&hex(b"ingress_0123456789abcdef\0")));
        let delete = &seen[1].2;
        assert!(!delete.contains("fffffffd"), "a delete names the key only");
        // address . port: 16 bytes, then the port in network order padded to 4
        assert!(
            seen[3]
                .2
                .contains("20010db800000000000000000000000100500000")
        );
        assert!(
            seen[3]
                .2
                .contains("20010db800000000000000000000000201bb0000")
        );
    }
}
