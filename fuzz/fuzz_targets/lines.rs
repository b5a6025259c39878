//! The line splitter: arbitrary bytes arrive on a line-mode connection of a `Session`
//! (split at `\n`, lines past 128 bytes dropped, each line parsed into topic and payload and
//! stored). The first input byte picks the read size and whether the listener has a fixed
//! topic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spillway_firmware::{Gateway, GatewayConfig, Mode, Session};
use spillway_fuzz::{FeedIo, formatted, memory, mount};

fuzz_target!(|data: &[u8]| {
    let Some((&first, input)) = data.split_first() else {
        return;
    };
    let mut flash = formatted();
    let (mut buf, mut slots) = memory(1024);
    let Some(mut log) = mount(&mut flash, &mut buf, &mut slots) else {
        return;
    };
    let mut gw = Gateway::new(GatewayConfig::new("fuzz", 128, 1024), 0);
    let io = FeedIo {
        input,
        chunk: usize::from(first & 0x3F) + 1,
        written: 0,
    };
    let topic = (first & 0x40 != 0).then_some("fixed/topic");
    let mut session: Session<'_, _, 128> = Session::new(io, Mode::Lines { topic });
    let (mut scratch, mut out) = ([0u8; 1024], [0u8; 1024]);
    let before = log.next_offset();
    let mut handled = 0u64;
    for step in 0u64.. {
        let now = step * 1_000;
        let Ok(report) = session.poll(&mut gw, &mut log, now, now, &mut scratch, &mut out) else {
            return;
        };
        handled += u64::from(report.handled);
        if report.bytes_read == 0 || report.storage_failed {
            break;
        }
    }
    // No line is stored twice: at most one record per complete line.
    assert!(log.next_offset() - before <= handled);
    assert_eq!(session.transport().written, 0, "line mode answers nothing");
});
