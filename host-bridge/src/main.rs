//! `spillway-bridge`: drains a Spillway gateway upstream.
fn main() {
    eprintln!("spillway-bridge: not built yet");
    std::process::exit(2);
}
