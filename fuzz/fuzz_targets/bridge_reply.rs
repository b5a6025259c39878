//! The bridge's reply decoder: one frame from a gateway, decoded and checked the way the
//! bridge's client does before it computes with its offsets.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut frame = data.to_vec();
    let _ = spillway_bridge::client::decode_reply(&mut frame);
});
