//! The flash image file: probing its geometry, creating and formatting it, opening it.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use spillway_core::log::format::{JOURNAL_BLOCKS, SEGMENT_HEADER_LEN, SegmentHeader};
use spillway_core::log::{Log, MIN_ERASE_SIZE};
use spillway_core::storage::{FileFlash, FileFlashError, Flash, Geometry};

use super::AppError;
use super::config::{DEFAULT_ERASE, DEFAULT_WRITE, Settings};

/// Largest erase size probed, bytes.
const MAX_PROBE_ERASE: u32 = 16 << 20;

/// Segment headers tried per candidate erase size while probing.
const PROBE_SEGMENTS: u64 = 64;

/// Reads the geometry of an existing image from its segment headers (no lock taken).
/// Returns the header found, or `None` if no valid header is at any candidate position.
pub fn probe(path: &Path) -> Result<Option<SegmentHeader>, AppError> {
    let file = File::open(path)
        .map_err(|e| AppError::Image(format!("cannot open {}: {e}", path.display())))?;
    let len = file
        .metadata()
        .map_err(|e| AppError::Image(format!("cannot stat {}: {e}", path.display())))?
        .len();
    let mut erase = MIN_ERASE_SIZE;
    while erase <= MAX_PROBE_ERASE && u64::from(erase) * 4 <= len {
        let blocks = len / u64::from(erase);
        for k in 0..PROBE_SEGMENTS.min(blocks.saturating_sub(u64::from(JOURNAL_BLOCKS))) {
            let at = (u64::from(JOURNAL_BLOCKS) + k) * u64::from(erase);
            let mut hb = [0u8; SEGMENT_HEADER_LEN];
            if file.read_exact_at(&mut hb, at).is_err() {
                break;
            }
            if let Some(h) = SegmentHeader::decode(&hb)
                && h.erase_size == erase
            {
                return Ok(Some(h));
            }
        }
        erase *= 2;
    }
    Ok(None)
}

fn flash_err(e: FileFlashError) -> AppError {
    match e {
        FileFlashError::Locked { .. } => {
            AppError::Image(format!("{e} (is another gateway running on it?)"))
        }
        other => AppError::Image(other.to_string()),
    }
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
        let h = probe(path)?.ok_or_else(|| {
            AppError::Image(format!(
                "{} is not a Spillway image (no valid segment header found)",
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
    /// Opens `path` read-only (shared lock) with the geometry of header `h`.
    pub fn open(path: &Path, h: &SegmentHeader) -> Result<Self, AppError> {
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
