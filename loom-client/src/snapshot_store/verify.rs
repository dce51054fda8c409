//! Verifying stored frames: every frame a store holds decoded, a page of
//! rows at a time, and the rows that do not decode listed with the typed
//! cause. Nothing is ever written: a row that cannot be read is left as
//! it is, for an operator to restore or delete knowingly (`loom repair
//! --verify-frames`).

use pgloom_core::frame::DecodeFrameError;

use crate::event_store::check_limit;
use crate::Result;

/// A stored frame that does not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnreadableFrame {
    /// The snapshot row's id.
    pub id: i64,
    /// Its execution.
    pub execution_id: String,
    /// Its sequence.
    pub sequence: i64,
    /// Why it does not decode.
    pub cause: DecodeFrameError,
}

/// How far a verification has got; at the end, what it found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FrameCheck {
    /// Snapshot rows holding a frame, read so far.
    pub frames: u64,
    /// Those that do not decode.
    pub unreadable: Vec<UnreadableFrame>,
}

/// One stored frame as a page returns it: id, execution, sequence, bytes.
/// A stored frame: its row's id, execution and sequence, the frame, and
/// the frame of the keyframe it names if it is a delta.
pub(crate) type StoredFrame = (i64, String, i64, Vec<u8>, Option<Vec<u8>>);

/// Pages through the frames with `page(after_id)` (up to `batch_size`
/// rows with an id above `after_id`, in id order), decoding each, calling
/// `on_progress` after each page. Bounded memory: one page of frames and one decoded
/// state at a time, plus the list of unreadable rows.
pub(crate) async fn verify_pages<F, Fut>(
    batch_size: usize,
    mut page: F,
    mut on_progress: impl FnMut(&FrameCheck),
) -> Result<FrameCheck>
where
    F: FnMut(i64) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<StoredFrame>>>,
{
    check_limit(batch_size)?;
    let mut check = FrameCheck::default();
    let mut after = i64::MIN;
    loop {
        let rows = page(after).await?;
        let full = rows.len() == batch_size;
        for (id, execution_id, sequence, bytes, base) in rows {
            after = id;
            check.frames += 1;
            if let Err(cause) = crate::telemetry::decode_frame(&bytes, base.as_deref()) {
                check.unreadable.push(UnreadableFrame {
                    id,
                    execution_id,
                    sequence,
                    cause,
                });
            }
        }
        on_progress(&check);
        if !full {
            return Ok(check);
        }
    }
}
