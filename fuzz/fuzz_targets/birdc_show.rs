//! What `birdc` prints (BIRD's control socket is trusted, but a BIRD of another version or a
//! truncated answer must not crash the agent or `kubectl flock`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = flock_bird::parse_show_protocols(text);
    let _ = flock_bird::parse_show_protocols_all(text);
    let _ = flock_bird::parse_show_route(text);
    let _ = flock_bird::parse_show_bfd_sessions(text);
});
