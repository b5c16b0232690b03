//! The producer ids this broker process hands out (InitProducerId, the transaction coordinator's
//! producer-id rotations).

/// Producer ids handed out by this broker process: blocks from the coordinator
/// (`BatchCoordinator::allocate_producer_ids`, as Kafka's brokers get blocks from the controller,
/// KIP-730), so that broker processes sharing one coordinator never give out the same id.
#[derive(Debug, Default)]
pub(crate) struct ProducerIds {
    /// The next id and the end (exclusive) of the current block.
    block: tokio::sync::Mutex<(i64, i64)>,
}

impl ProducerIds {
    /// Ids asked for at a time (Kafka's block size).
    const BLOCK: u32 = 1000;

    /// A producer id never handed out before, by this process or any other on the coordinator.
    pub(crate) async fn next(
        &self,
        coordinator: &dyn diskless_coordinator::BatchCoordinator,
    ) -> Result<i64, diskless_coordinator::CoordinatorError> {
        let mut block = self.block.lock().await;
        if block.0 >= block.1 {
            let fresh = coordinator.allocate_producer_ids(Self::BLOCK).await?;
            *block = (fresh.first, fresh.first + i64::from(fresh.count));
        }
        let id = block.0;
        block.0 += 1;
        Ok(id)
    }
}
