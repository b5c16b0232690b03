//! Fetch sessions (KIP-227), as Kafka's broker keeps them (`FetchSession.scala`: `FetchManager`,
//! `FetchSessionCache`, the full / incremental / sessionless / error fetch contexts).
//!
//! A Fetch request of version 7+ carries a session id and epoch:
//!
//! | session id | epoch | meaning |
//! | --- | --- | --- |
//! | any | `0` | full fetch: close the named session (if any) and open a new one with the request's partitions |
//! | any | `-1` | full fetch, no session: close the named session (if any), answer sessionless (session id 0) |
//! | `id` | `n > 0` | incremental fetch of session `id`; `n` must be the epoch the broker expects |
//!
//! An incremental request lists only the partitions that changed (added, or with a new fetch
//! offset / max bytes) and the partitions to forget; every other partition of the session is fetched
//! with the parameters the session remembers. Its response omits a partition unless it has records,
//! a changed high watermark or log start offset, or an error. An unknown session is
//! `FETCH_SESSION_ID_NOT_FOUND`, a wrong epoch `INVALID_FETCH_SESSION_EPOCH`, a session opened with
//! topic names (versions < 13) used with topic ids (13+) or the reverse `FETCH_SESSION_TOPIC_ID_ERROR`;
//! each is a top-level error with no partitions and session id 0. A session left with no partition
//! is closed and that request answered sessionless. Requests of versions 4-6 have no session fields
//! and are answered sessionless.
//!
//! Each logical broker has its own cache (a session id means nothing to another broker), bounded as
//! Kafka's by `max.incremental.fetch.session.cache.slots` (1000) and evicting as Kafka does: when
//! the cache is full, a new session may replace the least recently used one if that was unused for
//! [`EVICTION_AGE`] (Kafka's 120 s), or else the least valuable of the sessions older than that
//! (unprivileged before privileged, fewer partitions first) if the new one is at least as valuable.
//! Sessions of followers (replica id >= 0) are privileged; a consumer's are not. Otherwise the
//! request is answered sessionless (session id 0), which a client accepts.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use kafka_protocol::messages::TopicName;
use parking_lot::Mutex;
use uuid::Uuid;

/// The session id of a sessionless request or response.
pub(crate) const INVALID_SESSION_ID: i32 = 0;
/// The epoch of a full request that opens a session.
pub(crate) const INITIAL_EPOCH: i32 = 0;
/// The epoch of a full request that closes its session and opens none.
pub(crate) const FINAL_EPOCH: i32 = -1;
/// `FETCH_SESSION_ID_NOT_FOUND`.
pub(crate) const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;
/// `INVALID_FETCH_SESSION_EPOCH`.
pub(crate) const INVALID_FETCH_SESSION_EPOCH: i16 = 71;
/// `FETCH_SESSION_TOPIC_ID_ERROR`.
pub(crate) const FETCH_SESSION_TOPIC_ID_ERROR: i16 = 106;
/// Kafka's default `max.incremental.fetch.session.cache.slots`.
pub(crate) const MAX_SESSIONS: usize = 1000;
/// Kafka's `MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS`: how long a session must be unused before
/// any new session may take its slot, and how old it must be before a more valuable one may.
pub(crate) const EVICTION_AGE: Duration = Duration::from_secs(120);

/// The epoch after `epoch` (Kafka's `FetchMetadata.nextEpoch`).
pub(crate) fn next_epoch(epoch: i32) -> i32 {
    if epoch < 0 {
        FINAL_EPOCH
    } else if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

/// How a request names a topic: by name (versions < 13) or by topic id (13+).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum TopicKey {
    Name(TopicName),
    Id(Uuid),
}

/// One partition of a fetch request or session.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PartitionKey {
    pub topic: TopicKey,
    pub partition: i32,
}

/// What a request asks of one partition (Kafka's `FetchRequest.PartitionData`); a session remembers
/// it for the incremental requests that do not repeat it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PartitionRequest {
    pub fetch_offset: i64,
    pub max_bytes: i32,
    pub log_start_offset: i64,
    pub current_leader_epoch: i32,
    pub last_fetched_epoch: i32,
}

/// What the answer for one partition says, as far as a session cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PartitionOutcome {
    pub error: i16,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub records_len: usize,
}

#[derive(Debug)]
struct CachedPartition {
    key: PartitionKey,
    request: PartitionRequest,
    /// The high watermark last sent (-1 after an error, so that the next answer is sent).
    high_watermark: i64,
    /// The log start offset last sent.
    log_start_offset: i64,
}

impl CachedPartition {
    /// Kafka's `CachedPartition.maybeUpdateResponseData(respData, updateResponseData = true)`:
    /// whether the partition must be in the incremental response; remembers what is sent.
    fn must_respond(&mut self, outcome: &PartitionOutcome) -> bool {
        let mut respond = outcome.records_len > 0;
        if self.high_watermark != outcome.high_watermark {
            respond = true;
            self.high_watermark = outcome.high_watermark;
        }
        if self.log_start_offset != outcome.log_start_offset {
            respond = true;
            self.log_start_offset = outcome.log_start_offset;
        }
        if outcome.error != 0 {
            self.high_watermark = -1;
            respond = true;
        }
        respond
    }
}

#[derive(Debug)]
struct Session {
    privileged: bool,
    uses_topic_ids: bool,
    created: Instant,
    last_used: Instant,
    /// The epoch the next incremental request must carry.
    epoch: i32,
    /// In fetch order: a partition that returned records moves to the end (Kafka's round robin).
    partitions: Vec<CachedPartition>,
    index: HashMap<PartitionKey, usize>,
}

impl Session {
    fn reindex(&mut self) {
        self.index = self
            .partitions
            .iter()
            .enumerate()
            .map(|(i, p)| (p.key.clone(), i))
            .collect();
    }

    /// Kafka's `FetchSession.update`: adds or updates the request's partitions, removes the
    /// forgotten ones.
    fn update(
        &mut self,
        fetch_data: &[(PartitionKey, PartitionRequest)],
        forgotten: &[PartitionKey],
    ) {
        for (key, request) in fetch_data {
            match self.index.get(key) {
                Some(&i) => self.partitions[i].request = *request,
                None => {
                    self.index.insert(key.clone(), self.partitions.len());
                    self.partitions.push(CachedPartition {
                        key: key.clone(),
                        request: *request,
                        high_watermark: -1,
                        log_start_offset: -1,
                    });
                }
            }
        }
        if !forgotten.is_empty() {
            self.partitions.retain(|p| !forgotten.contains(&p.key));
            self.reindex();
        }
    }

    /// The ordering key of Kafka's `EvictableKey` (privileged, size, id): the smallest is evicted
    /// first.
    fn evictable_key(&self, id: i32) -> (bool, usize, i32) {
        (self.privileged, self.partitions.len(), id)
    }
}

/// How a Fetch request is served (Kafka's `FetchContext` kinds).
#[derive(Debug)]
pub(crate) enum Context {
    /// No session: answer every partition of the request, session id 0.
    Sessionless,
    /// A full request that asks for a session: answer every partition, then [`SessionCache::open`].
    Full,
    /// An incremental request: fetch every partition of the session (in its order), then
    /// [`SessionCache::respond_incremental`] says which go into the response.
    Incremental {
        session_id: i32,
        /// The session's epoch after this request (what the response check expects).
        epoch: i32,
        partitions: Vec<(PartitionKey, PartitionRequest)>,
    },
    /// A session error: the response carries this top-level error, no partitions, session id 0.
    Error(i16),
}

/// The fetch sessions of one broker.
#[derive(Debug)]
pub(crate) struct SessionCache {
    max_sessions: usize,
    eviction_age: Duration,
    sessions: HashMap<i32, Session>,
    rng: fastrand::Rng,
}

impl SessionCache {
    /// An empty cache of at most `max_sessions` sessions.
    pub(crate) fn new(max_sessions: usize, eviction_age: Duration, seed: u64) -> SessionCache {
        SessionCache {
            max_sessions,
            eviction_age,
            sessions: HashMap::new(),
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    /// How many sessions are open.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Kafka's `FetchManager.newContext`.
    pub(crate) fn new_context(
        &mut self,
        now: Instant,
        uses_topic_ids: bool,
        session_id: i32,
        epoch: i32,
        fetch_data: &[(PartitionKey, PartitionRequest)],
        forgotten: &[PartitionKey],
    ) -> Context {
        if epoch == INITIAL_EPOCH || epoch == FINAL_EPOCH {
            // Any session named by a full request is closed.
            if session_id != INVALID_SESSION_ID {
                self.sessions.remove(&session_id);
            }
            return if epoch == FINAL_EPOCH {
                Context::Sessionless
            } else {
                Context::Full
            };
        }
        let Some(session) = self.sessions.get_mut(&session_id) else {
            return Context::Error(FETCH_SESSION_ID_NOT_FOUND);
        };
        if session.epoch != epoch {
            return Context::Error(INVALID_FETCH_SESSION_EPOCH);
        }
        if session.uses_topic_ids != uses_topic_ids {
            return Context::Error(FETCH_SESSION_TOPIC_ID_ERROR);
        }
        session.update(fetch_data, forgotten);
        if session.partitions.is_empty() {
            self.sessions.remove(&session_id);
            return Context::Sessionless;
        }
        session.last_used = now;
        session.epoch = next_epoch(session.epoch);
        Context::Incremental {
            session_id,
            epoch: session.epoch,
            partitions: session
                .partitions
                .iter()
                .map(|p| (p.key.clone(), p.request))
                .collect(),
        }
    }

    /// Kafka's `FullFetchContext.updateAndGenerateResponseData`: opens a session holding every
    /// answered partition (errors included) if there is room or a slot can be evicted; returns its
    /// id, or [`INVALID_SESSION_ID`] when none was opened.
    pub(crate) fn open(
        &mut self,
        now: Instant,
        privileged: bool,
        uses_topic_ids: bool,
        answered: Vec<(PartitionKey, PartitionRequest, PartitionOutcome)>,
    ) -> i32 {
        if self.sessions.len() >= self.max_sessions
            && !self.try_evict(now, privileged, answered.len())
        {
            return INVALID_SESSION_ID;
        }
        let id = loop {
            let id = self.rng.i32(1..=i32::MAX);
            if !self.sessions.contains_key(&id) {
                break id;
            }
        };
        let mut session = Session {
            privileged,
            uses_topic_ids,
            created: now,
            last_used: now,
            epoch: next_epoch(INITIAL_EPOCH),
            partitions: Vec::with_capacity(answered.len()),
            index: HashMap::new(),
        };
        for (key, request, outcome) in answered {
            if session.index.contains_key(&key) {
                continue;
            }
            session.index.insert(key.clone(), session.partitions.len());
            session.partitions.push(CachedPartition {
                key,
                request,
                high_watermark: outcome.high_watermark,
                log_start_offset: outcome.log_start_offset,
            });
        }
        self.sessions.insert(id, session);
        id
    }

    /// Kafka's `FetchSessionCacheShard.tryEvict`.
    fn try_evict(&mut self, now: Instant, privileged: bool, size: usize) -> bool {
        let age = |t: Instant| now.saturating_duration_since(t);
        let lru = self
            .sessions
            .iter()
            .min_by_key(|(id, s)| (s.last_used, **id))
            .map(|(id, s)| (*id, s.last_used));
        let Some((lru_id, last_used)) = lru else {
            return false;
        };
        if age(last_used) > self.eviction_age {
            self.sessions.remove(&lru_id);
            return true;
        }
        // Kafka keeps a session in the "evictable by all" set once it is older than the eviction
        // age; a privileged newcomer may also evict any unprivileged session.
        let victim = self
            .sessions
            .iter()
            .filter(|(_, s)| {
                let old = age(s.created) > self.eviction_age;
                if privileged {
                    !s.privileged || old
                } else {
                    old
                }
            })
            .map(|(id, s)| s.evictable_key(*id))
            .min();
        match victim {
            Some(key) if (privileged, size, 0) >= key => {
                self.sessions.remove(&key.2);
                true
            }
            _ => false,
        }
    }

    /// Kafka's `IncrementalFetchContext.updateAndGenerateResponseData`: for each answered partition
    /// (in fetch order), whether it goes into the response. `Err` is `INVALID_FETCH_SESSION_EPOCH`
    /// when another request of the session came in between (a duplicate request). Partitions that
    /// returned records move to the end of the session's order.
    pub(crate) fn respond_incremental(
        &mut self,
        session_id: i32,
        epoch: i32,
        answered: &[(PartitionKey, PartitionOutcome)],
    ) -> Result<Vec<bool>, i16> {
        let Some(session) = self.sessions.get_mut(&session_id) else {
            // Evicted or closed while this request was served: the session object Kafka would
            // still hold sends every partition; the next request learns the session is gone.
            return Ok(vec![true; answered.len()]);
        };
        if session.epoch != epoch {
            return Err(INVALID_FETCH_SESSION_EPOCH);
        }
        let mut include = Vec::with_capacity(answered.len());
        let mut moved = Vec::new();
        for (key, outcome) in answered {
            let respond = match session.index.get(key) {
                Some(&i) => {
                    let respond = session.partitions[i].must_respond(outcome);
                    if respond && outcome.records_len > 0 {
                        moved.push(i);
                    }
                    respond
                }
                None => true,
            };
            include.push(respond);
        }
        if !moved.is_empty() {
            let mut taken: Vec<Option<CachedPartition>> = std::mem::take(&mut session.partitions)
                .into_iter()
                .map(Some)
                .collect();
            let mut tail = Vec::with_capacity(moved.len());
            for i in moved {
                if let Some(p) = taken.get_mut(i).and_then(Option::take) {
                    tail.push(p);
                }
            }
            session.partitions = taken.into_iter().flatten().chain(tail).collect();
            session.reindex();
        }
        Ok(include)
    }
}

/// The session caches of the process's logical brokers, by node id.
static CACHES: LazyLock<Mutex<HashMap<i32, SessionCache>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Runs `f` on the session cache of broker `node`.
pub(crate) fn with_cache<T>(node: i32, f: impl FnOnce(&mut SessionCache) -> T) -> T {
    let mut caches = CACHES.lock();
    let cache = caches.entry(node).or_insert_with(|| {
        SessionCache::new(MAX_SESSIONS, EVICTION_AGE, diskless_common::entropy_seed())
    });
    f(cache)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(partition: i32) -> PartitionKey {
        PartitionKey {
            topic: TopicKey::Name(TopicName(
                kafka_protocol::protocol::StrBytes::from_static_str("t"),
            )),
            partition,
        }
    }

    fn req(offset: i64) -> PartitionRequest {
        PartitionRequest {
            fetch_offset: offset,
            max_bytes: 1 << 20,
            log_start_offset: -1,
            current_leader_epoch: -1,
            last_fetched_epoch: -1,
        }
    }

    fn outcome(hw: i64, records_len: usize) -> PartitionOutcome {
        PartitionOutcome {
            error: 0,
            high_watermark: hw,
            log_start_offset: 0,
            records_len,
        }
    }

    fn open(cache: &mut SessionCache, now: Instant, privileged: bool, n: i32) -> i32 {
        let answered = (0..n).map(|p| (key(p), req(0), outcome(0, 0))).collect();
        cache.open(now, privileged, false, answered)
    }

    #[test]
    fn epochs_wrap_as_kafkas() {
        assert_eq!(next_epoch(0), 1);
        assert_eq!(next_epoch(i32::MAX), 1);
        assert_eq!(next_epoch(-1), -1);
    }

    #[test]
    fn incremental_requests_check_the_epoch_and_omit_unchanged_partitions() {
        let now = Instant::now();
        let mut cache = SessionCache::new(10, EVICTION_AGE, 1);
        let id = open(&mut cache, now, false, 2);
        assert_ne!(id, INVALID_SESSION_ID);
        assert!(matches!(
            cache.new_context(now, false, id, 2, &[], &[]),
            Context::Error(INVALID_FETCH_SESSION_EPOCH)
        ));
        assert!(matches!(
            cache.new_context(now, false, id ^ 1, 1, &[], &[]),
            Context::Error(FETCH_SESSION_ID_NOT_FOUND)
        ));
        assert!(matches!(
            cache.new_context(now, true, id, 1, &[], &[]),
            Context::Error(FETCH_SESSION_TOPIC_ID_ERROR)
        ));
        let Context::Incremental {
            epoch, partitions, ..
        } = cache.new_context(now, false, id, 1, &[], &[])
        else {
            panic!("not incremental");
        };
        assert_eq!((epoch, partitions.len()), (2, 2));
        // Partition 0 got records and moves to the end; partition 1 is unchanged.
        let answered = [(key(0), outcome(5, 100)), (key(1), outcome(0, 0))];
        assert_eq!(
            cache.respond_incremental(id, 2, &answered),
            Ok(vec![true, false])
        );
        let Context::Incremental { partitions, .. } =
            cache.new_context(now, false, id, 2, &[(key(0), req(5))], &[])
        else {
            panic!("not incremental");
        };
        let order: Vec<(i32, i64)> = partitions
            .iter()
            .map(|(k, r)| (k.partition, r.fetch_offset))
            .collect();
        assert_eq!(order, vec![(1, 0), (0, 5)]);
        // A second request answered under an older epoch: a duplicate.
        assert_eq!(
            cache.respond_incremental(id, 2, &answered),
            Err(INVALID_FETCH_SESSION_EPOCH)
        );
        // Forgetting every partition closes the session.
        assert!(matches!(
            cache.new_context(now, false, id, 3, &[], &[key(0), key(1)]),
            Context::Sessionless
        ));
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn full_requests_close_the_named_session() {
        let now = Instant::now();
        let mut cache = SessionCache::new(10, EVICTION_AGE, 2);
        let id = open(&mut cache, now, false, 1);
        assert!(matches!(
            cache.new_context(now, false, id, FINAL_EPOCH, &[], &[]),
            Context::Sessionless
        ));
        assert_eq!(cache.len(), 0);
        let id = open(&mut cache, now, false, 1);
        assert!(matches!(
            cache.new_context(now, false, id, INITIAL_EPOCH, &[], &[]),
            Context::Full
        ));
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn a_full_cache_evicts_as_kafka() {
        let t0 = Instant::now();
        let mut cache = SessionCache::new(2, Duration::from_secs(100), 3);
        let a = open(&mut cache, t0, false, 3);
        let b = open(&mut cache, t0, false, 1);
        assert_ne!(a, b);
        // Full, nothing stale or old enough: no session for a newcomer.
        assert_eq!(open(&mut cache, t0, false, 5), INVALID_SESSION_ID);
        // A privileged newcomer may evict an unprivileged session that is smaller.
        let p = open(&mut cache, t0, true, 1);
        assert_ne!(p, INVALID_SESSION_ID);
        assert_eq!(cache.len(), 2);
        assert!(cache.sessions.contains_key(&a) && !cache.sessions.contains_key(&b));
        // Once sessions are old (but recently used), a larger newcomer evicts the least valuable.
        let t1 = t0 + Duration::from_secs(150);
        for id in [a, p] {
            if let Some(s) = cache.sessions.get_mut(&id) {
                s.last_used = t1;
            }
        }
        assert_eq!(open(&mut cache, t1, false, 2), INVALID_SESSION_ID);
        let c = open(&mut cache, t1, false, 4);
        assert_ne!(c, INVALID_SESSION_ID);
        assert!(cache.sessions.contains_key(&p) && !cache.sessions.contains_key(&a));
        // A session unused for longer than the eviction age gives way to anyone.
        let t2 = t1 + Duration::from_secs(101);
        cache.sessions.get_mut(&c).unwrap().last_used = t2;
        let d = open(&mut cache, t2, false, 0);
        assert_ne!(d, INVALID_SESSION_ID);
        assert!(!cache.sessions.contains_key(&p));
    }
}
