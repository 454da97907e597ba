//! The agent's socket: bytes as a shim (or anything that can connect) writes them, framed into
//! lines in chunks of a size the input picks, each line decoded as a request and as a
//! response. A request that decodes encodes back to one that decodes the same.
#![no_main]

use flock_rpc::rpc::{LineDecoder, decode_request, decode_response};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, bytes)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    // a small limit, so that the too-long path is reached too
    let mut decoder = LineDecoder::with_limit(4096);
    for piece in bytes.chunks(chunk) {
        decoder.push(piece);
        loop {
            match decoder.next_line() {
                Ok(Some(line)) => {
                    assert!(line.len() <= 4096 && !line.contains(&b'\n'));
                    if let Ok(request) = decode_request(&line) {
                        let again = serde_json::to_vec(&request).expect("a request encodes");
                        let back = decode_request(&again).expect("an encoded request decodes");
                        assert_eq!(back, request);
                    }
                    let _ = decode_response(&line);
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
    let _ = decoder.finish();
});
