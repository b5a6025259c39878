//! The frame decoder and the gateway: arbitrary bytes arrive on a framed connection of a
//! `Session` (the no_std server of one transport) serving a log on a simulated flash. The
//! first input byte picks the read size, so frames are split at every place.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spillway_firmware::{Gateway, GatewayConfig, Mode, Session};
use spillway_fuzz::{FeedIo, formatted, memory, mount};

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, input)) = data.split_first() else {
        return;
    };
    let mut flash = formatted();
    let (mut buf, mut slots) = memory(2048);
    let Some(mut log) = mount(&mut flash, &mut buf, &mut slots) else {
        return;
    };
    let mut gw = Gateway::new(GatewayConfig::new("fuzz", 256, 1024), 0);
    let io = FeedIo {
        input,
        chunk: usize::from(chunk % 64) + 1,
        written: 0,
    };
    let mut session: Session<'_, _, 1024> = Session::new(io, Mode::Frames);
    let (mut scratch, mut out) = ([0u8; 1024], [0u8; 1024]);
    for step in 0u64.. {
        let now = step * 1_000;
        let Ok(report) = session.poll(&mut gw, &mut log, now, now, &mut scratch, &mut out) else {
            return;
        };
        let _ = log.tick(now);
        if report.bytes_read == 0 || report.storage_failed {
            break;
        }
    }
    let _ = log.close(1 << 40);
    // Whatever the session stored mounts again.
    let (mut buf, mut slots) = memory(2048);
    assert!(
        mount(&mut flash, &mut buf, &mut slots).is_some(),
        "remount after a session"
    );
});
