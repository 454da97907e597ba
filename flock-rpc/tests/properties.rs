//! Property tests of the shim↔agent RPC: every request and response round-trips through a
//! line of JSON, and the framing does not depend on how the bytes arrive.

use flock_cni_proto::{CniError, ErrorCode};
use flock_rpc::rpc::{Op, Request, Response, decode_request, decode_response, encode_line};
use proptest::prelude::*;
use serde_json::Value;

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9:./_ \"\\\\\u{e9}-]{0,20}"
}

fn opt<T: std::fmt::Debug + Clone>(
    s: impl Strategy<Value = T>,
) -> impl Strategy<Value = Option<T>> {
    proptest::option::of(s)
}

fn cni_error() -> impl Strategy<Value = CniError> {
    (any::<u32>(), text(), text())
        .prop_map(|(c, m, d)| CniError::new(ErrorCode::from(c), m).with_details(d))
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        text().prop_map(Value::from)
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map(text(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        Just(Op::Add),
        Just(Op::Del),
        Just(Op::Check),
        Just(Op::Status),
        Just(Op::Gc)
    ]
}

proptest! {
    #[test]
    fn request_round_trips(
        op in op(), cid in text(), netns in text(), ifn in text(), args in text(), path in text(), config in json_value(),
    ) {
        let req = Request { v: 1, op, container_id: cid, netns, if_name: ifn, args, path, config };
        let line = encode_line(&req);
        prop_assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        prop_assert_eq!(decode_request(&line).unwrap(), req);
    }

    #[test]
    fn response_round_trips(result in opt(json_value()), error in opt(cni_error())) {
        let resp = match (result, error) {
            (_, Some(e)) => Response::error(e),
            (Some(Value::Null), None) | (None, None) => Response::done(),
            (Some(r), None) => Response::ok(r),
        };
        let line = encode_line(&resp);
        prop_assert_eq!(decode_response(&line).unwrap(), resp);
    }
}

proptest! {
    #[test]
    fn framing_is_independent_of_chunking(
        lines in proptest::collection::vec(proptest::collection::vec(any::<u8>().prop_filter("no newline", |b| *b != b'\n'), 1..40), 0..6),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        use flock_rpc::rpc::{FrameError, LineDecoder};
        let mut stream = Vec::new();
        for l in &lines {
            stream.extend_from_slice(l);
            stream.push(b'\n');
        }
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (stream.len() + 1)).collect();
        cuts.push(stream.len());
        cuts.sort_unstable();
        let mut d = LineDecoder::with_limit(32);
        let mut got = Vec::new();
        let mut at = 0;
        let mut error = None;
        'feed: for cut in cuts {
            d.push(&stream[at..cut]);
            at = cut;
            loop {
                match d.next_line() {
                    Ok(Some(l)) => got.push(l),
                    Ok(None) => break,
                    Err(e) => { error = Some(e); break 'feed; }
                }
            }
        }
        match lines.iter().position(|l| l.len() > 32) {
            // Every line before the first oversize one is delivered, then TooLong.
            Some(i) => {
                prop_assert_eq!(error, Some(FrameError::TooLong { limit: 32 }));
                prop_assert_eq!(&got[..], &lines[..i]);
            }
            None => {
                prop_assert_eq!(error, None);
                prop_assert_eq!(got, lines);
                prop_assert_eq!(d.finish(), Ok(()));
            }
        }
    }
}
