//! The layout of a tiered segment object: which bytes of the object hold which of Kafka's segment
//! files. Storage reads sections by it ([`SegmentLayout::range`]), the coordinator stores it with
//! each segment's row (so that a read never needs the trailer), and the segment builder produces it;
//! the byte formats of the sections themselves are `diskless_core::tiered::format`'s.

use std::ops::Range;

/// One section of a segment object, in object order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Section {
    /// The `.log`: record batches.
    Log,
    /// The `.index` (offset index).
    OffsetIndex,
    /// The `.timeindex`.
    TimeIndex,
    /// The `.txnindex` (aborted transactions; may be empty).
    TxnIndex,
    /// The producer-state `.snapshot` (may be empty).
    ProducerSnapshot,
    /// The `leader-epoch-checkpoint`.
    LeaderEpochs,
    /// The 80-byte trailer.
    Trailer,
}

impl Section {
    /// Every section, in object order.
    pub const ALL: [Section; 7] = [
        Section::Log,
        Section::OffsetIndex,
        Section::TimeIndex,
        Section::TxnIndex,
        Section::ProducerSnapshot,
        Section::LeaderEpochs,
        Section::Trailer,
    ];
}

/// The sizes of a tiered segment object's sections: the `.log` starts at byte 0, the others follow
/// in [`Section`] order, then the [`SegmentLayout::TRAILER_LEN`]-byte trailer. A plain value: the
/// segment builder and `RemoteStorage::copy_segment` (`diskless-storage`) make it, the coordinator
/// stores it in each segment's row (`TieredSegment::layout`, `diskless-coordinator`), and reads of
/// the sections go by it.
///
/// ```
/// use diskless_common::{Section, SegmentLayout};
/// let layout = SegmentLayout { log: 100, offset_index: 8, time_index: 12, ..Default::default() };
/// assert_eq!(layout.range(Section::Log), 0..100);
/// assert_eq!(layout.range(Section::TimeIndex), 108..120);
/// assert_eq!(layout.range(Section::TxnIndex), 120..120); // empty
/// assert_eq!(layout.range(Section::Trailer), 120..200);
/// assert_eq!(layout.object_size(), 200);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SegmentLayout {
    /// `.log` bytes (at most [`SegmentLayout::MAX_LOG_LEN`]: Kafka's positions in a segment are
    /// `int`s): the segment's batches, back to back.
    pub log: u64,
    /// `.index` bytes.
    pub offset_index: u32,
    /// `.timeindex` bytes.
    pub time_index: u32,
    /// `.txnindex` bytes (0: no aborted transaction).
    pub txn_index: u32,
    /// Producer-state `.snapshot` bytes.
    pub producer_snapshot: u32,
    /// `leader-epoch-checkpoint` bytes.
    pub leader_epochs: u32,
}

impl SegmentLayout {
    /// The trailer's size: every segment object ends with it.
    pub const TRAILER_LEN: u64 = 80;

    /// The largest `.log` (`i32::MAX`: positions in a segment are Kafka `int`s).
    pub const MAX_LOG_LEN: u64 = i32::MAX as u64;

    /// The size of `section`.
    pub fn size(&self, section: Section) -> u64 {
        match section {
            Section::Log => self.log,
            Section::OffsetIndex => u64::from(self.offset_index),
            Section::TimeIndex => u64::from(self.time_index),
            Section::TxnIndex => u64::from(self.txn_index),
            Section::ProducerSnapshot => u64::from(self.producer_snapshot),
            Section::LeaderEpochs => u64::from(self.leader_epochs),
            Section::Trailer => Self::TRAILER_LEN,
        }
    }

    /// The byte range of `section` in the object (empty for an empty section; saturating).
    pub fn range(&self, section: Section) -> Range<u64> {
        let start = Section::ALL
            .iter()
            .take_while(|s| **s != section)
            .fold(0u64, |start, s| start.saturating_add(self.size(*s)));
        start..start.saturating_add(self.size(section))
    }

    /// The object's size: all sections and the trailer (saturating).
    pub fn object_size(&self) -> u64 {
        self.range(Section::Trailer).end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_tile_the_object() {
        let layout = SegmentLayout {
            log: 1000,
            offset_index: 80,
            time_index: 120,
            txn_index: 0,
            producer_snapshot: 33,
            leader_epochs: 9,
        };
        let mut next = 0;
        for section in Section::ALL {
            let range = layout.range(section);
            assert_eq!(range.start, next, "{section:?}");
            assert_eq!(range.end - range.start, layout.size(section), "{section:?}");
            next = range.end;
        }
        assert_eq!(next, 1000 + 80 + 120 + 33 + 9 + 80);
        assert_eq!(layout.object_size(), next);
    }

    #[test]
    fn sizes_saturate() {
        let layout = SegmentLayout {
            log: u64::MAX - 10,
            offset_index: 100,
            ..Default::default()
        };
        assert_eq!(layout.object_size(), u64::MAX);
        assert_eq!(layout.range(Section::Trailer), u64::MAX..u64::MAX);
    }
}
