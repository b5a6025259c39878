//! The flash image file: probing its geometry, creating and formatting it, opening it.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use spillway_core::log::format::{JOURNAL_BLOCKS, SEGMENT_HEADER_LEN, SegmentHeader};
use spillway_core::log::{Log, MAX_JOURNAL_ENTRY_LEN, MIN_ERASE_SIZE, journal_geometry};
use spillway_core::storage::{FileFlash, FileFlashError, Flash, Geometry};

use super::AppError;
use super::config::{DEFAULT_ERASE, DEFAULT_WRITE, Settings};

/// Largest erase size probed, bytes.
const MAX_PROBE_ERASE: u32 = 16 << 20;

/// The geometry of an existing image, as its journal or a segment header records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probed {
    /// Erase block size, bytes.
    pub erase_size: u32,
    /// Write granularity, bytes.
    pub write_size: u32,
    /// The erased value.
    pub erased: u8,
    /// Erase blocks per segment.
    pub blocks_per_segment: u32,
}

/// Whether `erase` is an erase size an image of `len` bytes can have.
fn plausible_erase(erase: u32, len: u64) -> bool {
    erase.is_power_of_two()
        && (MIN_ERASE_SIZE..=MAX_PROBE_ERASE).contains(&erase)
        && u64::from(erase) * 4 <= len
        && len.is_multiple_of(u64::from(erase))
}

/// Whether `erase` is an erase size the probe considers, whatever the image's length.
fn probed_erase(erase: u32) -> bool {
    erase.is_power_of_two() && (MIN_ERASE_SIZE..=MAX_PROBE_ERASE).contains(&erase)
}

/// The error for an image shorter than its own geometry says: `found` names what said it.
fn truncated(path: &Path, len: u64, found: &str, expected: Option<u64>) -> AppError {
    let expected = match expected {
        Some(e) => format!(", and its segments need {e} bytes"),
        None => String::new(),
    };
    AppError::Image(format!(
        "{} is truncated: {found}, but the file is {len} bytes{expected}; the image was cut short (a partial copy or a full disk?): copy it again whole, an image is never extended or reformatted",
        path.display()
    ))
}

/// The length in bytes the segment headers of the image `read` give (the journal's two
/// blocks and `segment_count` segments), from the first one that decodes with the
/// geometry `p` at a segment start within `len` bytes; `None` if none does.
fn length_from_segments(
    read: impl Fn(u64, &mut [u8]) -> usize,
    len: u64,
    p: &Probed,
) -> Option<u64> {
    let seg = u64::from(p.erase_size) * u64::from(p.blocks_per_segment);
    let mut at = u64::from(JOURNAL_BLOCKS) * u64::from(p.erase_size);
    while at + SEGMENT_HEADER_LEN as u64 <= len {
        let mut hb = [0u8; SEGMENT_HEADER_LEN];
        if read(at, &mut hb) == SEGMENT_HEADER_LEN
            && let Some(h) = SegmentHeader::decode(&hb)
            && h.erase_size == p.erase_size
            && h.blocks_per_segment == p.blocks_per_segment
        {
            return u64::from(h.segment_count)
                .checked_mul(seg)?
                .checked_add(u64::from(JOURNAL_BLOCKS) * u64::from(p.erase_size));
        }
        at += seg;
    }
    None
}

/// Reads the geometry of an existing image (no lock taken): from the journal first (the
/// first entry of block 0, at offset 0, or of block 1, at one erase size, for every
/// candidate erase size), else from the first valid segment header found at an erase
/// block start where a segment of its own geometry begins. No single erase block outside
/// the journal's two decides: a damaged first segment leaves the others to tell.
/// `None` if neither the journal nor any segment header is found.
///
/// # Errors
/// [`AppError::Image`] when the image cannot be read, or is shorter than its geometry says
/// (not a whole number of the erase blocks its journal or segment headers name, or fewer
/// bytes than its segment headers' segment count needs): a truncated image, named so.
pub fn probe(path: &Path) -> Result<Option<Probed>, AppError> {
    let file = File::open(path)
        .map_err(|e| AppError::Image(format!("cannot open {}: {e}", path.display())))?;
    let meta = file
        .metadata()
        .map_err(|e| AppError::Image(format!("cannot stat {}: {e}", path.display())))?;
    if meta.is_dir() {
        return Err(AppError::Image(format!(
            "{} is a directory: --image names the flash image file (e.g. {})",
            path.display(),
            path.join("gw.img").display()
        )));
    }
    let len = meta.len();
    let read = |at: u64, buf: &mut [u8]| -> usize {
        let n = (len.saturating_sub(at) as usize).min(buf.len());
        if file.read_exact_at(&mut buf[..n], at).is_err() {
            return 0;
        }
        n
    };
    // A geometry found: the image must hold every segment its headers count.
    let whole = |p: Probed| -> Result<Option<Probed>, AppError> {
        match length_from_segments(read, len, &p) {
            Some(expected) if expected > len => Err(truncated(
                path,
                len,
                &format!(
                    "its segments are {} erase blocks of {} bytes",
                    p.blocks_per_segment, p.erase_size
                ),
                Some(expected),
            )),
            _ => Ok(Some(p)),
        }
    };
    // An entry or header that decodes but names an erase size the length does not fit:
    // the image was cut short (reported if nothing fits).
    let mut cut: Option<String> = None;
    // 1. The journal's two blocks.
    let mut best: Option<(u64, Probed)> = None;
    let mut entry = vec![0u8; MAX_JOURNAL_ENTRY_LEN];
    let mut consider = |at: u64, want_erase: Option<u32>, best: &mut Option<(u64, Probed)>| {
        let n = read(at, &mut entry);
        let Some(j) = journal_geometry(&entry[..n]) else {
            return;
        };
        if want_erase.is_some_and(|e| e != j.erase_size) || j.blocks_per_segment == 0 {
            return;
        }
        if !plausible_erase(j.erase_size, len) {
            if probed_erase(j.erase_size) && cut.is_none() {
                cut = Some(format!(
                    "its journal names erase blocks of {} bytes (at least 4, a whole number of them)",
                    j.erase_size
                ));
            }
            return;
        }
        if best.as_ref().is_none_or(|b| j.seq > b.0) {
            *best = Some((
                j.seq,
                Probed {
                    erase_size: j.erase_size,
                    write_size: j.write_size,
                    erased: j.erased,
                    blocks_per_segment: j.blocks_per_segment,
                },
            ));
        }
    };
    consider(0, None, &mut best);
    let mut erase = MIN_ERASE_SIZE;
    while erase <= MAX_PROBE_ERASE && u64::from(erase) * 4 <= len {
        consider(u64::from(erase), Some(erase), &mut best);
        erase *= 2;
    }
    if let Some((_, p)) = best {
        return whole(p);
    }
    // 2. Segment headers, at every candidate erase block start over the first sixteenth
    // of the image (the first segments of any layout `run` creates) plus two of the
    // largest erase blocks.
    let limit = len.min(len / 16 + 2 * u64::from(MAX_PROBE_ERASE) + u64::from(MAX_PROBE_ERASE));
    let mut at = u64::from(JOURNAL_BLOCKS) * u64::from(MIN_ERASE_SIZE);
    while at + SEGMENT_HEADER_LEN as u64 <= limit {
        let mut hb = [0u8; SEGMENT_HEADER_LEN];
        if read(at, &mut hb) == SEGMENT_HEADER_LEN
            && let Some(h) = SegmentHeader::decode(&hb)
            && probed_erase(h.erase_size)
            && h.blocks_per_segment > 0
            && at.is_multiple_of(u64::from(h.erase_size))
        {
            let block = at / u64::from(h.erase_size);
            if block >= u64::from(JOURNAL_BLOCKS)
                && (block - u64::from(JOURNAL_BLOCKS))
                    .is_multiple_of(u64::from(h.blocks_per_segment))
            {
                if !plausible_erase(h.erase_size, len) {
                    cut.get_or_insert_with(|| {
                        format!(
                            "its segment headers name erase blocks of {} bytes (at least 4, a whole number of them)",
                            h.erase_size
                        )
                    });
                } else {
                    return whole(Probed {
                        erase_size: h.erase_size,
                        write_size: h.write_size,
                        erased: h.erased,
                        blocks_per_segment: h.blocks_per_segment,
                    });
                }
            }
        }
        at += u64::from(MIN_ERASE_SIZE);
    }
    match cut {
        Some(found) => Err(truncated(path, len, &found, None)),
        None => Ok(None),
    }
}

/// Maps an image error to its exit code: a failed read, write, erase or sync of a usable
/// image is a run-time storage failure (exit 1, so a supervisor restarts the gateway and it
/// reads the disk again); an image that cannot be opened, locked or created is unusable
/// (exit 3). The message keeps the OS reason.
pub(super) fn flash_err(e: FileFlashError) -> AppError {
    match &e {
        FileFlashError::Locked { path } => AppError::Image(locked_message(path)),
        FileFlashError::Io { op, .. } if matches!(*op, "open" | "create" | "lock") => {
            AppError::Image(with_reasons(&e))
        }
        FileFlashError::Io { .. } | FileFlashError::Poisoned { .. } => {
            AppError::Runtime(with_reasons(&e))
        }
        _ => AppError::Image(with_reasons(&e)),
    }
}

/// What to say of an image locked by another open: the process that holds the lock, when
/// `/proc/locks` tells.
pub(super) fn locked_message(path: &Path) -> String {
    let holder = lock_holder(path).map_or_else(
        || "another process (is another gateway running on it?)".to_string(),
        |(pid, name)| match name {
            Some(name) => format!("process {pid} ({name})"),
            None => format!("process {pid}"),
        },
    );
    format!(
        "flash image {} is locked by {holder}: stop it first, or inspect a copy",
        path.display()
    )
}

/// The process id (and its command name, if readable) holding a `flock` on `path`, read
/// from `/proc/locks` (`ID: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE ...`, the device
/// numbers in hex). `None` when the file or the lock is not found there.
pub(super) fn lock_holder(path: &Path) -> Option<(u32, Option<String>)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    let dev = meta.dev();
    let (major, minor) = (
        ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff),
        (dev & 0xff) | ((dev >> 12) & !0xff),
    );
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let me = std::process::id();
    locks.lines().find_map(|line| {
        let words: Vec<&str> = line.split_whitespace().collect();
        // A blocked waiter's line has an extra "->" word; only holders are wanted.
        if words.get(1) != Some(&"FLOCK") {
            return None;
        }
        let pid: u32 = words.get(4)?.parse().ok()?;
        let mut id = words.get(5)?.split(':');
        let maj = u64::from_str_radix(id.next()?, 16).ok()?;
        let min = u64::from_str_radix(id.next()?, 16).ok()?;
        let ino: u64 = id.next()?.parse().ok()?;
        if (maj, min, ino) != (major, minor, meta.ino()) || pid == me {
            return None;
        }
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty());
        Some((pid, name))
    })
}

/// Whether another open holds a lock on the image at `path` (checked with a shared lock
/// taken and released at once, so that a locked image is reported as locked before any
/// other check of it).
pub(super) fn is_locked(path: &Path) -> bool {
    let Ok(f) = File::open(path) else {
        return false;
    };
    match f.try_lock_shared() {
        Ok(()) => {
            let _ = f.unlock();
            false
        }
        Err(std::fs::TryLockError::WouldBlock) => true,
        Err(std::fs::TryLockError::Error(_)) => false,
    }
}

/// `error: its source: the source's source…`, so an OS reason is never dropped.
pub(super) fn with_reasons(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let text = s.to_string();
        if !msg.ends_with(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        next = s.source();
    }
    msg
}

/// Blocks per segment for a new image: about 64 segments, each at least twice the RAM
/// buffer, at least 2 segments.
pub(crate) fn blocks_per_segment(geo: &Geometry, buffer_bytes: usize) -> Result<u32, AppError> {
    let data_blocks = geo.blocks().saturating_sub(JOURNAL_BLOCKS);
    let by_count = (data_blocks / 64).max(1);
    let by_buffer = ((buffer_bytes as u64 * 2).div_ceil(u64::from(geo.erase_size))) as u32;
    let bps = by_count.max(by_buffer).max(1);
    if data_blocks / bps < 2 {
        return Err(AppError::Usage(format!(
            "image of {} bytes is too small for a {buffer_bytes} byte buffer: at least 2 segments of {} erase blocks are needed (lower --buffer-bytes or raise --size)",
            geo.capacity, bps
        )));
    }
    Ok(bps)
}

/// Checks an existing image against the settings without changing it: it is a Spillway
/// image, and every geometry flag given (`--erase-size`, `--write-size`, `--size`) agrees
/// with it. Returns its probed geometry. (`spillway validate` and `spillway run`.)
///
/// # Errors
/// [`AppError::Image`] naming the image and each disagreement, or why it cannot be read.
pub fn check_existing(s: &Settings) -> Result<Probed, AppError> {
    let path = &s.image;
    let h = probe(path)?.ok_or_else(|| {
        AppError::Image(format!(
            "{} is not a Spillway image (no valid journal entry or segment header found)",
            path.display()
        ))
    })?;
    let len = std::fs::metadata(path)
        .map_err(|e| AppError::Image(format!("cannot stat {}: {e}", path.display())))?
        .len();
    let mut mismatch = Vec::new();
    if let Some(e) = s.erase_size
        && e != h.erase_size
    {
        mismatch.push(format!("erase size {e} (image: {})", h.erase_size));
    }
    if let Some(w) = s.write_size
        && w != h.write_size
    {
        mismatch.push(format!("write size {w} (image: {})", h.write_size));
    }
    if s.size_given && s.size != len {
        mismatch.push(format!("size {} (image: {len})", s.size));
    }
    if !mismatch.is_empty() {
        return Err(AppError::Image(format!(
            "{}: geometry disagrees with the image: {}; an existing image is never reformatted",
            path.display(),
            mismatch.join(", ")
        )));
    }
    Ok(h)
}

/// Opens the image for the gateway: mounts an existing one as it is (after checking any
/// geometry flags against it), or creates, preallocates and formats a new one with a
/// random log id. Returns the flash, whether it was created, and the erase blocks per
/// segment.
///
/// A new image is built and formatted aside (`.NAME.creating` in the image's directory),
/// synced, then renamed into place, so an interrupted creation never leaves a partial
/// image; what such an interruption left aside is removed first. `cancel` (set by SIGTERM
/// or SIGINT) stops a creation in progress: the file aside is removed and
/// [`AppError::Stopped`] returned.
pub fn open_or_create(
    s: &Settings,
    cancel: &AtomicBool,
) -> Result<(FileFlash, bool, u32), AppError> {
    let path = &s.image;
    match FileFlash::remove_aside(path) {
        Ok(true) => log::warn!(
            "removed {}, left by an interrupted creation of the image",
            FileFlash::aside_path(path).display()
        ),
        Ok(false) => {}
        Err(e) => return Err(flash_err(e)),
    }
    if path.exists() {
        // A locked image is reported as locked, whatever else is wrong with the flags.
        if is_locked(path) {
            return Err(AppError::Image(locked_message(path)));
        }
        let h = check_existing(s)?;
        let flash =
            FileFlash::open(path, h.erase_size, h.write_size, h.erased).map_err(flash_err)?;
        return Ok((flash, false, h.blocks_per_segment.max(1)));
    }
    let geo = Geometry {
        erase_size: s.erase_size.unwrap_or(DEFAULT_ERASE),
        write_size: s.write_size.unwrap_or(DEFAULT_WRITE),
        capacity: u32::try_from(s.size)
            .map_err(|_| AppError::Usage("--size must be below 4G".into()))?,
        erased: 0xFF,
    };
    let bps = blocks_per_segment(&geo, s.buffer_bytes)?;
    log::info!(
        "creating image {} ({} bytes) aside at {}",
        path.display(),
        geo.capacity,
        FileFlash::aside_path(path).display()
    );
    let mut flash = match FileFlash::create_aside(path, geo, cancel) {
        Ok(f) => f,
        Err(FileFlashError::Cancelled { .. }) => {
            return Err(AppError::Stopped(format!(
                "stopped while creating {}; the partial image was removed",
                path.display()
            )));
        }
        Err(e) => return Err(flash_err(e)),
    };
    let log_id: u128 = rand::random();
    let formatted = Log::format(&mut flash, log_id, bps)
        .map_err(|e| AppError::Image(format!("cannot format {}: {e}", path.display())))
        .and_then(|()| flash.install(path).map_err(flash_err));
    if let Err(e) = formatted {
        drop(flash);
        let _ = std::fs::remove_file(FileFlash::aside_path(path));
        return Err(e);
    }
    log::info!(
        "created image {} ({} bytes, erase {} B, write {} B, log id {:032x})",
        path.display(),
        geo.capacity,
        geo.erase_size,
        geo.write_size,
        log_id
    );
    Ok((flash, true, bps))
}

/// A read-only image with a RAM overlay for writes, so that `inspect` can mount it (mount
/// writes a journal entry) without changing a byte of the file.
pub struct Overlay {
    base: FileFlash,
    blocks: HashMap<u32, Vec<u8>>,
}

impl Overlay {
    /// Opens `path` read-only (shared lock) with the geometry `h` probed from it.
    pub fn open(path: &Path, h: &Probed) -> Result<Self, AppError> {
        let base = FileFlash::open_read_only(path, h.erase_size, h.write_size, h.erased)
            .map_err(flash_err)?;
        Ok(Overlay {
            base,
            blocks: HashMap::new(),
        })
    }

    fn block_of(&mut self, block: u32) -> Result<&mut Vec<u8>, FileFlashError> {
        let e = self.base.geometry().erase_size;
        if !self.blocks.contains_key(&block) {
            let mut b = vec![0u8; e as usize];
            self.base.read(block * e, &mut b)?;
            self.blocks.insert(block, b);
        }
        Ok(self.blocks.get_mut(&block).expect("inserted above"))
    }
}

impl Flash for Overlay {
    type Error = FileFlashError;
    fn geometry(&self) -> Geometry {
        self.base.geometry()
    }
    fn read(&mut self, addr: u32, buf: &mut [u8]) -> Result<(), Self::Error> {
        let e = self.base.geometry().erase_size;
        let mut done = 0usize;
        while done < buf.len() {
            let a = addr + done as u32;
            let block = a / e;
            let inblock = (a % e) as usize;
            let n = (buf.len() - done).min(e as usize - inblock);
            match self.blocks.get(&block) {
                Some(b) => buf[done..done + n].copy_from_slice(&b[inblock..inblock + n]),
                None => self.base.read(a, &mut buf[done..done + n])?,
            }
            done += n;
        }
        Ok(())
    }
    fn write(&mut self, addr: u32, data: &[u8]) -> Result<(), Self::Error> {
        let e = self.base.geometry().erase_size;
        let mut done = 0usize;
        while done < data.len() {
            let a = addr + done as u32;
            let inblock = (a % e) as usize;
            let n = (data.len() - done).min(e as usize - inblock);
            let b = self.block_of(a / e)?;
            for (dst, src) in b[inblock..inblock + n]
                .iter_mut()
                .zip(&data[done..done + n])
            {
                *dst &= *src;
            }
            done += n;
        }
        Ok(())
    }
    fn erase(&mut self, block: u32) -> Result<(), Self::Error> {
        let g = self.base.geometry();
        self.blocks
            .insert(block, vec![g.erased; g.erase_size as usize]);
        Ok(())
    }
    fn sync(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}
