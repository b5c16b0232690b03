//! The group coordinator: the classic consumer-group protocol as Kafka's `GroupCoordinator` runs
//! it, behind the group APIs of [`crate::groups`] (FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup, ListGroups, DescribeGroups, DeleteGroups). Groups are shared by every logical broker
//! of the process.
//!
//! - **States** are Kafka's: `Empty` → a JoinGroup starts a rebalance (`PreparingRebalance`; the
//!   first rebalance of an empty group waits [`INITIAL_REBALANCE_DELAY`] so that members starting
//!   together land in one generation). The join phase completes when every member (and every
//!   pending member id) has joined, or at the rebalance timeout: dynamic members that did not rejoin
//!   are removed, static ones stay (with their last metadata); the generation is bumped, the protocol
//!   most members prefer is chosen, the leader gets the member list (`CompletingRebalance`). The
//!   leader's SyncGroup carries the assignments; once the group's metadata is stored, every member
//!   gets its own and the group is `Stable`; members that have not sent SyncGroup by the rebalance
//!   timeout are removed (a new rebalance). Heartbeats answer `REBALANCE_IN_PROGRESS` while a
//!   rebalance runs; members that stop heartbeating for their session timeout are removed.
//! - **Durable** (Kafka's group metadata records in `__consumer_offsets`): the group's metadata
//!   (generation, protocol type and name, leader, and every member with its ids, client, timeouts,
//!   subscription and assignment) is written to the broker store when Kafka writes it — after the
//!   leader's SyncGroup (before anyone gets an assignment), when a generation ends empty, when a
//!   static member's id is replaced — and loaded (as `Stable`, or `Empty` without members; every
//!   member's session starting at the load) before the first group request after a start, so that
//!   members keep their member id and generation across a broker restart. Groups known only by
//!   their committed offsets are loaded as `Empty` groups without a protocol type, as Kafka does.
//! - **Member ids** (KIP-394): a dynamic member's first JoinGroup without a member id (version 4+)
//!   is answered `MEMBER_ID_REQUIRED` with the id it must join with; the id is pending until then.
//! - **Static membership** (KIP-345): a member with a `group.instance.id` that joins without a member
//!   id replaces the instance's previous member id and keeps its assignment — in a `Stable` group
//!   without a rebalance (unless the group's protocol would change); the old member id is fenced
//!   (`FENCED_INSTANCE_ID`). Static members are not removed when a rebalance times out, only when
//!   their session expires or by LeaveGroup (version 3+: by member id or by instance id).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use diskless_coordinator::{Clock, SystemClock};
use kafka_protocol::messages::ConsumerProtocolSubscription;
use kafka_protocol::protocol::Decodable;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::codes;
use crate::store::{GroupRecord, MemberRecord, Store};

/// How long the first rebalance of an empty group waits for more members
/// (Kafka's `group.initial.rebalance.delay.ms`).
const INITIAL_REBALANCE_DELAY: Duration = Duration::from_millis(1500);
/// Session timeouts accepted (Kafka's `group.min/max.session.timeout.ms`).
const MIN_SESSION_TIMEOUT: Duration = Duration::from_secs(1);
const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// The longest wait between two looks for expired members; the expiry task wakes at the earliest
/// session deadline, so a member expires within [`EXPIRY_SLACK`] of its deadline, as Kafka's
/// heartbeat purgatory expires it at the deadline (clients count on it: librdkafka's admin test
/// deletes a group one second after its static members' session timeout).
const EXPIRY_CHECK: Duration = Duration::from_millis(500);
/// The shortest wait of the expiry task (a deadline already passed is handled on the next wake).
const EXPIRY_SLACK: Duration = Duration::from_millis(1);

/// Kafka error codes of the group APIs (beyond [`codes`]).
const NON_EMPTY_GROUP: i16 = 68;
const GROUP_ID_NOT_FOUND: i16 = 69;
const MEMBER_ID_REQUIRED: i16 = 79;
const FENCED_INSTANCE_ID: i16 = 82;

/// The consumer protocol type (`protocol.type` of Kafka's consumers).
const CONSUMER: &str = "consumer";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
    /// Deleted (DeleteGroups): whoever still holds it retries with a fresh lookup.
    Dead,
}

impl State {
    /// Kafka's name of the state (ListGroups, DescribeGroups).
    fn name(self) -> &'static str {
        match self {
            State::Empty => "Empty",
            State::PreparingRebalance => "PreparingRebalance",
            State::CompletingRebalance => "CompletingRebalance",
            State::Stable => "Stable",
            State::Dead => "Dead",
        }
    }
}

/// The answer to a JoinGroup.
#[derive(Clone, Debug, Default)]
pub(crate) struct JoinOutcome {
    pub error: i16,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// For the leader: (member id, group instance id, metadata of the chosen protocol).
    pub members: Vec<(String, Option<String>, Bytes)>,
    /// JoinGroup version 9+: the leader of a stable group (a static leader that rejoined) must not
    /// run the assignor.
    pub skip_assignment: bool,
}

impl JoinOutcome {
    pub(crate) fn error(error: i16, member_id: String) -> JoinOutcome {
        JoinOutcome {
            error,
            generation: -1,
            member_id,
            ..JoinOutcome::default()
        }
    }
}

/// The answer to a SyncGroup.
#[derive(Clone, Debug, Default)]
pub(crate) struct SyncOutcome {
    pub error: i16,
    pub assignment: Bytes,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
}

impl SyncOutcome {
    pub(crate) fn error(error: i16) -> SyncOutcome {
        SyncOutcome {
            error,
            ..SyncOutcome::default()
        }
    }
}

struct Member {
    id: String,
    instance_id: Option<String>,
    client_id: String,
    client_host: String,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    protocol_type: String,
    protocols: Vec<(String, Bytes)>,
    join: Option<oneshot::Sender<JoinOutcome>>,
    sync: Option<oneshot::Sender<SyncOutcome>>,
    assignment: Bytes,
    last_seen: Instant,
}

impl Member {
    /// Whether a JoinGroup's protocols are the member's (same names and metadata, same order).
    fn matches(&self, protocols: &[(String, Bytes)]) -> bool {
        self.protocols == protocols
    }

    fn metadata(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(n, _)| n == protocol)
            .map(|(_, md)| md.clone())
            .unwrap_or_default()
    }
}

struct Group {
    id: String,
    state: State,
    generation: i32,
    protocol_type: Option<String>,
    protocol_name: Option<String>,
    leader: Option<String>,
    /// In join order.
    members: Vec<Member>,
    /// Member ids handed out with `MEMBER_ID_REQUIRED`, until they join or this deadline passes.
    pending: HashMap<String, Instant>,
    /// Members that have not sent SyncGroup since the join phase completed; those still here at
    /// the rebalance timeout are removed (Kafka's pending sync members).
    pending_sync: HashSet<String>,
    /// Identifies the current rebalance (its timers ignore later ones).
    rebalance: u64,
    /// The first rebalance of an empty group does not complete before this.
    delay_until: Option<Instant>,
}

impl Group {
    fn new(id: &str) -> Group {
        Group {
            id: id.to_string(),
            state: State::Empty,
            generation: 0,
            protocol_type: None,
            protocol_name: None,
            leader: None,
            members: Vec::new(),
            pending: HashMap::new(),
            pending_sync: HashSet::new(),
            rebalance: 0,
            delay_until: None,
        }
    }

    /// A group as stored: `Stable` with its members, or `Empty`.
    fn from_record(r: GroupRecord, now: Instant) -> Group {
        let protocol_type = r.protocol_type.clone().unwrap_or_default();
        let protocol = r.protocol_name.clone().unwrap_or_default();
        let members: Vec<Member> = r
            .members
            .into_iter()
            .map(|m| Member {
                id: m.member_id,
                instance_id: m.instance_id,
                client_id: m.client_id,
                client_host: m.client_host,
                session_timeout: ms(m.session_timeout_ms),
                rebalance_timeout: ms(m.rebalance_timeout_ms),
                protocol_type: protocol_type.clone(),
                protocols: vec![(protocol.clone(), Bytes::from(m.subscription))],
                join: None,
                sync: None,
                assignment: Bytes::from(m.assignment),
                last_seen: now,
            })
            .collect();
        let mut g = Group::new(&r.group_id);
        g.state = if members.is_empty() {
            State::Empty
        } else {
            State::Stable
        };
        g.generation = r.generation;
        g.protocol_type = r.protocol_type;
        g.protocol_name = if members.is_empty() {
            None
        } else {
            r.protocol_name
        };
        g.leader = r.leader.filter(|l| members.iter().any(|m| &m.id == l));
        if g.leader.is_none() {
            g.leader = members.first().map(|m| m.id.clone());
        }
        g.members = members;
        g
    }

    /// The metadata record Kafka writes for the group, with `assignments` (the leader's, being
    /// stored) or the members' current ones.
    fn record(&self, assignments: Option<&HashMap<String, Bytes>>, now_ms: i64) -> GroupRecord {
        let protocol = self.protocol_name.clone().unwrap_or_default();
        GroupRecord {
            group_id: self.id.clone(),
            protocol_type: self.protocol_type.clone(),
            generation: self.generation,
            protocol_name: self.protocol_name.clone(),
            leader: self.leader.clone(),
            state_time_ms: now_ms,
            members: self
                .members
                .iter()
                .map(|m| MemberRecord {
                    member_id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: duration_ms(m.rebalance_timeout),
                    session_timeout_ms: duration_ms(m.session_timeout),
                    subscription: m.metadata(&protocol).to_vec(),
                    assignment: assignments
                        .map_or(&m.assignment, |a| a.get(&m.id).unwrap_or(&m.assignment))
                        .to_vec(),
                })
                .collect(),
        }
    }

    fn member(&mut self, id: &str) -> Option<&mut Member> {
        self.members.iter_mut().find(|m| m.id == id)
    }

    fn has(&self, id: &str) -> bool {
        self.members.iter().any(|m| m.id == id)
    }

    /// The member id of a static member.
    fn static_member(&self, instance_id: &str) -> Option<String> {
        self.members
            .iter()
            .find(|m| m.instance_id.as_deref() == Some(instance_id))
            .map(|m| m.id.clone())
    }

    /// Kafka's `validateCurrentMember`: a static member's instance id must map to this member id
    /// (else `FENCED_INSTANCE_ID`), and the member must exist.
    fn validate_member(&self, member_id: &str, instance_id: Option<&str>) -> Option<i16> {
        if let Some(instance) = instance_id {
            return match self.static_member(instance) {
                Some(current) if current != member_id => {
                    info!(group = %self.id, member = %member_id, instance, current = %current, "fenced static member");
                    Some(FENCED_INSTANCE_ID)
                }
                Some(_) => None,
                None => Some(codes::UNKNOWN_MEMBER_ID),
            };
        }
        (!self.has(member_id)).then_some(codes::UNKNOWN_MEMBER_ID)
    }

    /// The protocols every member supports.
    fn candidates(&self) -> HashSet<&str> {
        let mut members = self.members.iter();
        let Some(first) = members.next() else {
            return HashSet::new();
        };
        let mut set: HashSet<&str> = first.protocols.iter().map(|(n, _)| n.as_str()).collect();
        for m in members {
            set.retain(|n| m.protocols.iter().any(|(p, _)| p == n));
        }
        set
    }

    /// Kafka's `supportsProtocols`: whether a member with these protocols may join.
    fn supports(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        if self.state == State::Empty || self.members.is_empty() {
            return !protocol_type.is_empty() && !protocols.is_empty();
        }
        let candidates = self.candidates();
        self.protocol_type.as_deref() == Some(protocol_type)
            && protocols
                .iter()
                .any(|(n, _)| candidates.contains(n.as_str()))
    }

    /// Kafka's `selectProtocol`: each member votes for its first supported candidate; the most
    /// votes win (ties: the leader's preference).
    fn select_protocol(&self) -> Option<String> {
        let candidates = self.candidates();
        let mut votes: HashMap<&str, usize> = HashMap::new();
        for m in &self.members {
            if let Some((n, _)) = m
                .protocols
                .iter()
                .find(|(n, _)| candidates.contains(n.as_str()))
            {
                *votes.entry(n.as_str()).or_default() += 1;
            }
        }
        let leader = self
            .leader
            .as_deref()
            .and_then(|l| self.members.iter().find(|m| m.id == l))
            .or(self.members.first())?;
        let best = votes.values().copied().max()?;
        leader
            .protocols
            .iter()
            .map(|(n, _)| n.as_str())
            .find(|n| votes.get(n) == Some(&best))
            .or_else(|| votes.iter().find(|(_, v)| **v == best).map(|(n, _)| *n))
            .map(str::to_string)
    }

    fn has_all_joined(&self) -> bool {
        self.pending.is_empty() && self.members.iter().all(|m| m.join.is_some())
    }

    /// The topics the members subscribe to (consumer protocol), `None` if unknown.
    fn subscribed_topics(&self) -> Option<HashSet<String>> {
        let protocol = self.protocol_name.as_deref()?;
        if self.protocol_type.as_deref() != Some(CONSUMER) {
            return None;
        }
        let mut topics = HashSet::new();
        for m in &self.members {
            let mut buf = m.metadata(protocol);
            if buf.len() < 2 {
                return None;
            }
            let version = i16::from_be_bytes([buf[0], buf[1]]).clamp(0, 3);
            let _ = bytes::Buf::get_i16(&mut buf);
            let subscription = ConsumerProtocolSubscription::decode(&mut buf, version).ok()?;
            topics.extend(subscription.topics.iter().map(|t| t.as_str().to_string()));
        }
        Some(topics)
    }
}

fn ms(v: i32) -> Duration {
    Duration::from_millis(u64::try_from(v).unwrap_or(0))
}

fn duration_ms(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

/// What a JoinGroup asks for.
pub(crate) struct JoinParams {
    pub group_id: String,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    /// Kafka's form: `/` and the client's address.
    pub client_host: String,
    /// JoinGroup version 4+ (KIP-394): a dynamic member without id gets `MEMBER_ID_REQUIRED`.
    pub require_known_member_id: bool,
    /// JoinGroup version 9+: a static leader that rejoins a stable group is told it leads, with
    /// `skip_assignment`.
    pub support_skipping_assignment: bool,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
}

/// One member of a DescribeGroups answer.
#[derive(Clone, Debug)]
pub(crate) struct MemberSummary {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

/// A DescribeGroups answer (Kafka's `GroupSummary`).
#[derive(Clone, Debug)]
pub(crate) struct GroupSummary {
    pub state: &'static str,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<MemberSummary>,
}

/// A write of the store, in the order the group state changed.
enum Write {
    Save(GroupRecord, oneshot::Sender<bool>),
    Delete(String, oneshot::Sender<bool>),
}

/// All groups.
pub(crate) struct GroupCoordinator {
    groups: Mutex<HashMap<String, Arc<Mutex<Group>>>>,
    initial_delay: Duration,
    clock: Arc<dyn Clock>,
    /// Set once the stored groups are loaded (before the first group request is served).
    loaded: tokio::sync::OnceCell<()>,
    /// The writer of group metadata (none before loading, and in unit tests: writes succeed).
    writes: OnceLock<mpsc::UnboundedSender<Write>>,
}

impl GroupCoordinator {
    pub(crate) fn new() -> Arc<GroupCoordinator> {
        Arc::new(GroupCoordinator {
            groups: Mutex::new(HashMap::new()),
            initial_delay: INITIAL_REBALANCE_DELAY,
            clock: Arc::new(SystemClock),
            loaded: tokio::sync::OnceCell::new(),
            writes: OnceLock::new(),
        })
    }

    /// Loads the stored groups once (Kafka loads a group's partition of `__consumer_offsets` when
    /// it becomes its coordinator), and from then on writes group metadata to `store`.
    /// `Err`: the error code to answer with.
    pub(crate) async fn load(&self, store: &Store) -> Result<(), i16> {
        let result = self
            .loaded
            .get_or_try_init(|| async {
                let records = store.load_groups().await?;
                let now = Instant::now();
                let count = records.len();
                {
                    let mut groups = self.groups.lock();
                    for r in records {
                        let id = r.group_id.clone();
                        groups
                            .entry(id)
                            .or_insert_with(|| Arc::new(Mutex::new(Group::from_record(r, now))));
                    }
                }
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(write_loop(store.clone(), rx));
                let _ = self.writes.set(tx);
                info!(groups = count, "consumer groups loaded");
                Ok::<(), crate::store::StoreError>(())
            })
            .await;
        result.map(|_| ()).map_err(|e| {
            warn!(error = %e, "cannot load the consumer groups");
            codes::COORDINATOR_NOT_AVAILABLE
        })
    }

    /// Queues a write; the receiver answers whether it was stored.
    fn write(&self, w: impl FnOnce(oneshot::Sender<bool>) -> Write) -> oneshot::Receiver<bool> {
        let (tx, rx) = oneshot::channel();
        match self.writes.get() {
            Some(writes) => {
                if let Err(mpsc::error::SendError(w)) = writes.send(w(tx)) {
                    let (Write::Save(_, tx) | Write::Delete(_, tx)) = w;
                    let _ = tx.send(false);
                }
            }
            None => {
                let _ = tx.send(true);
            }
        }
        rx
    }

    fn store_group(
        &self,
        g: &Group,
        assignments: Option<&HashMap<String, Bytes>>,
    ) -> oneshot::Receiver<bool> {
        let record = g.record(assignments, self.clock.now_ms());
        self.write(|tx| Write::Save(record, tx))
    }

    fn group(&self, id: &str) -> Arc<Mutex<Group>> {
        self.groups
            .lock()
            .entry(id.to_string())
            .or_insert_with(|| Arc::new(Mutex::new(Group::new(id))))
            .clone()
    }

    fn existing(&self, id: &str) -> Option<Arc<Mutex<Group>>> {
        self.groups.lock().get(id).cloned()
    }

    /// JoinGroup: waits until the rebalance completes.
    pub(crate) async fn join(self: &Arc<Self>, p: JoinParams) -> JoinOutcome {
        let session_timeout = ms(p.session_timeout_ms);
        if !(MIN_SESSION_TIMEOUT..=MAX_SESSION_TIMEOUT).contains(&session_timeout) {
            return JoinOutcome::error(codes::INVALID_SESSION_TIMEOUT, p.member_id);
        }
        if p.group_id.is_empty() {
            return JoinOutcome::error(codes::INVALID_GROUP_ID, p.member_id);
        }
        let is_unknown = p.member_id.is_empty();
        // The group is created by a member without id; a member id of no group is unknown.
        let group = if is_unknown {
            self.group(&p.group_id)
        } else {
            match self.existing(&p.group_id) {
                Some(g) => g,
                None => return JoinOutcome::error(codes::UNKNOWN_MEMBER_ID, p.member_id),
            }
        };
        let (tx, rx) = oneshot::channel();
        {
            let mut g = group.lock();
            if g.state == State::Dead {
                let _ = tx.send(JoinOutcome::error(
                    codes::COORDINATOR_NOT_AVAILABLE,
                    p.member_id,
                ));
            } else if !g.supports(&p.protocol_type, &p.protocols) {
                let _ = tx.send(JoinOutcome::error(
                    codes::INCONSISTENT_GROUP_PROTOCOL,
                    p.member_id,
                ));
            } else if is_unknown {
                self.new_member_join(&group, &mut g, p, tx);
            } else {
                self.current_member_join(&mut g, p, tx);
            }
            if g.state == State::PreparingRebalance {
                self.try_complete_join(&mut g, false);
            }
        }
        rx.await
            .unwrap_or_else(|_| JoinOutcome::error(codes::COORDINATOR_NOT_AVAILABLE, String::new()))
    }

    fn new_member_join(
        self: &Arc<Self>,
        group: &Arc<Mutex<Group>>,
        g: &mut Group,
        p: JoinParams,
        tx: oneshot::Sender<JoinOutcome>,
    ) {
        let prefix = p.instance_id.as_deref().unwrap_or(&p.client_id);
        let new_id = format!("{prefix}-{}", crate::random_uuid());
        match p.instance_id.clone() {
            Some(instance) => match g.static_member(&instance) {
                Some(old_id) => {
                    info!(group = %g.id, instance = %instance, old = %old_id, new = %new_id, state = g.state.name(), "static member rejoins with a new member id");
                    self.update_static_member(group, g, &old_id, new_id, p, tx);
                }
                None => self.add_member_and_rebalance(g, new_id, p, tx),
            },
            None if p.require_known_member_id => {
                debug!(group = %g.id, member = %new_id, "new member: MEMBER_ID_REQUIRED");
                g.pending
                    .insert(new_id.clone(), Instant::now() + ms(p.session_timeout_ms));
                let _ = tx.send(JoinOutcome::error(MEMBER_ID_REQUIRED, new_id));
            }
            None => self.add_member_and_rebalance(g, new_id, p, tx),
        }
    }

    fn current_member_join(
        self: &Arc<Self>,
        g: &mut Group,
        p: JoinParams,
        tx: oneshot::Sender<JoinOutcome>,
    ) {
        let member_id = p.member_id.clone();
        if g.pending.remove(&member_id).is_some() {
            if p.instance_id.is_some() {
                // Kafka: a pending member id is never static.
                let _ = tx.send(JoinOutcome::error(codes::UNKNOWN_SERVER_ERROR, member_id));
                return;
            }
            self.add_member_and_rebalance(g, member_id, p, tx);
            return;
        }
        if let Some(error) = g.validate_member(&member_id, p.instance_id.as_deref()) {
            let _ = tx.send(JoinOutcome::error(error, member_id));
            return;
        }
        let is_leader = g.leader.as_deref() == Some(member_id.as_str());
        let matches = g
            .member(&member_id)
            .is_some_and(|m| m.matches(&p.protocols));
        match g.state {
            State::PreparingRebalance => {
                update_member(g, &member_id, p, tx);
                self.maybe_prepare_rebalance(g);
            }
            State::CompletingRebalance | State::Stable
                if matches && !(is_leader && g.state == State::Stable) =>
            {
                // The same metadata (a lost JoinGroup response, or a follower of a stable group):
                // the current generation's answer.
                let _ = tx.send(join_answer(
                    g,
                    &member_id,
                    g.state == State::CompletingRebalance,
                ));
            }
            State::CompletingRebalance | State::Stable => {
                update_member(g, &member_id, p, tx);
                self.maybe_prepare_rebalance(g);
            }
            State::Empty | State::Dead => {
                let _ = tx.send(JoinOutcome::error(codes::UNKNOWN_MEMBER_ID, member_id));
            }
        }
    }

    fn add_member_and_rebalance(
        self: &Arc<Self>,
        g: &mut Group,
        member_id: String,
        p: JoinParams,
        tx: oneshot::Sender<JoinOutcome>,
    ) {
        debug!(group = %g.id, member = %member_id, instance = ?p.instance_id, "member joins");
        if g.members.is_empty() {
            g.protocol_type = Some(p.protocol_type.clone());
        }
        if g.leader.is_none() {
            g.leader = Some(member_id.clone());
        }
        let session_timeout = ms(p.session_timeout_ms);
        g.members.push(Member {
            id: member_id,
            instance_id: p.instance_id,
            client_id: p.client_id,
            client_host: p.client_host,
            session_timeout,
            rebalance_timeout: rebalance_timeout(p.rebalance_timeout_ms, session_timeout),
            protocol_type: p.protocol_type,
            protocols: p.protocols,
            join: Some(tx),
            sync: None,
            assignment: Bytes::new(),
            last_seen: Instant::now(),
        });
        self.maybe_prepare_rebalance(g);
    }

    /// Kafka's `updateStaticMemberAndRebalance`: the instance's member gets the new id (the old one
    /// is fenced) and keeps its assignment.
    fn update_static_member(
        self: &Arc<Self>,
        group: &Arc<Mutex<Group>>,
        g: &mut Group,
        old_id: &str,
        new_id: String,
        p: JoinParams,
        tx: oneshot::Sender<JoinOutcome>,
    ) {
        let current_leader = g.leader.clone();
        let Some(m) = g.member(old_id) else {
            return;
        };
        if let Some(old) = m.join.take() {
            let _ = old.send(JoinOutcome::error(FENCED_INSTANCE_ID, old_id.to_string()));
        }
        if let Some(old) = m.sync.take() {
            let _ = old.send(SyncOutcome::error(FENCED_INSTANCE_ID));
        }
        m.id = new_id.clone();
        let old_protocols = m.protocols.clone();
        let old_timeouts = (m.session_timeout, m.rebalance_timeout);
        if g.pending_sync.remove(old_id) {
            g.pending_sync.insert(new_id.clone());
        }
        if g.leader.as_deref() == Some(old_id) {
            g.leader = Some(new_id.clone());
        }
        let p_skipping = p.support_skipping_assignment;
        update_member(g, &new_id, p, tx);
        match g.state {
            State::Stable => {
                if g.select_protocol() != g.protocol_name {
                    self.maybe_prepare_rebalance(g);
                    return;
                }
                // No rebalance: store the new member id, then answer with the current generation
                // and the old leader id (so that this member does not think it leads, before
                // JoinGroup version 9).
                let stored = self.store_group(g, None);
                let group = group.clone();
                let old_id = old_id.to_string();
                let skipping = p_skipping;
                tokio::spawn(async move {
                    let ok = stored.await.unwrap_or(false);
                    let mut g = group.lock();
                    let generation = g.generation;
                    let is_leader = g.leader.as_deref() == Some(new_id.as_str());
                    let answer = if skipping {
                        // Version 9+: the leader learns it leads, and skips the assignment.
                        JoinOutcome {
                            skip_assignment: is_leader,
                            ..join_answer(&g, &new_id, true)
                        }
                    } else {
                        // Before: the old leader id, so that a rejoining leader does not run an
                        // assignment a stable group would ignore.
                        JoinOutcome {
                            leader: current_leader.unwrap_or_default(),
                            ..join_answer(&g, &new_id, false)
                        }
                    };
                    let gid = g.id.clone();
                    if !ok && g.pending_sync.remove(&new_id) {
                        g.pending_sync.insert(old_id.clone());
                    }
                    let Some(m) = g.member(&new_id) else {
                        return;
                    };
                    let Some(tx) = m.join.take() else {
                        return;
                    };
                    if ok {
                        let _ = tx.send(answer);
                    } else {
                        warn!(group = %gid, instance = ?m.instance_id, "cannot store the static member's new id: reverted");
                        m.id = old_id.clone();
                        m.protocols = old_protocols;
                        (m.session_timeout, m.rebalance_timeout) = old_timeouts;
                        if is_leader {
                            g.leader = Some(old_id);
                        }
                        let mut answer =
                            JoinOutcome::error(codes::COORDINATOR_NOT_AVAILABLE, String::new());
                        answer.generation = generation;
                        let _ = tx.send(answer);
                    }
                });
            }
            // The leader may have been given the old member id: a new rebalance.
            State::CompletingRebalance => self.prepare_rebalance(g),
            State::PreparingRebalance | State::Empty | State::Dead => {}
        }
    }

    /// Kafka's `maybePrepareRebalance`.
    fn maybe_prepare_rebalance(self: &Arc<Self>, g: &mut Group) {
        if matches!(
            g.state,
            State::Stable | State::CompletingRebalance | State::Empty
        ) {
            self.prepare_rebalance(g);
        }
    }

    /// Starts a rebalance: members must rejoin.
    fn prepare_rebalance(self: &Arc<Self>, g: &mut Group) {
        if g.state == State::CompletingRebalance {
            for m in &mut g.members {
                m.assignment = Bytes::new();
                if let Some(tx) = m.sync.take() {
                    let _ = tx.send(SyncOutcome::error(codes::REBALANCE_IN_PROGRESS));
                }
            }
        }
        g.pending_sync.clear();
        let was_empty = g.state == State::Empty;
        g.state = State::PreparingRebalance;
        g.rebalance += 1;
        let timeout = rebalance_timeout_of(g);
        let now = Instant::now();
        let deadline = now + timeout;
        let delay_until = if was_empty {
            now + self.initial_delay.min(timeout)
        } else {
            now
        };
        g.delay_until = Some(delay_until);
        info!(group = %g.id, members = g.members.len(), generation = g.generation, "rebalance started");
        let this = self.clone();
        let group_id = g.id.clone();
        let rebalance = g.rebalance;
        tokio::spawn(async move {
            let mut at = delay_until;
            let mut force = false;
            loop {
                tokio::time::sleep_until(at).await;
                let Some(group) = this.existing(&group_id) else {
                    return;
                };
                let mut g = group.lock();
                if g.rebalance != rebalance || g.state != State::PreparingRebalance {
                    return;
                }
                if this.try_complete_join(&mut g, force) {
                    return;
                }
                // Not everyone joined by the delay: wait for the rebalance timeout; if no member
                // rejoined by then, for another one (Kafka's `DelayedJoin` again).
                at = if force {
                    Instant::now() + rebalance_timeout_of(&g)
                } else {
                    deadline
                };
                force = true;
            }
        });
        if !was_empty {
            self.try_complete_join(g, false);
        }
    }

    /// Completes the join phase when every member has rejoined (or `force`: the rebalance timed
    /// out). Returns whether the join phase is over.
    fn try_complete_join(self: &Arc<Self>, g: &mut Group, force: bool) -> bool {
        if g.state != State::PreparingRebalance {
            return true;
        }
        if !force && (!g.has_all_joined() || g.delay_until.is_some_and(|t| Instant::now() < t)) {
            return false;
        }
        self.complete_join(g)
    }

    /// Kafka's `onCompleteJoin`.
    fn complete_join(self: &Arc<Self>, g: &mut Group) -> bool {
        // Dynamic members that did not rejoin are removed; static ones stay.
        let (stay, gone): (Vec<Member>, Vec<Member>) = std::mem::take(&mut g.members)
            .into_iter()
            .partition(|m| m.join.is_some() || m.instance_id.is_some());
        g.members = stay;
        for m in gone {
            info!(group = %g.id, member = %m.id, "member did not rejoin in time: removed");
            answer_removed(m);
        }
        g.pending.clear();
        if !g.members.is_empty() {
            let leader_joined = g
                .leader
                .as_deref()
                .is_some_and(|l| g.members.iter().any(|m| m.id == l && m.join.is_some()));
            if !leader_joined {
                match g.members.iter().find(|m| m.join.is_some()) {
                    Some(m) => g.leader = Some(m.id.clone()),
                    None => {
                        warn!(group = %g.id, "no member rejoined: the rebalance waits longer");
                        return false;
                    }
                }
            }
        } else {
            g.leader = None;
        }
        g.generation += 1;
        if g.members.is_empty() {
            g.state = State::Empty;
            g.protocol_name = None;
            info!(group = %g.id, generation = g.generation, "group is now empty");
            // Kafka writes the empty generation; a failure only warns (no member depends on it).
            let stored = self.store_group(g, None);
            let group_id = g.id.clone();
            tokio::spawn(async move {
                if !stored.await.unwrap_or(false) {
                    warn!(group = %group_id, "cannot store the empty group's metadata");
                }
            });
            return true;
        }
        g.protocol_name = g.select_protocol();
        g.state = State::CompletingRebalance;
        info!(
            group = %g.id,
            generation = g.generation,
            members = g.members.len(),
            protocol = ?g.protocol_name,
            leader = ?g.leader,
            "rebalance: join phase complete"
        );
        let now = Instant::now();
        let answers: Vec<(usize, JoinOutcome)> = g
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.join.is_some())
            .map(|(i, m)| (i, join_answer(g, &m.id, true)))
            .collect();
        for (i, answer) in answers {
            if let Some(m) = g.members.get_mut(i) {
                m.last_seen = now;
                if let Some(tx) = m.join.take() {
                    let _ = tx.send(answer);
                }
            }
        }
        self.schedule_pending_sync(g);
        true
    }

    /// Kafka's `schedulePendingSync`: members that do not send SyncGroup within the rebalance
    /// timeout are removed, and the group rebalances.
    fn schedule_pending_sync(self: &Arc<Self>, g: &mut Group) {
        g.pending_sync = g.members.iter().map(|m| m.id.clone()).collect();
        let this = self.clone();
        let group_id = g.id.clone();
        let generation = g.generation;
        let at = Instant::now() + rebalance_timeout_of(g);
        tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            let Some(group) = this.existing(&group_id) else {
                return;
            };
            let mut g = group.lock();
            if g.generation != generation
                || !matches!(g.state, State::CompletingRebalance | State::Stable)
                || g.pending_sync.is_empty()
            {
                return;
            }
            let late: Vec<String> = g.pending_sync.drain().collect();
            for id in late {
                if let Some(i) = g.members.iter().position(|m| m.id == id) {
                    let m = g.members.remove(i);
                    info!(group = %g.id, member = %id, "member did not sync in time: removed");
                    answer_removed(m);
                }
            }
            if g.leader.as_ref().is_none_or(|l| !g.has(l)) {
                g.leader = g.members.first().map(|m| m.id.clone());
            }
            this.maybe_prepare_rebalance(&mut g);
        });
    }

    /// SyncGroup: waits for the leader's assignments (stored before anyone gets one).
    pub(crate) async fn sync(
        self: &Arc<Self>,
        group_id: &str,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
        protocol: (Option<&str>, Option<&str>),
        assignments: Vec<(String, Bytes)>,
    ) -> SyncOutcome {
        let Some(group) = self.existing(group_id) else {
            return SyncOutcome::error(codes::UNKNOWN_MEMBER_ID);
        };
        let rx = {
            let mut g = group.lock();
            if g.state == State::Dead {
                return SyncOutcome::error(codes::COORDINATOR_NOT_AVAILABLE);
            }
            if let Some(error) = g.validate_member(member_id, instance_id) {
                return SyncOutcome::error(error);
            }
            if generation != g.generation {
                return SyncOutcome::error(codes::ILLEGAL_GENERATION);
            }
            let (protocol_type, protocol_name) = protocol;
            if protocol_type.is_some_and(|t| g.protocol_type.as_deref() != Some(t))
                || protocol_name.is_some_and(|n| g.protocol_name.as_deref() != Some(n))
            {
                return SyncOutcome::error(codes::INCONSISTENT_GROUP_PROTOCOL);
            }
            let is_leader = g.leader.as_deref() == Some(member_id);
            let group_protocol = (g.protocol_type.clone(), g.protocol_name.clone());
            let state = g.state;
            let Some(m) = g.member(member_id) else {
                return SyncOutcome::error(codes::UNKNOWN_MEMBER_ID);
            };
            m.last_seen = Instant::now();
            if matches!(state, State::CompletingRebalance | State::Stable) {
                g.pending_sync.remove(member_id);
            }
            let Some(m) = g.member(member_id) else {
                return SyncOutcome::error(codes::UNKNOWN_MEMBER_ID);
            };
            match state {
                State::Empty | State::Dead => return SyncOutcome::error(codes::UNKNOWN_MEMBER_ID),
                State::PreparingRebalance => {
                    return SyncOutcome::error(codes::REBALANCE_IN_PROGRESS);
                }
                State::Stable => {
                    return SyncOutcome {
                        error: codes::NONE,
                        assignment: m.assignment.clone(),
                        protocol_type: group_protocol.0,
                        protocol_name: group_protocol.1,
                    };
                }
                State::CompletingRebalance => {}
            }
            let (tx, rx) = oneshot::channel();
            if let Some(old) = m.sync.replace(tx) {
                let _ = old.send(SyncOutcome::error(codes::REBALANCE_IN_PROGRESS));
            }
            if is_leader {
                info!(group = %g.id, generation = g.generation, members = g.members.len(), "assignment received from the leader");
                let mut by_member: HashMap<String, Bytes> = assignments.into_iter().collect();
                by_member.retain(|id, _| g.has(id));
                for m in &g.members {
                    by_member.entry(m.id.clone()).or_default();
                }
                let stored = self.store_group(&g, Some(&by_member));
                let this = self.clone();
                let group = group.clone();
                let generation = g.generation;
                tokio::spawn(async move {
                    let ok = stored.await.unwrap_or(false);
                    let mut g = group.lock();
                    if g.state != State::CompletingRebalance || g.generation != generation {
                        return;
                    }
                    if ok {
                        for m in &mut g.members {
                            m.assignment = by_member.remove(&m.id).unwrap_or_default();
                        }
                        g.state = State::Stable;
                        info!(group = %g.id, generation = g.generation, members = g.members.len(), "group stable");
                        propagate(&mut g, codes::NONE);
                    } else {
                        warn!(group = %g.id, "cannot store the group's assignment: rebalancing");
                        for m in &mut g.members {
                            m.assignment = Bytes::new();
                        }
                        propagate(&mut g, codes::COORDINATOR_NOT_AVAILABLE);
                        this.maybe_prepare_rebalance(&mut g);
                    }
                });
            }
            rx
        };
        rx.await
            .unwrap_or_else(|_| SyncOutcome::error(codes::REBALANCE_IN_PROGRESS))
    }

    /// Heartbeat: the error code.
    pub(crate) fn heartbeat(
        &self,
        group_id: &str,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> i16 {
        let Some(group) = self.existing(group_id) else {
            return codes::UNKNOWN_MEMBER_ID;
        };
        let mut g = group.lock();
        if g.state == State::Dead {
            return codes::COORDINATOR_NOT_AVAILABLE;
        }
        if let Some(error) = g.validate_member(member_id, instance_id) {
            return error;
        }
        if generation != g.generation {
            return codes::ILLEGAL_GENERATION;
        }
        let state = g.state;
        if let Some(m) = g.member(member_id) {
            m.last_seen = Instant::now();
        }
        match state {
            State::PreparingRebalance => codes::REBALANCE_IN_PROGRESS,
            State::CompletingRebalance | State::Stable => codes::NONE,
            State::Empty | State::Dead => codes::UNKNOWN_MEMBER_ID,
        }
    }

    /// LeaveGroup of (member id, group instance id) pairs; a member id may be empty to remove a
    /// static member by its instance id. `Err`: the error of the whole request.
    pub(crate) fn leave(
        self: &Arc<Self>,
        group_id: &str,
        members: &[(String, Option<String>)],
    ) -> Result<Vec<i16>, i16> {
        let Some(group) = self.existing(group_id) else {
            return Ok(vec![codes::UNKNOWN_MEMBER_ID; members.len()]);
        };
        let mut g = group.lock();
        if g.state == State::Dead {
            return Err(codes::COORDINATOR_NOT_AVAILABLE);
        }
        let mut out = Vec::with_capacity(members.len());
        for (member_id, instance_id) in members {
            let code = if member_id.is_empty() {
                match instance_id.as_deref().and_then(|i| g.static_member(i)) {
                    Some(current) => {
                        self.remove_member(&mut g, &current, "left (by group instance id)");
                        codes::NONE
                    }
                    None => codes::UNKNOWN_MEMBER_ID,
                }
            } else if g.pending.remove(member_id).is_some() {
                if g.state == State::PreparingRebalance {
                    self.try_complete_join(&mut g, false);
                }
                codes::NONE
            } else {
                match g.validate_member(member_id, instance_id.as_deref()) {
                    Some(error) => error,
                    None => {
                        self.remove_member(&mut g, member_id, "left");
                        codes::NONE
                    }
                }
            };
            out.push(code);
        }
        Ok(out)
    }

    /// Kafka's `removeMemberAndUpdateGroup`.
    fn remove_member(self: &Arc<Self>, g: &mut Group, member_id: &str, why: &str) {
        let Some(i) = g.members.iter().position(|m| m.id == member_id) else {
            return;
        };
        let m = g.members.remove(i);
        g.pending_sync.remove(member_id);
        info!(group = %g.id, member = %member_id, instance = ?m.instance_id, "member {why}");
        answer_removed(m);
        if g.leader.as_deref() == Some(member_id) {
            g.leader = g.members.first().map(|m| m.id.clone());
        }
        match g.state {
            State::Stable | State::CompletingRebalance => self.maybe_prepare_rebalance(g),
            State::PreparingRebalance => {
                self.try_complete_join(g, false);
            }
            State::Empty | State::Dead => {}
        }
    }

    /// Whether an OffsetCommit of this member may be stored (Kafka's `validateOffsetCommit`; the
    /// error code); a commit counts as a heartbeat. A commit from outside the group protocol
    /// (generation < 0) creates the group if it does not exist.
    pub(crate) fn validate_commit(
        &self,
        group_id: &str,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> i16 {
        self.validate_commit_of(group_id, generation, member_id, instance_id, false)
    }

    /// Whether a TxnOffsetCommit of this member may be stored: as [`Self::validate_commit`],
    /// except (Kafka's `isTransactional`) that a commit without member and generation is accepted
    /// whatever the group's state (older TxnOffsetCommit versions carry neither) and a rebalance
    /// in progress does not refuse it.
    pub(crate) fn validate_txn_commit(
        &self,
        group_id: &str,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> i16 {
        self.validate_commit_of(group_id, generation, member_id, instance_id, true)
    }

    fn validate_commit_of(
        &self,
        group_id: &str,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
        transactional: bool,
    ) -> i16 {
        let group = match self.existing(group_id) {
            Some(g) => g,
            None if generation < 0 => self.group(group_id),
            None => return codes::ILLEGAL_GENERATION,
        };
        let mut g = group.lock();
        if g.state == State::Dead {
            return codes::COORDINATOR_NOT_AVAILABLE;
        }
        if generation < 0 && g.state == State::Empty {
            return codes::NONE;
        }
        if generation >= 0 || !member_id.is_empty() || instance_id.is_some() {
            if let Some(error) = g.validate_member(member_id, instance_id) {
                return error;
            }
            if generation != g.generation {
                return codes::ILLEGAL_GENERATION;
            }
        } else if g.state != State::Empty && !transactional {
            // Only members commit for a group with members.
            return codes::UNKNOWN_MEMBER_ID;
        }
        let state = g.state;
        if let Some(m) = g.member(member_id) {
            m.last_seen = Instant::now();
        }
        match state {
            State::CompletingRebalance if !transactional => codes::REBALANCE_IN_PROGRESS,
            _ => codes::NONE,
        }
    }

    /// ListGroups: (group id, protocol type, state) of the groups in one of `states` (all if
    /// empty; compared case-insensitively, as Kafka).
    pub(crate) fn list(&self, states: &[String]) -> Vec<(String, String, &'static str)> {
        let states: Vec<String> = states.iter().map(|s| s.to_lowercase()).collect();
        let groups: Vec<Arc<Mutex<Group>>> = self.groups.lock().values().cloned().collect();
        let mut out: Vec<(String, String, &'static str)> = groups
            .iter()
            .map(|g| {
                let g = g.lock();
                (
                    g.id.clone(),
                    g.protocol_type.clone().unwrap_or_default(),
                    g.state.name(),
                )
            })
            .filter(|(_, _, state)| state != &"Dead")
            .filter(|(_, _, state)| states.is_empty() || states.contains(&state.to_lowercase()))
            .collect();
        out.sort();
        out
    }

    /// DescribeGroups of one group (Kafka's `GroupSummary`; a group that does not exist is `Dead`).
    pub(crate) fn describe(&self, group_id: &str) -> GroupSummary {
        let dead = GroupSummary {
            state: State::Dead.name(),
            protocol_type: String::new(),
            protocol: String::new(),
            members: Vec::new(),
        };
        let Some(group) = self.existing(group_id) else {
            return dead;
        };
        let g = group.lock();
        let stable = g.state == State::Stable;
        let protocol = if stable {
            g.protocol_name.clone().unwrap_or_default()
        } else {
            String::new()
        };
        GroupSummary {
            state: g.state.name(),
            protocol_type: g.protocol_type.clone().unwrap_or_default(),
            members: g
                .members
                .iter()
                .map(|m| MemberSummary {
                    member_id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    metadata: if stable {
                        m.metadata(&protocol)
                    } else {
                        Bytes::new()
                    },
                    assignment: if stable {
                        m.assignment.clone()
                    } else {
                        Bytes::new()
                    },
                })
                .collect(),
            protocol,
        }
    }

    /// DeleteGroups of one group: only an empty group is deleted, with its committed offsets.
    pub(crate) async fn delete(&self, group_id: &str) -> i16 {
        let Some(group) = self.existing(group_id) else {
            return GROUP_ID_NOT_FOUND;
        };
        let stored = {
            let mut g = group.lock();
            match g.state {
                State::Dead => return GROUP_ID_NOT_FOUND,
                State::Empty => {}
                State::PreparingRebalance | State::CompletingRebalance | State::Stable => {
                    return NON_EMPTY_GROUP;
                }
            }
            g.state = State::Dead;
            let mut groups = self.groups.lock();
            if groups.get(group_id).is_some_and(|x| Arc::ptr_eq(x, &group)) {
                groups.remove(group_id);
            }
            let id = group_id.to_string();
            self.write(|tx| Write::Delete(id, tx))
        };
        if stored.await.unwrap_or(false) {
            info!(group = %group_id, "group deleted");
            codes::NONE
        } else {
            codes::COORDINATOR_NOT_AVAILABLE
        }
    }

    /// OffsetDelete: which of `topics` the group consumes (their offsets are not deleted), or the
    /// error of the whole request (Kafka's `handleDeleteOffsets`).
    pub(crate) fn offsets_deletable(
        &self,
        group_id: &str,
        topics: &[String],
    ) -> Result<HashSet<String>, i16> {
        let Some(group) = self.existing(group_id) else {
            return Err(GROUP_ID_NOT_FOUND);
        };
        let g = group.lock();
        match g.state {
            State::Dead => Err(GROUP_ID_NOT_FOUND),
            State::Empty => Ok(HashSet::new()),
            _ if g.protocol_type.as_deref() == Some(CONSUMER) => {
                let subscribed = g.subscribed_topics();
                Ok(topics
                    .iter()
                    .filter(|t| subscribed.as_ref().is_none_or(|s| s.contains(*t)))
                    .cloned()
                    .collect())
            }
            _ => Err(NON_EMPTY_GROUP),
        }
    }

    /// Removes members whose session expired, and pending member ids never used; runs until
    /// aborted.
    pub(crate) async fn run_expiry(self: Arc<Self>) {
        let mut wake = Instant::now() + EXPIRY_CHECK;
        loop {
            tokio::time::sleep_until(wake).await;
            let groups: Vec<Arc<Mutex<Group>>> = self.groups.lock().values().cloned().collect();
            let now = Instant::now();
            let mut next = now + EXPIRY_CHECK;
            for group in groups {
                let mut g = group.lock();
                let before = g.pending.len();
                g.pending.retain(|_, deadline| *deadline > now);
                if g.pending.len() != before && g.state == State::PreparingRebalance {
                    self.try_complete_join(&mut g, false);
                }
                let expired: Vec<String> = g
                    .members
                    .iter()
                    .filter(|m| m.join.is_none() && m.sync.is_none())
                    .filter(|m| now.duration_since(m.last_seen) > m.session_timeout)
                    .map(|m| m.id.clone())
                    .collect();
                for id in &expired {
                    self.remove_member(&mut g, id, "session expired: removed");
                }
                let deadlines = g
                    .members
                    .iter()
                    .filter(|m| m.join.is_none() && m.sync.is_none())
                    .map(|m| m.last_seen + m.session_timeout)
                    .chain(g.pending.values().copied());
                if let Some(d) = deadlines.min() {
                    next = next.min(d);
                }
            }
            // Just past the earliest deadline (`>` above), never busy-looping.
            wake = (next + Duration::from_micros(100)).max(now + EXPIRY_SLACK);
        }
    }
}

/// Writes group metadata in the order it changed.
async fn write_loop(store: Store, mut rx: mpsc::UnboundedReceiver<Write>) {
    while let Some(w) = rx.recv().await {
        match w {
            Write::Save(record, done) => {
                let result = store.save_group(&record).await;
                if let Err(e) = &result {
                    warn!(group = %record.group_id, error = %e, "cannot store group metadata");
                }
                let _ = done.send(result.is_ok());
            }
            Write::Delete(group, done) => {
                let result = store.delete_group(&group).await;
                if let Err(e) = &result {
                    warn!(group = %group, error = %e, "cannot delete the group");
                }
                let _ = done.send(result.is_ok());
            }
        }
    }
}

/// The rebalance timeout of a group: the largest of its members'.
fn rebalance_timeout_of(g: &Group) -> Duration {
    g.members
        .iter()
        .map(|m| m.rebalance_timeout)
        .max()
        .unwrap_or(MIN_SESSION_TIMEOUT)
}

/// Before JoinGroup version 1 the rebalance timeout is the session timeout.
fn rebalance_timeout(ms_value: i32, session_timeout: Duration) -> Duration {
    match u64::try_from(ms_value) {
        Ok(v) if v > 0 => Duration::from_millis(v),
        _ => session_timeout,
    }
}

/// Kafka's `updateMember`: new protocols and timeouts, and the pending JoinGroup.
fn update_member(g: &mut Group, member_id: &str, p: JoinParams, tx: oneshot::Sender<JoinOutcome>) {
    let Some(m) = g.member(member_id) else {
        return;
    };
    if let Some(old) = m.join.replace(tx) {
        let _ = old.send(JoinOutcome::error(
            codes::REBALANCE_IN_PROGRESS,
            member_id.to_string(),
        ));
    }
    let session_timeout = ms(p.session_timeout_ms);
    m.protocols = p.protocols;
    m.protocol_type = p.protocol_type;
    m.session_timeout = session_timeout;
    m.rebalance_timeout = rebalance_timeout(p.rebalance_timeout_ms, session_timeout);
    m.last_seen = Instant::now();
}

/// The JoinGroup answer of the current generation for a member (the member list for the leader
/// when `with_members`).
fn join_answer(g: &Group, member_id: &str, with_members: bool) -> JoinOutcome {
    let leader = g.leader.clone().unwrap_or_default();
    let protocol = g.protocol_name.clone().unwrap_or_default();
    JoinOutcome {
        error: codes::NONE,
        generation: g.generation,
        protocol_type: g.protocol_type.clone(),
        protocol_name: g.protocol_name.clone(),
        member_id: member_id.to_string(),
        members: if with_members && leader == member_id {
            g.members
                .iter()
                .map(|m| (m.id.clone(), m.instance_id.clone(), m.metadata(&protocol)))
                .collect()
        } else {
            Vec::new()
        },
        leader,
        skip_assignment: false,
    }
}

/// Answers every waiting SyncGroup with its member's assignment (or `error`).
fn propagate(g: &mut Group, error: i16) {
    let (protocol_type, protocol_name) = if error == codes::NONE {
        (g.protocol_type.clone(), g.protocol_name.clone())
    } else {
        (None, None)
    };
    let now = Instant::now();
    for m in &mut g.members {
        if let Some(tx) = m.sync.take() {
            m.last_seen = now;
            let _ = tx.send(SyncOutcome {
                error,
                assignment: m.assignment.clone(),
                protocol_type: protocol_type.clone(),
                protocol_name: protocol_name.clone(),
            });
        }
    }
}

/// Answers the pending requests of a removed member.
fn answer_removed(m: Member) {
    if let Some(tx) = m.join {
        let _ = tx.send(JoinOutcome::error(codes::UNKNOWN_MEMBER_ID, String::new()));
    }
    if let Some(tx) = m.sync {
        let _ = tx.send(SyncOutcome::error(codes::UNKNOWN_MEMBER_ID));
    }
}

#[cfg(test)]
mod tests {
    use kafka_protocol::protocol::StrBytes;

    use super::*;

    fn params(member: &str) -> JoinParams {
        JoinParams {
            group_id: "g".into(),
            member_id: member.into(),
            instance_id: None,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            require_known_member_id: false,
            support_skipping_assignment: false,
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 5_000,
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"m"))],
        }
    }

    fn static_params(member: &str, instance: &str) -> JoinParams {
        JoinParams {
            instance_id: Some(instance.into()),
            ..params(member)
        }
    }

    async fn sync(
        gc: &Arc<GroupCoordinator>,
        j: &JoinOutcome,
        assignments: Vec<(String, Bytes)>,
    ) -> SyncOutcome {
        gc.sync(
            "g",
            j.generation,
            &j.member_id,
            None,
            (None, None),
            assignments,
        )
        .await
    }

    /// Two static members join and sync; returns (leader, follower) joins.
    async fn stable_static_pair(gc: &Arc<GroupCoordinator>) -> (JoinOutcome, JoinOutcome) {
        let (a, b) = tokio::join!(
            gc.join(static_params("", "i-a")),
            gc.join(static_params("", "i-b"))
        );
        assert_eq!((a.error, b.error), (codes::NONE, codes::NONE));
        let (leader, follower) = if a.members.is_empty() { (b, a) } else { (a, b) };
        let assignments = vec![
            (leader.member_id.clone(), Bytes::from_static(b"L")),
            (follower.member_id.clone(), Bytes::from_static(b"F")),
        ];
        let (fs, ls) = tokio::join!(
            sync(gc, &follower, Vec::new()),
            sync(gc, &leader, assignments)
        );
        assert_eq!(
            (&fs.assignment[..], &ls.assignment[..]),
            (&b"F"[..], &b"L"[..])
        );
        (leader, follower)
    }

    #[tokio::test(start_paused = true)]
    async fn two_members_rebalance_and_sync() {
        let gc = GroupCoordinator::new();
        // Two members join an empty group together: one generation with both.
        let (a, b) = tokio::join!(gc.join(params("")), gc.join(params("")));
        assert_eq!(a.error, codes::NONE);
        assert_eq!(b.error, codes::NONE);
        assert_eq!(a.generation, b.generation);
        let (leader, follower) = if a.members.is_empty() { (b, a) } else { (a, b) };
        assert_eq!(leader.members.len(), 2);
        assert_eq!(leader.leader, leader.member_id);
        let generation = leader.generation;
        let assignments = vec![
            (leader.member_id.clone(), Bytes::from_static(b"L")),
            (follower.member_id.clone(), Bytes::from_static(b"F")),
        ];
        let (fs, ls) = tokio::join!(
            sync(&gc, &follower, Vec::new()),
            sync(&gc, &leader, assignments),
        );
        assert_eq!(fs.error, codes::NONE);
        assert_eq!(&fs.assignment[..], b"F");
        assert_eq!(&ls.assignment[..], b"L");
        assert_eq!(
            gc.heartbeat("g", generation, &follower.member_id, None),
            codes::NONE
        );
        assert_eq!(
            gc.heartbeat("g", generation + 1, &follower.member_id, None),
            codes::ILLEGAL_GENERATION
        );
        assert_eq!(
            gc.validate_commit("g", generation, &leader.member_id, None),
            codes::NONE
        );
        // Only members commit for a group with members.
        assert_eq!(
            gc.validate_commit("g", -1, "", None),
            codes::UNKNOWN_MEMBER_ID
        );
        assert_eq!(gc.delete("g").await, NON_EMPTY_GROUP);

        // The leader leaves: the follower is told to rejoin and becomes the only member.
        assert_eq!(
            gc.leave("g", &[(leader.member_id.clone(), None)]),
            Ok(vec![codes::NONE])
        );
        assert_eq!(
            gc.heartbeat("g", generation, &follower.member_id, None),
            codes::REBALANCE_IN_PROGRESS
        );
        let again = gc.join(params(&follower.member_id)).await;
        assert_eq!(again.error, codes::NONE);
        assert_eq!(again.generation, generation + 1);
        assert_eq!(again.leader, follower.member_id);
        assert_eq!(again.members.len(), 1);
        // The last member leaves: the group is empty, and can be deleted.
        assert_eq!(
            gc.leave("g", &[(follower.member_id.clone(), None)]),
            Ok(vec![codes::NONE])
        );
        assert_eq!(gc.describe("g").state, "Empty");
        assert_eq!(gc.delete("g").await, codes::NONE);
        assert_eq!(gc.delete("g").await, GROUP_ID_NOT_FOUND);
        assert_eq!(gc.describe("g").state, "Dead");
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_that_does_not_rejoin_is_dropped_at_the_rebalance_timeout() {
        let gc = GroupCoordinator::new();
        let first = gc.join(params("")).await;
        assert_eq!(first.error, codes::NONE);
        let s = sync(
            &gc,
            &first,
            vec![(first.member_id.clone(), Bytes::from_static(b"x"))],
        )
        .await;
        assert_eq!(s.error, codes::NONE);
        // A second member joins; the first never rejoins.
        let second = gc.join(params("")).await;
        assert_eq!(second.error, codes::NONE);
        assert_eq!(second.members.len(), 1, "only the second member is left");
        assert_eq!(
            gc.heartbeat("g", second.generation, &first.member_id, None),
            codes::UNKNOWN_MEMBER_ID
        );
        assert_eq!(
            gc.join(params("nobody")).await.error,
            codes::UNKNOWN_MEMBER_ID
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_that_does_not_sync_is_removed_at_the_rebalance_timeout() {
        let gc = GroupCoordinator::new();
        let (a, b) = tokio::join!(gc.join(params("")), gc.join(params("")));
        let (leader, follower) = if a.members.is_empty() { (b, a) } else { (a, b) };
        let s = sync(
            &gc,
            &leader,
            vec![(leader.member_id.clone(), Bytes::from_static(b"L"))],
        )
        .await;
        assert_eq!(s.error, codes::NONE);
        // The follower heartbeats but never sends SyncGroup.
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(
            gc.heartbeat("g", leader.generation, &follower.member_id, None),
            codes::NONE
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            gc.heartbeat("g", leader.generation, &follower.member_id, None),
            codes::UNKNOWN_MEMBER_ID
        );
        assert_eq!(
            gc.heartbeat("g", leader.generation, &leader.member_id, None),
            codes::REBALANCE_IN_PROGRESS
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_dynamic_member_must_join_with_the_id_it_is_given() {
        let gc = GroupCoordinator::new();
        let first = gc
            .join(JoinParams {
                require_known_member_id: true,
                ..params("")
            })
            .await;
        assert_eq!(first.error, MEMBER_ID_REQUIRED);
        assert!(first.member_id.starts_with("c-"), "{}", first.member_id);
        let joined = gc.join(params(&first.member_id)).await;
        assert_eq!(joined.error, codes::NONE);
        assert_eq!(joined.member_id, first.member_id);
        assert_eq!(joined.leader, first.member_id);
    }

    #[tokio::test(start_paused = true)]
    async fn a_static_member_rejoining_keeps_its_assignment_without_a_rebalance() {
        let gc = GroupCoordinator::new();
        let (leader, follower) = stable_static_pair(&gc).await;
        let generation = leader.generation;
        let instance = if follower.member_id.starts_with("i-a") {
            "i-a"
        } else {
            "i-b"
        };
        // The follower restarts: a JoinGroup without member id, same instance id.
        let rejoined = gc.join(static_params("", instance)).await;
        assert_eq!(rejoined.error, codes::NONE);
        assert_ne!(rejoined.member_id, follower.member_id);
        assert_eq!(rejoined.generation, generation, "no new generation");
        assert_eq!(rejoined.leader, leader.member_id);
        assert!(rejoined.members.is_empty());
        let s = sync(&gc, &rejoined, Vec::new()).await;
        assert_eq!(s.error, codes::NONE);
        assert_eq!(&s.assignment[..], b"F", "the old assignment");
        // The other member sees no rebalance.
        assert_eq!(
            gc.heartbeat("g", generation, &leader.member_id, None),
            codes::NONE
        );
        assert_eq!(gc.describe("g").state, "Stable");
        // The old member id is fenced.
        assert_eq!(
            gc.heartbeat("g", generation, &follower.member_id, Some(instance)),
            FENCED_INSTANCE_ID
        );
        assert_eq!(
            gc.validate_commit("g", generation, &follower.member_id, Some(instance)),
            FENCED_INSTANCE_ID
        );
        assert_eq!(
            gc.heartbeat("g", generation, &rejoined.member_id, Some(instance)),
            codes::NONE
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_rejoining_static_leader_skips_the_assignment_from_version_9() {
        let gc = GroupCoordinator::new();
        let (leader, _) = stable_static_pair(&gc).await;
        let instance = &leader.member_id[..3];
        // Before version 9: answered with the old leader id (it does not lead, assigns nothing).
        let old = gc.join(static_params("", instance)).await;
        assert_eq!(old.error, codes::NONE);
        assert_eq!(old.generation, leader.generation);
        assert_eq!(old.leader, leader.member_id);
        assert!(old.members.is_empty() && !old.skip_assignment);
        // Version 9: it is told it leads, with the members, and to skip the assignment.
        let new = gc
            .join(JoinParams {
                support_skipping_assignment: true,
                ..static_params("", instance)
            })
            .await;
        assert_eq!(new.error, codes::NONE);
        assert_eq!(new.generation, leader.generation);
        assert_eq!(new.leader, new.member_id);
        assert_eq!(new.members.len(), 2);
        assert!(new.skip_assignment);
        let s = sync(&gc, &new, Vec::new()).await;
        assert_eq!(&s.assignment[..], b"L");
        assert_eq!(gc.describe("g").state, "Stable");
    }

    #[tokio::test(start_paused = true)]
    async fn static_members_leave_by_instance_id_in_one_request() {
        let gc = GroupCoordinator::new();
        let (leader, _) = stable_static_pair(&gc).await;
        let out = gc.leave(
            "g",
            &[
                (String::new(), Some("i-a".into())),
                (String::new(), Some("i-b".into())),
                (String::new(), Some("i-unknown".into())),
            ],
        );
        assert_eq!(
            out,
            Ok(vec![codes::NONE, codes::NONE, codes::UNKNOWN_MEMBER_ID])
        );
        assert_eq!(gc.describe("g").state, "Empty");
        assert_eq!(
            gc.heartbeat("g", leader.generation, &leader.member_id, None),
            codes::UNKNOWN_MEMBER_ID
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_static_member_is_kept_when_a_rebalance_times_out_without_it() {
        let gc = GroupCoordinator::new();
        let (leader, follower) = stable_static_pair(&gc).await;
        // The leader rejoins (a rebalance); the follower does not within the rebalance timeout.
        let again = gc
            .join(static_params(
                &leader.member_id,
                leader
                    .member_id
                    .split('-')
                    .take(2)
                    .collect::<Vec<_>>()
                    .join("-")
                    .as_str(),
            ))
            .await;
        assert_eq!(again.error, codes::NONE);
        assert_eq!(again.generation, leader.generation + 1);
        assert_eq!(again.members.len(), 2, "the static follower stays a member");
        let summary = gc.describe("g");
        assert!(
            summary
                .members
                .iter()
                .any(|m| m.member_id == follower.member_id)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_loaded_group_accepts_its_members_old_generation() {
        // What a restarted broker loads: a stable group of one member.
        let mut record = GroupRecord {
            group_id: "g".into(),
            protocol_type: Some("consumer".into()),
            generation: 7,
            protocol_name: Some("range".into()),
            leader: Some("m-1".into()),
            state_time_ms: 0,
            members: Vec::new(),
        };
        record.members.push(MemberRecord {
            member_id: "m-1".into(),
            instance_id: None,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            rebalance_timeout_ms: 5_000,
            session_timeout_ms: 10_000,
            subscription: b"m".to_vec(),
            assignment: b"A".to_vec(),
        });
        let gc = GroupCoordinator::new();
        gc.groups.lock().insert(
            "g".into(),
            Arc::new(Mutex::new(Group::from_record(
                record.clone(),
                Instant::now(),
            ))),
        );
        assert_eq!(gc.validate_commit("g", 7, "m-1", None), codes::NONE);
        assert_eq!(gc.heartbeat("g", 7, "m-1", None), codes::NONE);
        assert_eq!(
            gc.validate_commit("g", 6, "m-1", None),
            codes::ILLEGAL_GENERATION
        );
        let s = gc.sync("g", 7, "m-1", None, (None, None), Vec::new()).await;
        assert_eq!(&s.assignment[..], b"A");
        // What it would store again is what it loaded.
        let g = gc.existing("g").unwrap();
        assert_eq!(g.lock().record(None, 0), record);
    }

    #[test]
    fn offsets_of_subscribed_topics_are_not_deletable() {
        let gc = GroupCoordinator::new();
        let mut subscription = ConsumerProtocolSubscription::default();
        subscription.topics = vec![StrBytes::from_static_str("t1")];
        let mut metadata = bytes::BytesMut::new();
        metadata.extend_from_slice(&1i16.to_be_bytes());
        kafka_protocol::protocol::Encodable::encode(&subscription, &mut metadata, 1).unwrap();
        let record = GroupRecord {
            group_id: "g".into(),
            protocol_type: Some("consumer".into()),
            generation: 1,
            protocol_name: Some("range".into()),
            leader: Some("m".into()),
            state_time_ms: 0,
            members: vec![MemberRecord {
                member_id: "m".into(),
                subscription: metadata.to_vec(),
                session_timeout_ms: 10_000,
                ..MemberRecord::default()
            }],
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _guard = rt.enter();
        gc.groups.lock().insert(
            "g".into(),
            Arc::new(Mutex::new(Group::from_record(record, Instant::now()))),
        );
        let topics = vec!["t1".to_string(), "t2".to_string()];
        assert_eq!(
            gc.offsets_deletable("g", &topics),
            Ok(HashSet::from(["t1".to_string()]))
        );
        assert_eq!(
            gc.offsets_deletable("nope", &topics),
            Err(GROUP_ID_NOT_FOUND)
        );
        assert_eq!(gc.list(&["stable".into()]).len(), 1);
        assert!(gc.list(&["Empty".into()]).is_empty());
    }
}
