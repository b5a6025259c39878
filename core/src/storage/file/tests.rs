//! Unit tests of the image file flash: creation aside and install, the contract, the lock,
//! poisoning after a failed write, erase or sync, and the dropped page cache on open.

use super::*;
use crate::storage::Flash;
use std::string::ToString;

const G: Geometry = Geometry {
    erase_size: 4096,
    write_size: 8,
    capacity: 4 * 4096,
    erased: 0xFF,
};

fn image_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("flash.img")
}

#[test]
fn create_fills_with_the_erased_value() {
    let dir = tempfile::tempdir().unwrap();
    let path = image_path(&dir);
    for erased in [0xFF, 0x00] {
        let _ = std::fs::remove_file(&path);
        let g = Geometry { erased, ..G };
        let flash = FileFlash::create(&path, g).unwrap();
        assert_eq!(flash.geometry(), g);
        drop(flash);
        let raw = std::fs::read(&path).unwrap();
        assert_eq!(raw.len(), G.capacity as usize);
        assert!(raw.iter().all(|&b| b == erased));
    }
}

#[test]
fn an_image_is_built_aside_and_appears_only_when_installed() {
    use std::sync::atomic::AtomicBool;
    let dir = tempfile::tempdir().unwrap();
    let path = image_path(&dir);
    let aside = FileFlash::aside_path(&path);
    assert_eq!(aside, dir.path().join(".flash.img.creating"));
    let mut flash = FileFlash::create_aside(&path, G, &AtomicBool::new(false)).unwrap();
    assert!(!path.exists() && aside.exists());
    // A second creation, or a cleanup, while this one holds the file aside is refused.
    assert!(matches!(
        FileFlash::create_aside(&path, G, &AtomicBool::new(false)),
        Err(FileFlashError::Locked { .. })
    ));
    assert!(matches!(
        FileFlash::remove_aside(&path),
        Err(FileFlashError::Locked { .. })
    ));
    flash.write(4096, &[7; 8]).unwrap();
    flash.install(&path).unwrap();
    assert_eq!(flash.path(), path);
    assert!(path.exists() && !aside.exists());
    drop(flash);
    let raw = std::fs::read(&path).unwrap();
    assert_eq!(raw.len(), G.capacity as usize);
    assert_eq!(raw[4096..4104], [7; 8]);
    assert!(!FileFlash::remove_aside(&path).unwrap());
}

#[test]
fn an_interrupted_creation_leaves_no_image_and_its_leftover_is_removed() {
    use std::sync::atomic::AtomicBool;
    let dir = tempfile::tempdir().unwrap();
    let path = image_path(&dir);
    let aside = FileFlash::aside_path(&path);
    // Cancelled: nothing left at all.
    assert!(matches!(
        FileFlash::create_aside(&path, G, &AtomicBool::new(true)),
        Err(FileFlashError::Cancelled { .. })
    ));
    assert!(!path.exists() && !aside.exists());
    // Killed before install: the file aside stays, the next start removes it.
    let flash = FileFlash::create_aside(&path, G, &AtomicBool::new(false)).unwrap();
    drop(flash);
    std::fs::write(&aside, b"half an image").unwrap();
    assert!(!path.exists());
    assert!(FileFlash::remove_aside(&path).unwrap());
    assert!(!aside.exists());
    FileFlash::create(&path, G).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        u64::from(G.capacity)
    );
}

#[test]
fn create_refuses_an_existing_file_and_a_bad_geometry() {
    let dir = tempfile::tempdir().unwrap();
    let path = image_path(&dir);
    std::fs::write(&path, b"precious").unwrap();
    assert!(matches!(
        FileFlash::create(&path, G),
        Err(FileFlashError::Io { op: "create", .. })
    ));
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    let bad = Geometry {
        capacity: 4095,
        ..G
    };
    assert!(matches!(
        FileFlash::create(dir.path().join("other.img"), bad),
        Err(FileFlashError::InvalidGeometry { .. })
    ));
}

#[test]
fn write_read_erase_sync_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = image_path(&dir);
    let mut flash = FileFlash::create(&path, G).unwrap();
    flash.write(4096 + 8, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    flash.sync().unwrap();
    let mut buf = [0u8; 10];
    flash.read(4096 + 7, &mut buf).unwrap();
    assert_eq!(buf, [0xFF, 1, 2, 3, 4, 5, 6, 7, 8, 0xFF]);
    drop(flash);

    let mut flash = FileFlash::open(&path, 4096, 8, 0xFF).unwrap();
    assert_eq!(flash.geometry(), G);
    assert_eq!(flash.path(), path);
    let mut word = [0u8; 8];
    flash.read(4096 + 8, &mut word).unwrap();
    assert_eq!(word, [1, 2, 3, 4, 5, 6, 7, 8]);
    flash.erase(1).unwrap();
    flash.read(4096 + 8, &mut word).unwrap();
    assert_eq!(word, [0xFF; 8]);
    flash.write(4096 + 8, &[0; 8]).unwrap();
}

#[test]
fn sequential_reads_are_served_ahead_and_see_every_write_and_erase() {
    let dir = tempfile::tempdir().unwrap();
    let path = image_path(&dir);
    let mut flash = FileFlash::create(&path, G).unwrap();
    flash.write(4096 + 8, &[1; 8]).unwrap();
    let mut buf = [0u8; 8];
    // A walk: the second read starts 3 bytes after the first ended (a padded batch) and
    // reads ahead to the end of the image (smaller than the window).
    flash.read(0, &mut buf).unwrap();
    flash.read(8 + 3, &mut buf).unwrap();
    // What was read ahead is served without the file: a descriptor open for writing only
    // fails every `pread`.
    let write_only = || OpenOptions::new().write(true).open(&path).unwrap();
    let good = std::mem::replace(&mut flash.file, write_only());
    flash.read(4096 + 8, &mut buf).unwrap();
    assert_eq!(buf, [1; 8]);
    flash.file = good;
    // A write in the window's range drops it: the next read sees the new bytes.
    flash.write(4096 + 16, &[2; 8]).unwrap();
    flash.read(4096 + 16, &mut buf).unwrap();
    assert_eq!(buf, [2; 8]);
    // So does an erase, after a walk filled the window again from 4096 + 24.
    flash.read(4096 + 24, &mut buf).unwrap();
    flash.erase(1).unwrap();
    for at in [4096 + 8, 4096 + 16] {
        flash.read(at, &mut buf).unwrap();
        assert_eq!(buf, [0xFF; 8], "at {at}");
    }
    // A poisoned image serves nothing, held bytes included.
    flash.read(8192, &mut buf).unwrap();
    flash.read(8192 + 8, &mut buf).unwrap();
    // (A failed write outside the window's range: it does not drop the window.)
    let good = std::mem::replace(&mut flash.file, File::open(&path).unwrap());
    assert!(flash.write(0, &[0; 8]).is_err());
    flash.file = good;
    assert!(matches!(
        flash.read(8192 + 16, &mut buf),
        Err(FileFlashError::Poisoned { op: "write", .. })
    ));
}

#[test]
fn rejects_bad_requests() {
    let dir = tempfile::tempdir().unwrap();
    let mut flash = FileFlash::create(image_path(&dir), G).unwrap();
    assert!(matches!(
        flash.write(4, &[0; 8]),
        Err(FileFlashError::Unaligned { addr: 4, len: 8 })
    ));
    assert!(matches!(
        flash.write(0, &[0; 12]),
        Err(FileFlashError::Unaligned { addr: 0, len: 12 })
    ));
    assert!(matches!(
        flash.write(G.capacity, &[0; 8]),
        Err(FileFlashError::OutOfBounds { .. })
    ));
    let mut buf = [0u8; 2];
    assert!(matches!(
        flash.read(G.capacity - 1, &mut buf),
        Err(FileFlashError::OutOfBounds { .. })
    ));
    assert!(matches!(
        flash.read(u32::MAX, &mut buf),
        Err(FileFlashError::OutOfBounds { .. })
    ));
    assert!(matches!(
        flash.erase(4),
        Err(FileFlashError::OutOfBounds { .. })
    ));
}

#[test]
fn not_erased_guard_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut flash = FileFlash::create(image_path(&dir), G).unwrap();
    flash.write(16, &[0xAB; 8]).unwrap();
    // A write covering an erased word and the programmed one is refused whole.
    let err = flash.write(8, &[0; 16]).unwrap_err();
    assert!(
        matches!(err, FileFlashError::NotErased { addr: 16 }),
        "{err:?}"
    );
    let mut buf = [0u8; 16];
    flash.read(8, &mut buf).unwrap();
    assert_eq!(&buf[..8], &[0xFF; 8]);
    assert_eq!(&buf[8..], &[0xAB; 8]);
    // A long write past the 512-byte check window finds a programmed byte far in.
    flash.write(2048, &[0x01; 8]).unwrap();
    let err = flash.write(1024, &[0; 2048]).unwrap_err();
    assert!(
        matches!(err, FileFlashError::NotErased { addr: 2048 }),
        "{err:?}"
    );
}

#[test]
fn a_second_open_is_refused_while_locked() {
    let dir = tempfile::tempdir().unwrap();
    let path = image_path(&dir);
    let flash = FileFlash::create(&path, G).unwrap();
    let err = FileFlash::open(&path, 4096, 8, 0xFF).unwrap_err();
    assert!(matches!(err, FileFlashError::Locked { .. }), "{err:?}");
    assert!(err.to_string().contains("in use"));
    assert!(matches!(
        FileFlash::open_read_only(&path, 4096, 8, 0xFF),
        Err(FileFlashError::Locked { .. })
    ));
    drop(flash);

    // Readers share; a writer waits for them.
    let mut r1 = FileFlash::open_read_only(&path, 4096, 8, 0xFF).unwrap();
    let _r2 = FileFlash::open_read_only(&path, 4096, 8, 0xFF).unwrap();
    assert!(matches!(
        FileFlash::open(&path, 4096, 8, 0xFF),
        Err(FileFlashError::Locked { .. })
    ));
    let mut buf = [0u8; 4];
    r1.read(0, &mut buf).unwrap();
    assert!(matches!(
        r1.write(0, &[0; 8]),
        Err(FileFlashError::ReadOnly)
    ));
    assert!(matches!(r1.erase(0), Err(FileFlashError::ReadOnly)));
    assert!(matches!(r1.sync(), Err(FileFlashError::ReadOnly)));
}

/// A file descriptor on which `fdatasync` fails (a pipe: EINVAL).
fn unsyncable_file() -> File {
    let (reader, _writer) = std::io::pipe().unwrap();
    File::from(std::os::fd::OwnedFd::from(reader))
}

#[test]
fn a_failed_sync_poisons_the_image_until_it_is_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let path = image_path(&dir);
    let mut flash = FileFlash::create(&path, G).unwrap();
    flash.write(8, &[7; 8]).unwrap();
    flash.sync().unwrap();
    // The storage under the open image starts failing its syncs.
    let good = std::mem::replace(&mut flash.file, unsyncable_file());
    let err = flash.sync().unwrap_err();
    assert!(
        matches!(err, FileFlashError::Io { op: "sync", .. }),
        "{err:?}"
    );
    // It works again, but nothing it shows is trusted any more.
    flash.file = good;
    let mut buf = [0u8; 8];
    for err in [
        flash.read(8, &mut buf).unwrap_err(),
        flash.write(16, &[1; 8]).unwrap_err(),
        flash.erase(1).unwrap_err(),
        flash.sync().unwrap_err(),
    ] {
        assert!(
            matches!(&err, FileFlashError::Poisoned { op: "sync", path: p } if *p == path),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("flash.img") && msg.contains("failed sync"),
            "{msg}"
        );
    }
    drop(flash);
    let mut flash = FileFlash::open(&path, 4096, 8, 0xFF).unwrap();
    flash.read(8, &mut buf).unwrap();
    assert_eq!(buf, [7; 8]);
    flash.write(16, &[1; 8]).unwrap();
    flash.sync().unwrap();
}

#[test]
fn a_failed_write_or_erase_poisons_the_image() {
    let dir = tempfile::tempdir().unwrap();
    let path = image_path(&dir);
    for op in ["write", "erase"] {
        let _ = std::fs::remove_file(&path);
        let mut flash = FileFlash::create(&path, G).unwrap();
        // A descriptor open for reading only: `pwrite` fails with EBADF.
        let good = std::mem::replace(&mut flash.file, File::open(&path).unwrap());
        let err = match op {
            "write" => flash.write(0, &[0; 8]).unwrap_err(),
            _ => flash.erase(0).unwrap_err(),
        };
        assert!(
            matches!(&err, FileFlashError::Io { op: o, .. } if *o == op),
            "{err:?}"
        );
        flash.file = good;
        let mut buf = [0u8; 4];
        let err = flash.read(0, &mut buf).unwrap_err();
        assert!(
            matches!(&err, FileFlashError::Poisoned { op: o, .. } if *o == op),
            "{err:?}"
        );
    }
}

/// Pages of `file` in the page cache, counted with `mincore` over a shared read-only
/// mapping; `None` where that cannot be observed.
#[cfg(target_os = "linux")]
fn cached_pages(file: &File, len: usize) -> Option<usize> {
    use std::os::fd::AsRawFd;
    // SAFETY: `sysconf` has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
    // SAFETY: a fresh shared read-only mapping of `len` bytes of an open file; it is
    // only passed to `mincore` and unmapped below, never read through.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if map == libc::MAP_FAILED {
        return None;
    }
    let mut vec = std::vec![0u8; len.div_ceil(page)];
    // SAFETY: `map` is a live mapping of `len` bytes and `vec` has one byte per page.
    let rc = unsafe { libc::mincore(map, len, vec.as_mut_ptr()) };
    // SAFETY: `map` was returned by `mmap` with this length and is not used after.
    unsafe { libc::munmap(map, len) };
    (rc == 0).then(|| vec.iter().filter(|&&b| b & 1 != 0).count())
}

#[cfg(target_os = "linux")]
#[test]
fn open_drops_the_cached_pages_of_the_image() {
    let dir = tempfile::tempdir().unwrap();
    let path = image_path(&dir);
    // tmpfs keeps files in the page cache only: nothing there can be dropped.
    let fs = rustix::fs::statfs(dir.path()).unwrap();
    if fs.f_type as i64 == 0x0102_1994 {
        std::eprintln!("skipped: the temporary directory is on tmpfs");
        return;
    }
    let mut flash = FileFlash::create(&path, G).unwrap();
    flash.write(4096, &[3; 64]).unwrap();
    flash.sync().unwrap();
    drop(flash);
    // Bring every page of the image into the cache.
    let raw = std::fs::read(&path).unwrap();
    let probe = File::open(&path).unwrap();
    let len = raw.len();
    let Some(before) = cached_pages(&probe, len) else {
        std::eprintln!("skipped: mincore is not available");
        return;
    };
    assert!(before > 0, "reading the image cached none of its pages");
    let mut flash = FileFlash::open(&path, 4096, 8, 0xFF).unwrap();
    assert_eq!(cached_pages(&probe, len), Some(0), "cached pages left");
    let mut buf = [0u8; 64];
    flash.read(4096, &mut buf).unwrap();
    assert_eq!(buf, [3; 64]);
    drop(flash);
    std::fs::read(&path).unwrap();
    FileFlash::open_read_only(&path, 4096, 8, 0xFF).unwrap();
    assert_eq!(cached_pages(&probe, len), Some(0), "cached pages left");
}

#[test]
fn open_checks_the_length_and_geometry() {
    let dir = tempfile::tempdir().unwrap();
    let path = image_path(&dir);
    std::fs::write(&path, [0xFFu8; 4096 + 100]).unwrap();
    assert!(matches!(
        FileFlash::open(&path, 4096, 8, 0xFF),
        Err(FileFlashError::BadLength {
            len: 4196,
            erase_size: 4096,
            ..
        })
    ));
    std::fs::write(&path, []).unwrap();
    assert!(matches!(
        FileFlash::open(&path, 4096, 8, 0xFF),
        Err(FileFlashError::BadLength { len: 0, .. })
    ));
    std::fs::write(&path, [0xFFu8; 4096]).unwrap();
    assert!(matches!(
        FileFlash::open(&path, 4096, 3, 0xFF),
        Err(FileFlashError::InvalidGeometry { .. })
    ));
    assert!(matches!(
        FileFlash::open(&path, 0, 8, 0xFF),
        Err(FileFlashError::InvalidGeometry { .. })
    ));
    assert!(matches!(
        FileFlash::open(dir.path().join("missing.img"), 4096, 8, 0xFF),
        Err(FileFlashError::Io { op: "open", .. })
    ));
    FileFlash::open(&path, 4096, 8, 0xFF).unwrap();
}
