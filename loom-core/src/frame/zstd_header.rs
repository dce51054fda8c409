//! Walks a zstd frame's header and block headers (RFC 8878 section 3.1.1)
//! without inflating anything.
//!
//! This is what lets the decoder refuse a hostile frame before it allocates:
//! a 19 KB frame can declare 600 MiB, and a frame can be followed by a
//! second one that the zstd library would otherwise decode and append
//! silently. Cost: O(blocks), a few bytes read per 128 KiB block.

use super::{DecodeFrameError, TrailingKind};
use crate::interrupt::Ticker;

const ZSTD_MAGIC: u32 = 0xFD2F_B528;
/// Skippable frames use the magics 0x184D2A50 ..= 0x184D2A5F.
const SKIPPABLE_MAGIC: u32 = 0x184D_2A50;
const SKIPPABLE_MASK: u32 = 0xFFFF_FFF0;
/// No block regenerates more than this (RFC 8878 3.1.1.2.3).
const MAX_BLOCK_BYTES: u64 = 128 * 1024;

/// What a zstd frame's headers say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ZstdHeader {
    /// Frame_Content_Size, when the frame declares it.
    pub content_size: Option<u64>,
    /// Window_Size, unless the frame is single-segment (its window is then
    /// its content).
    pub window_size: Option<u64>,
    pub has_checksum: bool,
    /// Dictionary_ID, 0 when the frame names none.
    pub dictionary_id: u32,
    /// The most the blocks can regenerate, summed from their headers.
    pub max_output: u64,
    /// Where the first block header starts.
    pub blocks_start: usize,
    /// The most one block regenerates: min(window, 128 KiB).
    pub block_ceiling: u64,
}

impl ZstdHeader {
    /// The policy checks that make a zstd frame a loom frame, in the order
    /// that refuses the cheapest-to-detect, most dangerous cause first.
    #[cfg(feature = "zstd")]
    pub fn check_is_loom_frame(&self) -> Result<(), DecodeFrameError> {
        if let Some(declared) = self.content_size {
            if declared > super::MAX_DECODED_STATE_BYTES {
                return Err(DecodeFrameError::StateTooLarge {
                    declared: Some(declared),
                    limit: super::MAX_DECODED_STATE_BYTES,
                });
            }
            if declared > self.max_output {
                return Err(DecodeFrameError::Corrupt {
                    reason: format!(
                        "the frame declares {declared} bytes but its blocks can hold at most {}",
                        self.max_output
                    ),
                });
            }
        }
        // Only a frame that declares no size is inflated by streaming,
        // which allocates a window buffer of this size outside any memory
        // accounting (a Postgres backend's included).
        if let (None, Some(window)) = (self.content_size, self.window_size) {
            if window > super::MAX_UNDECLARED_WINDOW_BYTES {
                return Err(DecodeFrameError::WindowTooLarge {
                    window,
                    limit: super::MAX_UNDECLARED_WINDOW_BYTES,
                });
            }
        }
        if self.dictionary_id != 0 {
            return Err(DecodeFrameError::DictionaryRequired {
                id: self.dictionary_id,
            });
        }
        if !self.has_checksum {
            return Err(DecodeFrameError::MissingChecksum);
        }
        Ok(())
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, inside: &'static str) -> Result<&'a [u8], DecodeFrameError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len());
        let end = end.ok_or(DecodeFrameError::Truncated { inside })?;
        let taken = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(taken)
    }

    fn little_endian(&mut self, n: usize, inside: &'static str) -> Result<u64, DecodeFrameError> {
        let bytes = self.take(n, inside)?;
        Ok(bytes
            .iter()
            .rev()
            .fold(0, |acc, &b| (acc << 8) | u64::from(b)))
    }
}

fn magic_of(bytes: &[u8]) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?))
}

/// Walks one zstd frame that must span all of `payload`.
pub(crate) fn walk(payload: &[u8]) -> Result<ZstdHeader, DecodeFrameError> {
    let mut r = Reader {
        bytes: payload,
        pos: 0,
    };
    let magic = r.little_endian(4, "the zstd magic number")? as u32;
    if magic & SKIPPABLE_MASK == SKIPPABLE_MAGIC {
        return Err(DecodeFrameError::NotZstd {
            found: "a skippable frame",
        });
    }
    if magic != ZSTD_MAGIC {
        return Err(DecodeFrameError::NotZstd {
            found: "no zstd magic number",
        });
    }

    let descriptor = r.take(1, "the zstd frame header")?[0];
    let size_flag = descriptor >> 6;
    let single_segment = descriptor & 0x20 != 0;
    let has_checksum = descriptor & 0x04 != 0;
    if descriptor & 0x08 != 0 {
        return Err(DecodeFrameError::Corrupt {
            reason: "the zstd frame header sets its reserved bit".to_owned(),
        });
    }
    let window_size = if single_segment {
        None
    } else {
        let descriptor = r.take(1, "the zstd frame header")?[0];
        let exponent = u32::from(descriptor >> 3);
        let base = 1u64 << (10 + exponent);
        Some(base + (base / 8) * u64::from(descriptor & 7))
    };
    let dictionary_id = match descriptor & 3 {
        0 => 0,
        flag => r.little_endian(1 << (flag - 1), "the zstd frame header")? as u32,
    };
    let content_size = match (size_flag, single_segment) {
        (0, false) => None,
        (0, true) => Some(r.little_endian(1, "the zstd frame header")?),
        (1, _) => Some(r.little_endian(2, "the zstd frame header")? + 256),
        (2, _) => Some(r.little_endian(4, "the zstd frame header")?),
        _ => Some(r.little_endian(8, "the zstd frame header")?),
    };
    // A single-segment frame's window is its whole content.
    let block_ceiling = window_size
        .or(content_size)
        .unwrap_or(MAX_BLOCK_BYTES)
        .min(MAX_BLOCK_BYTES);

    let blocks_start = r.pos;
    let mut blocks = Blocks {
        r,
        ceiling: block_ceiling,
        done: false,
    };
    let mut max_output: u64 = 0;
    // O(blocks), but a frame can be a gigabyte of empty 3-byte blocks.
    let mut ticker = Ticker::starting_at(0);
    for block in &mut blocks {
        let block = block?;
        max_output = max_output.saturating_add(block.regenerated);
        ticker.at(block.end);
    }
    let mut r = blocks.r;
    if has_checksum {
        r.take(4, "the content checksum")?;
    }
    let rest = &payload[r.pos..];
    if !rest.is_empty() {
        let kind = match magic_of(rest) {
            Some(ZSTD_MAGIC) => TrailingKind::ZstdFrame,
            Some(m) if m & SKIPPABLE_MASK == SKIPPABLE_MAGIC => TrailingKind::SkippableFrame,
            _ => TrailingKind::Bytes,
        };
        return Err(DecodeFrameError::TrailingBytes {
            kind,
            offset: r.pos,
            count: rest.len(),
        });
    }
    Ok(ZstdHeader {
        content_size,
        window_size,
        has_checksum,
        dictionary_id,
        max_output,
        blocks_start,
        block_ceiling,
    })
}

/// One block, as its header describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Block {
    /// Where the block ends in the payload: its header and content read.
    pub end: usize,
    /// The most it regenerates.
    pub regenerated: u64,
    /// Whether it is the frame's last.
    pub last: bool,
}

/// The blocks of a zstd frame, read from their headers: what [`walk`]
/// checks, and how inflating feeds a frame a few blocks at a time.
pub(crate) struct Blocks<'a> {
    r: Reader<'a>,
    ceiling: u64,
    done: bool,
}

impl<'a> Blocks<'a> {
    /// The blocks of `payload`, whose headers [`walk`] read into `header`.
    #[cfg(feature = "zstd")]
    pub(crate) fn of(payload: &'a [u8], header: &ZstdHeader) -> Self {
        Blocks {
            r: Reader {
                bytes: payload,
                pos: header.blocks_start,
            },
            ceiling: header.block_ceiling,
            done: false,
        }
    }
}

impl Iterator for Blocks<'_> {
    type Item = Result<Block, DecodeFrameError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let block = self.read();
        // After the last block, or a broken one, there are no more.
        self.done = block.as_ref().map_or(true, |block| block.last);
        Some(block)
    }
}

impl Blocks<'_> {
    fn read(&mut self) -> Result<Block, DecodeFrameError> {
        let r = &mut self.r;
        let header = r.little_endian(3, "a block header")?;
        let last = header & 1 != 0;
        let size = header >> 3;
        let (stored, regenerated) = match (header >> 1) & 3 {
            0 => (size, size),
            1 => (1, size),
            2 => (size, self.ceiling),
            _ => {
                return Err(DecodeFrameError::Corrupt {
                    reason: "a zstd block has the reserved block type".to_owned(),
                })
            }
        };
        // RFC 8878 3.1.1.2.3: no block exceeds min(window, 128 KiB).
        // Checked here rather than left to zstd, whose streaming decoder
        // judges it by buffer sizes a previous frame may have left.
        if size > self.ceiling {
            return Err(DecodeFrameError::Corrupt {
                reason: format!(
                    "a zstd block claims {size} bytes, over the frame's {}-byte block limit",
                    self.ceiling
                ),
            });
        }
        r.take(stored as usize, "a block")?;
        Ok(Block {
            end: r.pos,
            regenerated,
            last,
        })
    }
}
