//! Unit tests of the simulated flash: the contract it enforces, exact counters, power cuts
//! and the faults it injects.

use super::cells::program;
use super::*;
use crate::storage::Flash;

const fn geometry(write_size: u32, erased: u8) -> Geometry {
    Geometry {
        erase_size: 256,
        write_size,
        capacity: 1024,
        erased,
    }
}

const G: Geometry = geometry(4, 0xFF);
const LEN: usize = SimFlash::memory_len(G);

fn sim(mem: &mut [u8], g: Geometry) -> SimFlash<&mut [u8]> {
    SimFlash::new(mem, g).unwrap()
}

/// A flash of geometry [`G`] in an owned array, erased.
fn fresh() -> SimFlash<[u8; LEN]> {
    SimFlash::new([0u8; LEN], G).unwrap()
}

#[test]
fn memory_layout_and_construction_checks() {
    // 1024 content + 256 words / 8 + 4 blocks * 4.
    assert_eq!(LEN, 1024 + 32 + 16);
    let mut small = [0u8; LEN - 1];
    assert_eq!(
        SimFlash::new(&mut small[..], G).unwrap_err(),
        SimError::MemoryTooSmall {
            needed: LEN,
            got: LEN - 1
        }
    );
    let mut mem = [0u8; LEN];
    let bad = Geometry { write_size: 3, ..G };
    assert_eq!(
        SimFlash::new(&mut mem[..], bad).unwrap_err(),
        SimError::InvalidGeometry
    );
    // An owned array works too, and starts erased.
    let flash = SimFlash::new([0u8; LEN], G).unwrap();
    assert!(flash.bytes().iter().all(|&b| b == 0xFF));
    assert_eq!(flash.bytes().len(), 1024);
}

#[test]
fn rejects_unaligned_and_out_of_bounds() {
    for ws in [1u32, 4, 8, 16, 32] {
        let g = geometry(ws, 0xFF);
        let mut mem = [0u8; SimFlash::memory_len(geometry(1, 0xFF))];
        let mut f = sim(&mut mem, g);
        if ws > 1 {
            assert_eq!(
                f.write(1, &[0; 32][..ws as usize]),
                Err(SimError::Unaligned { addr: 1, len: ws })
            );
            assert_eq!(
                f.write(0, &[0; 33][..ws as usize + 1]),
                Err(SimError::Unaligned {
                    addr: 0,
                    len: ws + 1
                })
            );
        }
        assert_eq!(
            f.write(1024, &[0; 32][..ws as usize]),
            Err(SimError::OutOfBounds {
                addr: 1024,
                len: ws
            })
        );
        assert!(f.bytes().iter().all(|&b| b == 0xFF), "ws {ws}");
        assert_eq!(f.counters().writes, 0);
    }
    let mut f = fresh();
    let mut buf = [0u8; 8];
    assert_eq!(
        f.read(1020, &mut buf),
        Err(SimError::OutOfBounds { addr: 1020, len: 8 })
    );
    assert!(matches!(
        f.read(u32::MAX, &mut buf),
        Err(SimError::OutOfBounds { .. })
    ));
    assert!(matches!(f.erase(4), Err(SimError::OutOfBounds { .. })));
    assert!(matches!(
        f.flip_bit(0, 8),
        Err(SimError::OutOfBounds { .. })
    ));
    assert!(matches!(
        f.flip_bit(1024, 0),
        Err(SimError::OutOfBounds { .. })
    ));
}

#[test]
fn rejects_rewrite_until_erased() {
    let mut f = fresh();
    f.write(8, &[0xF0; 8]).unwrap();
    // Even a write that would change nothing is a rewrite.
    assert_eq!(f.write(12, &[0xFF; 4]), Err(SimError::Rewrite { addr: 12 }));
    // Checked before anything changes: word 4 stays erased.
    assert_eq!(f.write(4, &[0; 8]), Err(SimError::Rewrite { addr: 8 }));
    assert_eq!(&f.bytes()[4..8], &[0xFF; 4]);
    f.write(4, &[0x0F; 4]).unwrap();
    // Another block is independent.
    f.write(256, &[1; 4]).unwrap();
    f.erase(0).unwrap();
    assert!(f.bytes()[..256].iter().all(|&b| b == 0xFF));
    assert_eq!(&f.bytes()[256..260], &[1; 4]);
    f.write(8, &[0x3C; 4]).unwrap();
    assert_eq!(&f.bytes()[8..12], &[0x3C; 4]);
    assert_eq!(f.write(256, &[1; 4]), Err(SimError::Rewrite { addr: 256 }));
}

#[test]
fn programming_moves_bits_away_from_the_erased_value() {
    assert_eq!(program(0xFF, 0x5A, 0xFF), 0x5A);
    assert_eq!(program(0xF0, 0x3C, 0xFF), 0x30); // AND
    assert_eq!(program(0x00, 0x5A, 0x00), 0x5A);
    assert_eq!(program(0x0F, 0x3C, 0x00), 0x3F); // OR

    let g = geometry(4, 0x00);
    let mut mem = [0u8; LEN];
    let mut f = sim(&mut mem, g);
    assert!(f.bytes().iter().all(|&b| b == 0x00));
    f.bytes_mut()[0] = 0x0F; // stray bits, as after a torn erase
    f.write(0, &[0x3C, 0, 0xFF, 0x81]).unwrap();
    assert_eq!(&f.bytes()[..4], &[0x3F, 0, 0xFF, 0x81]);
    f.erase(0).unwrap();
    assert!(f.bytes()[..256].iter().all(|&b| b == 0x00));
    f.write(0, &[7; 4]).unwrap();
    let mut buf = [0u8; 6];
    f.read(0, &mut buf).unwrap();
    assert_eq!(buf, [7, 7, 7, 7, 0, 0]);
}

#[test]
fn counters_are_exact() {
    let mut f = fresh();
    let mut buf = [0u8; 10];
    f.read(3, &mut buf).unwrap();
    f.read(0, &mut buf[..1]).unwrap();
    f.write(0, &[0; 16]).unwrap();
    f.write(768, &[0; 4]).unwrap();
    f.erase(2).unwrap();
    f.erase(2).unwrap();
    f.erase(0).unwrap();
    f.sync().unwrap();
    // Rejected operations do not count.
    let _ = f.write(1, &[0; 4]);
    let _ = f.read(1024, &mut buf);
    assert_eq!(
        f.counters(),
        SimCounters {
            reads: 2,
            bytes_read: 11,
            writes: 2,
            bytes_written: 20,
            erases: 3,
            syncs: 1,
        }
    );
    assert_eq!(f.erase_count(0), Some(1));
    assert_eq!(f.erase_count(1), Some(0));
    assert_eq!(f.erase_count(2), Some(2));
    assert_eq!(f.erase_count(4), None);
    assert_eq!(f.max_erase_count(), 2);
    f.reset_counters();
    assert_eq!(f.counters(), SimCounters::default());
    assert_eq!(f.max_erase_count(), 0);
    // The contents survive a counter reset.
    assert_eq!(&f.bytes()[768..772], &[0; 4]);
}

#[test]
fn power_cut_tears_only_the_interrupted_word() {
    for ws in [1u32, 4, 8, 16, 32] {
        for n in 0..80u64 {
            let seed = u64::from(ws) << 32 | n;
            let g = geometry(ws, 0xFF);
            let mut mem = [0u8; SimFlash::memory_len(geometry(1, 0xFF))];
            let mut f = sim(&mut mem, g);
            f.set_seed(seed);
            let mut data = [0u8; 64];
            for (i, b) in data.iter_mut().enumerate() {
                *b = (i as u8).wrapping_mul(37) ^ 0xA5;
            }
            // Two writes: the budget carries across calls.
            let (a, b) = data.split_at(32);
            f.cut_after_bytes(n);
            let r1 = f.write(0, a);
            let r2 = f.write(32, b);
            let n = n as usize;
            if n >= 64 {
                assert_eq!((r1, r2), (Ok(()), Ok(())));
                assert_eq!(&f.bytes()[..64], &data);
                continue;
            }
            assert!(r1.is_err() || r2 == Err(SimError::PowerCut), "seed {seed}");
            if n < 32 {
                assert_eq!(r1, Err(SimError::PowerCut), "seed {seed}");
            }
            assert!(f.is_cut());
            let word_end = (n / ws as usize + 1) * ws as usize;
            let mem = f.bytes();
            assert_eq!(&mem[..n], &data[..n], "seed {seed}: completed bytes");
            for i in n..word_end {
                // Only 1 → 0 transitions, and only toward the target.
                assert_eq!(mem[i] & data[i], data[i], "seed {seed}: byte {i}");
            }
            assert!(
                mem[word_end..].iter().all(|&b| b == 0xFF),
                "seed {seed}: later bytes untouched"
            );
            assert_eq!(f.counters().bytes_written, word_end as u64, "seed {seed}");
        }
    }
}

#[test]
fn torn_words_show_partial_programming_for_some_seed() {
    // Over many seeds a torn word must come out neither erased nor complete at least
    // once, in both erased polarities.
    for erased in [0xFF, 0x00] {
        let mut partial = false;
        for seed in 0..64 {
            let mut mem = [0u8; LEN];
            let mut f = sim(&mut mem, geometry(4, erased));
            f.set_seed(seed);
            f.cut_after_bytes(0);
            assert_eq!(f.write(0, &[0x55; 4]), Err(SimError::PowerCut));
            let word = &f.bytes()[..4];
            for &b in word {
                // Bits only move away from the erased value, toward the target.
                if erased == 0xFF {
                    assert_eq!(b & 0x55, 0x55, "seed {seed}");
                } else {
                    assert_eq!(b & !0x55, 0, "seed {seed}");
                }
            }
            partial |= word != [erased; 4] && word != [0x55; 4];
        }
        assert!(partial, "erased {erased:#x}");
    }
}

#[test]
fn a_cut_blocks_everything_until_power_on() {
    let mut f = fresh();
    f.cut_after_bytes(4);
    assert_eq!(f.write(0, &[0; 8]), Err(SimError::PowerCut));
    let mut buf = [0u8; 4];
    assert_eq!(f.read(0, &mut buf), Err(SimError::PowerCut));
    assert_eq!(f.write(64, &[0; 4]), Err(SimError::PowerCut));
    assert_eq!(f.erase(1), Err(SimError::PowerCut));
    assert_eq!(f.sync(), Err(SimError::PowerCut));
    f.power_on();
    assert!(!f.is_cut());
    f.read(0, &mut buf).unwrap();
    assert_eq!(buf, [0; 4]);
    // The cut is spent: writing goes on normally.
    f.write(64, &[0; 32]).unwrap();
    // The first word was complete, so it counts as programmed.
    assert_eq!(f.write(0, &[0; 4]), Err(SimError::Rewrite { addr: 0 }));
}

#[test]
fn a_torn_word_that_reads_erased_may_be_written() {
    let mut f = fresh();
    f.cut_after_bytes(0);
    // Writing the erased value itself leaves nothing to tear.
    assert_eq!(f.write(0, &[0xFF; 4]), Err(SimError::PowerCut));
    f.power_on();
    f.write(0, &[1; 4]).unwrap();
}

#[test]
fn erase_cut_leaves_mixed_content() {
    for seed in 0..16u64 {
        let mut f = fresh();
        f.set_seed(seed);
        f.write(256, &[0x00; 256]).unwrap();
        f.write(512, &[0x00; 256]).unwrap();
        f.cut_after_erases(1);
        f.erase(3).unwrap();
        assert_eq!(f.erase(1), Err(SimError::PowerCut), "seed {seed}");
        assert_eq!(f.erase(2), Err(SimError::PowerCut));
        f.power_on();
        let block = &f.bytes()[256..512];
        let erased = block.iter().filter(|&&b| b == 0xFF).count();
        let old = block.iter().filter(|&&b| b == 0x00).count();
        assert!(erased > 0 && old > 0 && erased + old < 256, "seed {seed}");
        // Block 2 was never reached.
        assert!(f.bytes()[512..768].iter().all(|&b| b == 0), "seed {seed}");
        assert_eq!(f.erase_count(1), Some(1));
        assert_eq!(f.counters().erases, 2);
        // Words that read erased may be written; others need a new erase.
        let first_dirty = block.chunks(4).position(|w| w != [0xFF; 4]).unwrap() as u32;
        let clean = block.chunks(4).position(|w| w == [0xFF; 4]);
        assert_eq!(
            f.write(256 + 4 * first_dirty, &[0; 4]),
            Err(SimError::Rewrite {
                addr: 256 + 4 * first_dirty
            })
        );
        if let Some(clean) = clean {
            f.write(256 + 4 * clean as u32, &[0; 4]).unwrap();
        }
        f.erase(1).unwrap();
        assert!(f.bytes()[256..512].iter().all(|&b| b == 0xFF));
        f.write(256 + 4 * first_dirty, &[0; 4]).unwrap();
    }
}

#[test]
fn same_seed_same_damage() {
    let run = |seed| {
        let mut f = fresh();
        f.set_seed(seed);
        f.write(0, &[0; 256]).unwrap();
        f.cut_after_erases(0);
        let _ = f.erase(0);
        let mut out = [0u8; 256];
        out.copy_from_slice(&f.bytes()[..256]);
        out
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
}

#[test]
fn hostile_images_and_bit_flips() {
    let mut f = fresh();
    let mut image = [0xFFu8; 1024];
    image[5] = 0x12;
    assert_eq!(
        f.load_image(&image[..100]),
        Err(SimError::ImageSize {
            len: 100,
            capacity: 1024
        })
    );
    f.load_image(&image).unwrap();
    assert_eq!(f.write(4, &[0; 4]), Err(SimError::Rewrite { addr: 4 }));
    f.write(8, &[0; 4]).unwrap();
    f.flip_bit(8, 3).unwrap();
    assert_eq!(f.bytes()[8], 0x08);
    f.flip_bit(8, 3).unwrap();
    assert_eq!(f.bytes()[8], 0x00);
    assert_eq!(f.counters().writes, 1);
}

#[test]
fn out_of_order_cut_can_leave_a_later_unit_done_and_an_earlier_not() {
    let mut seen = false;
    for seed in 0..64u64 {
        let mut f = fresh();
        f.set_seed(seed);
        f.set_program_unit(Some(16));
        f.cut_after_bytes(100);
        // A 128-byte write: the cut lands in it, units end in random states.
        assert_eq!(f.write(0, &[0x00; 128]), Err(SimError::PowerCut));
        let units: std::vec::Vec<bool> = f.bytes()[..128]
            .chunks(16)
            .map(|u| u.iter().all(|&b| b == 0x00))
            .collect();
        let untouched: std::vec::Vec<bool> = f.bytes()[..128]
            .chunks(16)
            .map(|u| u.iter().all(|&b| b == 0xFF))
            .collect();
        // Bytes written counts the units begun, exactly.
        let begun = f.bytes()[..128]
            .chunks(16)
            .zip(&untouched)
            .filter(|(u, t)| !**t || u.iter().any(|&b| b != 0xFF))
            .count() as u64;
        assert!(f.counters().bytes_written >= begun * 16, "seed {seed}");
        assert!(f.bytes()[128..].iter().all(|&b| b == 0xFF));
        assert_eq!(f.faults().reordered_cuts, 1);
        seen |= (1..8).any(|i| units[i] && untouched[i - 1]);
        f.power_on();
        // A unit left untouched reads erased and may be written.
        if let Some(i) = untouched.iter().position(|&t| t) {
            f.write(16 * i as u32, &[1; 16]).unwrap();
        }
    }
    assert!(
        seen,
        "some seed programs a later unit but not an earlier one"
    );
    // Without a program unit, the same cut is in address order.
    let mut f = fresh();
    f.cut_after_bytes(100);
    assert_eq!(f.write(0, &[0x00; 128]), Err(SimError::PowerCut));
    assert!(f.bytes()[..100].iter().all(|&b| b == 0));
    assert!(f.bytes()[104..].iter().all(|&b| b == 0xFF));
}

#[test]
fn torn_erase_modes() {
    for (tear, min_random) in [(EraseTear::Arbitrary, 100), (EraseTear::Sparse, 0)] {
        let mut f = fresh();
        f.set_erase_tear(tear);
        f.write(256, &[0x00; 256]).unwrap();
        f.cut_after_erases(0);
        assert_eq!(f.erase(1), Err(SimError::PowerCut));
        f.power_on();
        let block = &f.bytes()[256..512];
        let not_old_or_erased = block.iter().filter(|&&b| b != 0 && b != 0xFF).count();
        assert!(not_old_or_erased >= min_random, "{tear:?}");
        if tear == EraseTear::Sparse {
            let stray: u32 = block.iter().map(|b| (!b).count_ones()).sum();
            assert!((1..=8).contains(&stray), "{stray} stray bits");
        }
        assert_eq!(f.faults().torn_erases, 1);
        f.erase(1).unwrap();
        assert!(f.bytes()[256..512].iter().all(|&b| b == 0xFF));
    }
}

#[test]
fn a_failed_write_leaves_partial_data_and_the_power_on() {
    let mut f = fresh();
    f.fail_write_after_bytes(10);
    f.write(0, &[0x11; 8]).unwrap();
    assert_eq!(
        f.write(8, &[0x22; 8]),
        Err(SimError::ProgramFailed { addr: 8 })
    );
    assert!(!f.is_cut());
    assert_eq!(
        &f.bytes()[..10],
        &[0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x22, 0x22]
    );
    assert_eq!(&f.bytes()[12..16], &[0xFF; 4], "later words untouched");
    assert_eq!(f.faults().failed_writes, 1);
    assert_eq!(f.counters().bytes_written, 12);
    // One-shot: later writes work.
    f.write(16, &[0x33; 4]).unwrap();
    assert_eq!(f.write(8, &[0; 4]), Err(SimError::Rewrite { addr: 8 }));
}

#[test]
fn read_faults_are_transient() {
    let mut f = fresh();
    f.write(0, &[0x5A; 8]).unwrap();
    let mut buf = [0u8; 8];
    f.fail_read_after(1);
    f.read(0, &mut buf).unwrap();
    assert_eq!(
        f.read(0, &mut buf),
        Err(SimError::ReadFailed { addr: 0, len: 8 })
    );
    f.read(0, &mut buf).unwrap();
    assert_eq!(buf, [0x5A; 8]);
    // A one-shot flip: wrong once, right on re-read; reads elsewhere do not spend it.
    f.flip_next_read(5, 0);
    f.read(6, &mut buf[..2]).unwrap();
    f.read(0, &mut buf).unwrap();
    assert_eq!(buf[5], 0x5B);
    f.read(0, &mut buf).unwrap();
    assert_eq!(buf, [0x5A; 8]);
    assert_eq!(f.bytes()[5], 0x5A);
    let faults = f.faults();
    assert_eq!((faults.failed_reads, faults.flipped_reads), (1, 1));
    assert_eq!(f.counters().reads, 6);
    // A flaky cell: wrong on about the given share of reads, never in memory.
    f.set_seed(7);
    f.set_flaky(3, 0x10, 70);
    let wrong = (0..1000)
        .filter(|_| {
            f.read(0, &mut buf).unwrap();
            buf[3] != 0x5A
        })
        .count();
    assert!((620..780).contains(&wrong), "{wrong} of 1000");
    f.set_flaky(3, 0x10, 100);
    f.read(3, &mut buf[..1]).unwrap();
    assert_eq!(buf[0], 0x4A);
    f.clear_flaky();
    f.read(3, &mut buf[..1]).unwrap();
    assert_eq!(buf[0], 0x5A);
}

#[cfg(feature = "std")]
#[test]
fn vec_memory() {
    let mut f = SimFlash::new_vec(G).unwrap();
    f.write(0, &[1, 2, 3, 4]).unwrap();
    assert_eq!(&f.bytes()[..4], &[1, 2, 3, 4]);
    assert_eq!(f.into_inner().len(), LEN);
}
