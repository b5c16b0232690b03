//! Tiered segments (issue #15, docs/tiered-consolidation.md): not implemented by the PostgreSQL
//! coordinator yet. Every tiering call is refused with [`CoordinatorError::InvalidRequest`], so a
//! consolidation worker over this coordinator stops at its first call instead of assuming nothing
//! is due. Nothing is ever tiered here, so the reads that cover tiers answer exactly without
//! segments (`find_batches` returns no segments, objects are all WAL objects).

use super::PostgresCoordinator;
use crate::backend::tiering_not_implemented;
use crate::{
    CoordinatorError, RegisterSegmentOutcome, RegisterSegmentRequest, SegmentPlan,
    SegmentPlanRequest, TieredSegment, TieringCandidate, TopicIdPartition,
};

impl PostgresCoordinator {
    pub(super) async fn read_tiering_candidates(
        &self,
        _now_ms: i64,
        _min_age_ms: i64,
        _after: Option<TopicIdPartition>,
        _limit: u32,
    ) -> Result<Vec<TieringCandidate>, CoordinatorError> {
        Err(tiering_not_implemented())
    }

    pub(super) async fn read_segment_plan(
        &self,
        _request: &SegmentPlanRequest,
    ) -> Result<SegmentPlan, CoordinatorError> {
        Err(tiering_not_implemented())
    }

    pub(super) async fn write_register_segment(
        &self,
        _request: RegisterSegmentRequest,
    ) -> Result<RegisterSegmentOutcome, CoordinatorError> {
        Err(tiering_not_implemented())
    }

    pub(super) async fn read_list_tiered_segments(
        &self,
        _partition: TopicIdPartition,
        _from_offset: i64,
        _limit: u32,
    ) -> Result<Vec<TieredSegment>, CoordinatorError> {
        Err(tiering_not_implemented())
    }
}
