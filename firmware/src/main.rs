//! `spillway`: the Linux gateway binary.
fn main() {
    eprintln!("spillway: not built yet");
    std::process::exit(2);
}
