//! A test-only `LD_PRELOAD` shim that makes one sync of a chosen file fail with `EIO` and
//! models what the kernel then keeps of the writes that sync covered.
//!
//! It interposes `pwrite`/`pwrite64`/`write`, `fdatasync`/`fsync` and
//! `posix_fadvise`/`posix_fadvise64` (so it works on programs that do their file I/O through
//! libc, as Rust's std does; writes through `mmap` are not seen). Build it with
//! `cargo build -p spillway-faultfs` and load `target/<profile>/libspillway_faultfs.so`. No
//! shipped binary links it.
//!
//! # Environment
//! - `FAULTFS_PATH_SUFFIX`: the files the shim acts on: every file whose path (as
//!   `/proc/self/fd` shows it) ends with this string. Unset: the shim passes everything
//!   through and does nothing else.
//! - `FAULTFS_FAIL_SYNC=N`: the `N`th `fdatasync`/`fsync` call (1-based, both counted
//!   together, per process) on a matching file fails with `EIO`. It fires once: the next
//!   sync succeeds, as Linux reports a writeback error once. With `FAULTFS_STATE` it fires
//!   once per state file, so a restarted process given the same environment does not fail
//!   again.
//! - `FAULTFS_FAIL_WRITE=N`: the `N`th `pwrite`/`write` call (1-based, per process) on a
//!   matching file fails with `EIO` and writes nothing; once per state file like
//!   `FAULTFS_FAIL_SYNC`.
//! - `FAULTFS_HANG_SYNC=N`: the `N`th `fdatasync`/`fsync` on a matching file never returns
//!   (a sync stuck on a dying SD card), counted like `FAULTFS_FAIL_SYNC`.
//! - `FAULTFS_HANG_WHEN=PATH`: every `fdatasync`/`fsync` on a matching file made while
//!   `PATH` exists never returns (the test creates `PATH` when the hang should start).
//! - `FAULTFS_MODE`: what the failed sync did to the writes it covered (every write to that
//!   file since its last successful sync):
//!   - `dropped` (default): they are undone at once, in the page cache and on disk; a re-read
//!     shows the bytes from before them (and a file they extended is cut back).
//!   - `kept`: the page cache keeps showing the new bytes but the disk does not have them.
//!     Their undo data goes to the state file (it survives process restarts) and is applied
//!     when the file's cache is dropped (`posix_fadvise(POSIX_FADV_DONTNEED)` on it, except
//!     pages written again since, which stay cached) or at a "reboot". A later successful
//!     sync that writes a page again puts the page's cached bytes on disk (that page's
//!     undo is forgotten).
//! - `FAULTFS_STATE`: path of the state file (required for `kept`; must not end with
//!   `FAULTFS_PATH_SUFFIX`): the undo data the disk lacks and whether the failure fired.
//! - `FAULTFS_REBOOT=1`: when the shim is loaded, apply every pending undo in
//!   `FAULTFS_STATE` to its file (what a reboot shows: the disk's bytes; a file extended
//!   only by undone writes is cut back) and clear them; e.g.
//!   `LD_PRELOAD=libspillway_faultfs.so FAULTFS_STATE=s FAULTFS_REBOOT=1 /bin/true` (a program,
//!   not the shell builtin `true`, which loads nothing).
//!
//! The shim reports on stderr each time it fires, drops cached pages or reboots, as lines
//! starting `faultfs: `.

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::fs::{File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Page size of the modelled page cache, bytes.
const PAGE: u64 = 4096;
/// First bytes of the state file.
const MAGIC: &[u8; 8] = b"SPFAULT1";

/// What a failed sync did to the writes it covered.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Dropped,
    Kept,
}

/// The environment's settings.
struct Config {
    suffix: Vec<u8>,
    fail_sync: Option<u64>,
    hang_sync: Option<u64>,
    hang_when: Option<PathBuf>,
    fail_write: Option<u64>,
    mode: Mode,
    state: Option<PathBuf>,
}

/// The bytes a write replaced: writing `old` at `offset` (and cutting the file to
/// `truncate_to` when set) undoes it. `old` is as long as the write; bytes the write added
/// past the old end of the file are zero.
#[derive(Clone)]
struct Undo {
    path: Vec<u8>,
    offset: u64,
    old: Vec<u8>,
    truncate_to: Option<u64>,
}

impl Undo {
    fn end(&self) -> u64 {
        self.offset + self.old.len() as u64
    }

    /// The parts of `self` inside and outside `ranges` (sorted, disjoint `[start, end)`).
    fn split(self, ranges: &[(u64, u64)]) -> (Vec<Undo>, Vec<Undo>) {
        let (mut inside, mut outside) = (Vec::new(), Vec::new());
        let mut at = self.offset;
        let piece = |from: u64, to: u64| Undo {
            path: self.path.clone(),
            offset: from,
            old: self.old[(from - self.offset) as usize..(to - self.offset) as usize].to_vec(),
            truncate_to: self.truncate_to,
        };
        for &(start, end) in ranges {
            if end <= at || start >= self.end() {
                continue;
            }
            let start = start.max(at);
            let end = end.min(self.end());
            if start > at {
                outside.push(piece(at, start));
            }
            inside.push(piece(start, end));
            at = end;
        }
        if at < self.end() {
            outside.push(piece(at, self.end()));
        }
        (inside, outside)
    }
}

/// What the shim knows: in-process counters, the writes since each file's last sync, and
/// (mirrored in the state file) the undo data of failed syncs in `kept` mode.
#[derive(Default)]
struct State {
    loaded: bool,
    syncs: u64,
    writes: u64,
    fired: bool,
    unsynced: Vec<Undo>,
    pending: Vec<Undo>,
}

fn config() -> Option<&'static Config> {
    static CONFIG: OnceLock<Option<Config>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let suffix = std::env::var_os("FAULTFS_PATH_SUFFIX")?;
            let mode = match std::env::var("FAULTFS_MODE").as_deref() {
                Ok("kept") => Mode::Kept,
                _ => Mode::Dropped,
            };
            Some(Config {
                suffix: suffix.as_bytes().to_vec(),
                fail_sync: std::env::var("FAULTFS_FAIL_SYNC")
                    .ok()
                    .and_then(|n| n.parse().ok()),
                hang_sync: std::env::var("FAULTFS_HANG_SYNC")
                    .ok()
                    .and_then(|n| n.parse().ok()),
                hang_when: std::env::var_os("FAULTFS_HANG_WHEN").map(PathBuf::from),
                fail_write: std::env::var("FAULTFS_FAIL_WRITE")
                    .ok()
                    .and_then(|n| n.parse().ok()),
                mode,
                state: std::env::var_os("FAULTFS_STATE").map(PathBuf::from),
            })
        })
        .as_ref()
}

fn state() -> MutexGuard<'static, State> {
    static STATE: Mutex<State> = Mutex::new(State {
        loaded: false,
        syncs: 0,
        writes: 0,
        fired: false,
        unsynced: Vec::new(),
        pending: Vec::new(),
    });
    let mut s = STATE.lock().unwrap_or_else(|p| p.into_inner());
    if !s.loaded {
        s.loaded = true;
        if let Some((fired, pending)) = config().and_then(|c| c.state.as_deref()).and_then(load) {
            s.fired = fired;
            s.pending = pending;
        }
    }
    s
}

thread_local! {
    static IN_SHIM: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with the re-entrancy guard set, or returns `None` when already inside the shim
/// (the shim's own file I/O passes straight through).
fn guarded<T>(f: impl FnOnce() -> T) -> Option<T> {
    let entered = IN_SHIM
        .try_with(|g| {
            if g.get() {
                false
            } else {
                g.set(true);
                true
            }
        })
        .unwrap_or(false);
    if !entered {
        return None;
    }
    let out = f();
    let _ = IN_SHIM.try_with(|g| g.set(false));
    Some(out)
}

/// The path of `fd` if it is a file the shim acts on.
fn matching_path(fd: c_int) -> Option<Vec<u8>> {
    let config = config()?;
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let path = link.as_os_str().as_bytes();
    path.ends_with(&config.suffix).then(|| path.to_vec())
}

macro_rules! real {
    ($name:literal : $ty:ty) => {{
        static PTR: OnceLock<usize> = OnceLock::new();
        let ptr = *PTR.get_or_init(|| {
            // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name has no preconditions.
            unsafe { libc::dlsym(libc::RTLD_NEXT, concat!($name, "\0").as_ptr().cast()) as usize }
        });
        assert!(ptr != 0, concat!("faultfs: no next ", $name));
        // SAFETY: the symbol found is libc's function of this name, whose C signature `$ty`
        // spells out.
        unsafe { std::mem::transmute::<usize, $ty>(ptr) }
    }};
}

type PwriteFn = unsafe extern "C" fn(c_int, *const c_void, libc::size_t, libc::off_t) -> isize;
type WriteFn = unsafe extern "C" fn(c_int, *const c_void, libc::size_t) -> isize;
type SyncFn = unsafe extern "C" fn(c_int) -> c_int;
type FadviseFn = unsafe extern "C" fn(c_int, libc::off_t, libc::off_t, c_int) -> c_int;

/// The undo of a write of `len` bytes at `offset` to `fd`, read before it happens.
fn undo_for(fd: c_int, path: Vec<u8>, offset: u64, len: usize) -> Undo {
    // SAFETY: `fd` is the caller's descriptor; ManuallyDrop keeps it open.
    let file =
        std::mem::ManuallyDrop::new(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut old = vec![0u8; len];
    let present = size.saturating_sub(offset).min(len as u64) as usize;
    let mut got = 0;
    while got < present {
        match file.read_at(&mut old[got..present], offset + got as u64) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    Undo {
        path,
        offset,
        old,
        truncate_to: (offset + len as u64 > size).then_some(size),
    }
}

/// Records the undo of a write about to happen on `fd` at `offset` (or at the end of the
/// file or the current position when `None`), then lets `write` do it.
fn tracked_write(
    fd: c_int,
    len: usize,
    offset: Option<u64>,
    write: impl FnOnce() -> isize,
) -> isize {
    let Some(path) = guarded(|| matching_path(fd)).flatten() else {
        return write();
    };
    let offset = offset.unwrap_or_else(|| {
        // SAFETY: fcntl and lseek on the caller's descriptor, no pointers.
        unsafe {
            if libc::fcntl(fd, libc::F_GETFL) & libc::O_APPEND != 0 {
                libc::lseek(fd, 0, libc::SEEK_END) as u64
            } else {
                libc::lseek(fd, 0, libc::SEEK_CUR) as u64
            }
        }
    });
    let mut s = state();
    s.writes += 1;
    if !s.fired && config().and_then(|c| c.fail_write) == Some(s.writes) {
        s.fired = true;
        let n = s.writes;
        guarded(|| {
            eprintln!(
                "faultfs: write #{n} of {} ({len} bytes at {offset}) fails with EIO",
                String::from_utf8_lossy(&path)
            );
            save(&s);
        });
        errno_set(libc::EIO);
        return -1;
    }
    let undo = guarded(|| undo_for(fd, path, offset, len));
    let n = write();
    if let Some(mut undo) = undo
        && n > 0
    {
        undo.old.truncate(n as usize);
        s.unsynced.push(undo);
    }
    n
}

/// Page-aligned ranges the writes in `undos` dirtied, sorted and merged.
fn dirty_pages<'a>(undos: impl Iterator<Item = &'a Undo>) -> Vec<(u64, u64)> {
    let mut r: Vec<(u64, u64)> = undos
        .map(|u| (u.offset / PAGE * PAGE, u.end().div_ceil(PAGE) * PAGE))
        .collect();
    r.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (s, e) in r {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    merged
}

/// Writes the undos (newest first) into their files; cuts a file back only if `truncate`.
fn apply(undos: &[Undo], truncate: bool) {
    for u in undos.iter().rev() {
        let path = Path::new(std::ffi::OsStr::from_bytes(&u.path));
        let Ok(file) = OpenOptions::new().write(true).open(path) else {
            eprintln!("faultfs: cannot open {} to undo a write", path.display());
            continue;
        };
        if let Err(e) = file.write_all_at(&u.old, u.offset) {
            eprintln!("faultfs: undo at {} in {}: {e}", u.offset, path.display());
        }
        if truncate && let Some(len) = u.truncate_to {
            let _ = file.set_len(len);
        }
        let _ = file.sync_data();
    }
}

fn load(path: &Path) -> Option<(bool, Vec<Undo>)> {
    let data = std::fs::read(path).ok()?;
    let mut at = data.strip_prefix(MAGIC.as_slice())?;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, rest) = at.split_at_checked(n)?;
        at = rest;
        Some(head)
    };
    let u32_at = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap_or([0; 4]));
    let u64_at = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    let fired = take(1)?[0] != 0;
    let count = u32_at(take(4)?);
    let mut pending = Vec::new();
    for _ in 0..count {
        let path_len = u32_at(take(4)?) as usize;
        let path = take(path_len)?.to_vec();
        let offset = u64_at(take(8)?);
        let truncate_to = Some(u64_at(take(8)?)).filter(|&t| t != u64::MAX);
        let len = u32_at(take(4)?) as usize;
        let old = take(len)?.to_vec();
        pending.push(Undo {
            path,
            offset,
            old,
            truncate_to,
        });
    }
    Some((fired, pending))
}

fn save(s: &State) {
    let Some(path) = config().and_then(|c| c.state.as_deref()) else {
        return;
    };
    let mut out = MAGIC.to_vec();
    out.push(u8::from(s.fired));
    out.extend_from_slice(&(s.pending.len() as u32).to_le_bytes());
    for u in &s.pending {
        out.extend_from_slice(&(u.path.len() as u32).to_le_bytes());
        out.extend_from_slice(&u.path);
        out.extend_from_slice(&u.offset.to_le_bytes());
        out.extend_from_slice(&u.truncate_to.unwrap_or(u64::MAX).to_le_bytes());
        out.extend_from_slice(&(u.old.len() as u32).to_le_bytes());
        out.extend_from_slice(&u.old);
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    if std::fs::write(&tmp, &out)
        .and_then(|()| std::fs::rename(&tmp, path))
        .is_err()
    {
        eprintln!("faultfs: cannot write state file {}", path.display());
    }
}

/// `fdatasync`/`fsync` of `fd` through `sync`, failing the configured one.
fn tracked_sync(fd: c_int, sync: impl FnOnce() -> c_int) -> c_int {
    let Some(path) = guarded(|| matching_path(fd)).flatten() else {
        return sync();
    };
    let Some(config) = config() else {
        return sync();
    };
    let mut s = state();
    s.syncs += 1;
    let hang_now = config
        .hang_when
        .as_deref()
        .is_some_and(|p| guarded(|| p.exists()).unwrap_or(false));
    if config.hang_sync == Some(s.syncs) || hang_now {
        let shown = String::from_utf8_lossy(&path).into_owned();
        let n = s.syncs;
        drop(s);
        guarded(|| eprintln!("faultfs: sync #{n} of {shown} hangs"));
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
    let (mine, others): (Vec<Undo>, Vec<Undo>) = std::mem::take(&mut s.unsynced)
        .into_iter()
        .partition(|u| u.path == path);
    s.unsynced = others;
    if !s.fired && config.fail_sync == Some(s.syncs) {
        s.fired = true;
        let bytes: usize = mine.iter().map(|u| u.old.len()).sum();
        let shown = String::from_utf8_lossy(&path).into_owned();
        guarded(|| {
            match config.mode {
                Mode::Dropped => {
                    apply(&mine, true);
                    eprintln!(
                        "faultfs: sync #{} of {shown} fails with EIO; {} writes ({bytes} bytes) dropped",
                        s.syncs,
                        mine.len()
                    );
                }
                Mode::Kept => {
                    eprintln!(
                        "faultfs: sync #{} of {shown} fails with EIO; {} writes ({bytes} bytes) stay cached, not on disk",
                        s.syncs,
                        mine.len()
                    );
                    s.pending.extend(mine);
                }
            }
            save(&s);
        });
        errno_set(libc::EIO);
        return -1;
    }
    let r = sync();
    if r == 0 && s.pending.iter().any(|u| u.path == path) {
        // The file's size is on disk now; pages written again carry their cached bytes.
        let pages = dirty_pages(mine.iter());
        let pending = std::mem::take(&mut s.pending);
        for mut u in pending {
            if u.path == path {
                u.truncate_to = None;
                s.pending.extend(u.split(&pages).1);
            } else {
                s.pending.push(u);
            }
        }
        guarded(|| save(&s));
    } else if r != 0 {
        // A real failure: keep the writes as unsynced.
        s.unsynced.extend(mine);
    }
    r
}

fn errno_set(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// `posix_fadvise` on `fd`: `POSIX_FADV_DONTNEED` drops the clean cached pages, so pending
/// undos outside pages written since the last sync are applied.
fn tracked_fadvise(fd: c_int, advice: c_int, fadvise: impl FnOnce() -> c_int) -> c_int {
    if advice == libc::POSIX_FADV_DONTNEED
        && let Some(path) = guarded(|| matching_path(fd)).flatten()
    {
        let mut s = state();
        if s.pending.iter().any(|u| u.path == path) {
            let dirty = dirty_pages(s.unsynced.iter().filter(|u| u.path == path));
            let pending = std::mem::take(&mut s.pending);
            let mut dropped = Vec::new();
            for u in pending {
                if u.path == path {
                    let (inside, outside) = u.split(&dirty);
                    s.pending.extend(inside);
                    dropped.extend(outside);
                } else {
                    s.pending.push(u);
                }
            }
            guarded(|| {
                apply(&dropped, false);
                let bytes: usize = dropped.iter().map(|u| u.old.len()).sum();
                eprintln!(
                    "faultfs: cache of {} dropped; {bytes} bytes the disk lacks undone",
                    String::from_utf8_lossy(&path)
                );
                save(&s);
            });
        }
    }
    fadvise()
}

/// Interposed `pwrite64`.
///
/// # Safety
/// As libc's `pwrite64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwrite64(
    fd: c_int,
    buf: *const c_void,
    count: libc::size_t,
    offset: libc::off_t,
) -> isize {
    let real = real!("pwrite64": PwriteFn);
    // SAFETY: the caller's arguments are passed on unchanged.
    tracked_write(fd, count, u64::try_from(offset).ok(), || unsafe {
        real(fd, buf, count, offset)
    })
}

/// Interposed `pwrite` (the same call as `pwrite64` on 64-bit Linux).
///
/// # Safety
/// As libc's `pwrite`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwrite(
    fd: c_int,
    buf: *const c_void,
    count: libc::size_t,
    offset: libc::off_t,
) -> isize {
    let real = real!("pwrite": PwriteFn);
    // SAFETY: the caller's arguments are passed on unchanged.
    tracked_write(fd, count, u64::try_from(offset).ok(), || unsafe {
        real(fd, buf, count, offset)
    })
}

/// Interposed `write`.
///
/// # Safety
/// As libc's `write`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, count: libc::size_t) -> isize {
    let real = real!("write": WriteFn);
    // SAFETY: the caller's arguments are passed on unchanged.
    tracked_write(fd, count, None, || unsafe { real(fd, buf, count) })
}

/// Interposed `fdatasync`.
///
/// # Safety
/// As libc's `fdatasync`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    let real = real!("fdatasync": SyncFn);
    // SAFETY: the caller's argument is passed on unchanged.
    tracked_sync(fd, || unsafe { real(fd) })
}

/// Interposed `fsync`.
///
/// # Safety
/// As libc's `fsync`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    let real = real!("fsync": SyncFn);
    // SAFETY: the caller's argument is passed on unchanged.
    tracked_sync(fd, || unsafe { real(fd) })
}

/// Interposed `posix_fadvise`.
///
/// # Safety
/// As libc's `posix_fadvise`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_fadvise(
    fd: c_int,
    offset: libc::off_t,
    len: libc::off_t,
    advice: c_int,
) -> c_int {
    let real = real!("posix_fadvise": FadviseFn);
    // SAFETY: the caller's arguments are passed on unchanged.
    tracked_fadvise(fd, advice, || unsafe { real(fd, offset, len, advice) })
}

/// Interposed `posix_fadvise64`.
///
/// # Safety
/// As libc's `posix_fadvise64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_fadvise64(
    fd: c_int,
    offset: libc::off_t,
    len: libc::off_t,
    advice: c_int,
) -> c_int {
    let real = real!("posix_fadvise64": FadviseFn);
    // SAFETY: the caller's arguments are passed on unchanged.
    tracked_fadvise(fd, advice, || unsafe { real(fd, offset, len, advice) })
}

/// Runs when the shim is loaded: with `FAULTFS_REBOOT=1`, applies every pending undo.
extern "C" fn on_load() {
    if std::env::var_os("FAULTFS_REBOOT").is_none_or(|v| v != "1") {
        return;
    }
    guarded(|| {
        let Some(path) = std::env::var_os("FAULTFS_STATE").map(PathBuf::from) else {
            eprintln!("faultfs: FAULTFS_REBOOT needs FAULTFS_STATE");
            return;
        };
        let Some((fired, pending)) = load(&path) else {
            eprintln!("faultfs: reboot: no state file {}", path.display());
            return;
        };
        apply(&pending, true);
        let bytes: usize = pending.iter().map(|u| u.old.len()).sum();
        eprintln!(
            "faultfs: reboot: {} undos ({bytes} bytes) applied",
            pending.len()
        );
        let mut out = MAGIC.to_vec();
        out.push(u8::from(fired));
        out.extend_from_slice(&0u32.to_le_bytes());
        if std::fs::write(&path, out).is_err() {
            eprintln!("faultfs: cannot write state file {}", path.display());
        }
    });
}

#[used]
#[unsafe(link_section = ".init_array")]
static ON_LOAD: extern "C" fn() = on_load;
