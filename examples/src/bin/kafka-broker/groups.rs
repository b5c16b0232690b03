//! The classic consumer-group protocol: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup (group state in memory, shared by every logical broker of the process).
//!
//! The state machine is Kafka's, reduced to what group consumers need:
//!
//! - `Empty` → a JoinGroup starts a rebalance (`PreparingRebalance`). The first rebalance of an empty
//!   group waits [`INITIAL_REBALANCE_DELAY`] so that members starting together land in one generation.
//! - A rebalance completes when every known member has sent JoinGroup, or at the rebalance timeout
//!   (the largest of the members'), dropping members that did not rejoin. The generation is bumped,
//!   a protocol all members support is chosen, the leader gets the member list.
//! - `CompletingRebalance`: SyncGroup requests wait for the leader's, which carries the assignments;
//!   then every member gets its own and the group is `Stable`.
//! - Heartbeats answer `REBALANCE_IN_PROGRESS` while a rebalance runs, so that members rejoin.
//!   Members that stop heartbeating for their session timeout are removed (a rebalance follows).
//!
//! Static membership (`group.instance.id`) is accepted but treated as dynamic.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{
    BrokerId, FindCoordinatorRequest, FindCoordinatorResponse, HeartbeatRequest, HeartbeatResponse,
    JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, SyncGroupRequest,
    SyncGroupResponse,
};
use kafka_protocol::protocol::StrBytes;
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{debug, info};

use crate::broker::Broker;
use crate::codes;
use crate::server::Ctx;

/// How long the first rebalance of an empty group waits for more members
/// (Kafka's `group.initial.rebalance.delay.ms`).
const INITIAL_REBALANCE_DELAY: Duration = Duration::from_millis(1500);
/// Session timeouts accepted (Kafka's `group.min/max.session.timeout.ms`).
const MIN_SESSION_TIMEOUT: Duration = Duration::from_secs(1);
const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// How often expired members are looked for.
const EXPIRY_CHECK: Duration = Duration::from_millis(500);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
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
}

impl JoinOutcome {
    fn error(error: i16, member_id: String) -> JoinOutcome {
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
    fn error(error: i16) -> SyncOutcome {
        SyncOutcome {
            error,
            ..SyncOutcome::default()
        }
    }
}

struct Member {
    id: String,
    instance_id: Option<String>,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    protocol_type: String,
    protocols: Vec<(String, Bytes)>,
    join: Option<oneshot::Sender<JoinOutcome>>,
    sync: Option<oneshot::Sender<SyncOutcome>>,
    assignment: Bytes,
    last_seen: Instant,
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
    /// Identifies the current rebalance (its timers ignore later ones).
    rebalance: u64,
    /// The first rebalance of an empty group does not complete before this.
    delay_until: Option<Instant>,
}

impl Group {
    fn member(&mut self, id: &str) -> Option<&mut Member> {
        self.members.iter_mut().find(|m| m.id == id)
    }
}

/// What a JoinGroup asks for.
pub(crate) struct JoinParams {
    pub group_id: String,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
}

/// All groups.
pub(crate) struct GroupCoordinator {
    groups: Mutex<HashMap<String, Arc<Mutex<Group>>>>,
    initial_delay: Duration,
}

impl GroupCoordinator {
    pub(crate) fn new() -> Arc<GroupCoordinator> {
        Arc::new(GroupCoordinator {
            groups: Mutex::new(HashMap::new()),
            initial_delay: INITIAL_REBALANCE_DELAY,
        })
    }

    fn group(&self, id: &str) -> Arc<Mutex<Group>> {
        self.groups
            .lock()
            .entry(id.to_string())
            .or_insert_with(|| {
                Arc::new(Mutex::new(Group {
                    id: id.to_string(),
                    state: State::Empty,
                    generation: 0,
                    protocol_type: None,
                    protocol_name: None,
                    leader: None,
                    members: Vec::new(),
                    rebalance: 0,
                    delay_until: None,
                }))
            })
            .clone()
    }

    fn existing(&self, id: &str) -> Option<Arc<Mutex<Group>>> {
        self.groups.lock().get(id).cloned()
    }

    /// JoinGroup: waits until the rebalance completes.
    pub(crate) async fn join(self: &Arc<Self>, p: JoinParams) -> JoinOutcome {
        let session_timeout =
            Duration::from_millis(u64::try_from(p.session_timeout_ms).unwrap_or(0));
        if !(MIN_SESSION_TIMEOUT..=MAX_SESSION_TIMEOUT).contains(&session_timeout) {
            return JoinOutcome::error(codes::INVALID_SESSION_TIMEOUT, p.member_id);
        }
        if p.group_id.is_empty() {
            return JoinOutcome::error(codes::INVALID_GROUP_ID, p.member_id);
        }
        if p.protocol_type.is_empty() || p.protocols.is_empty() {
            return JoinOutcome::error(codes::INCONSISTENT_GROUP_PROTOCOL, p.member_id);
        }
        // Before version 1 the rebalance timeout is the session timeout.
        let rebalance_timeout = match u64::try_from(p.rebalance_timeout_ms) {
            Ok(ms) if ms > 0 => Duration::from_millis(ms),
            _ => session_timeout,
        };
        let group = self.group(&p.group_id);
        let rx = {
            let mut g = group.lock();
            let others: Vec<&Member> = g.members.iter().filter(|m| m.id != p.member_id).collect();
            if !others.is_empty() {
                let same_type = others.iter().all(|m| m.protocol_type == p.protocol_type);
                let common = p.protocols.iter().any(|(name, _)| {
                    others
                        .iter()
                        .all(|m| m.protocols.iter().any(|(n, _)| n == name))
                });
                if !same_type || !common {
                    return JoinOutcome::error(codes::INCONSISTENT_GROUP_PROTOCOL, p.member_id);
                }
            }
            let member_id = if p.member_id.is_empty() {
                format!("{}-{}", p.client_id, crate::random_uuid())
            } else if g.members.iter().any(|m| m.id == p.member_id) {
                p.member_id.clone()
            } else {
                return JoinOutcome::error(codes::UNKNOWN_MEMBER_ID, p.member_id);
            };
            let (tx, rx) = oneshot::channel();
            let now = Instant::now();
            match g.member(&member_id) {
                Some(m) => {
                    if let Some(old) = m.join.replace(tx) {
                        let _ = old.send(JoinOutcome::error(
                            codes::REBALANCE_IN_PROGRESS,
                            member_id.clone(),
                        ));
                    }
                    m.protocols = p.protocols;
                    m.protocol_type = p.protocol_type;
                    m.session_timeout = session_timeout;
                    m.rebalance_timeout = rebalance_timeout;
                    m.last_seen = now;
                }
                None => {
                    debug!(group = %g.id, member = %member_id, "member joins");
                    g.members.push(Member {
                        id: member_id,
                        instance_id: p.instance_id,
                        session_timeout,
                        rebalance_timeout,
                        protocol_type: p.protocol_type,
                        protocols: p.protocols,
                        join: Some(tx),
                        sync: None,
                        assignment: Bytes::new(),
                        last_seen: now,
                    });
                }
            }
            if g.state != State::PreparingRebalance {
                self.prepare_rebalance(&mut g);
            }
            complete_join(&mut g, false);
            rx
        };
        rx.await
            .unwrap_or_else(|_| JoinOutcome::error(codes::COORDINATOR_NOT_AVAILABLE, String::new()))
    }

    /// Starts a rebalance: members must rejoin.
    fn prepare_rebalance(self: &Arc<Self>, g: &mut Group) {
        let was_empty = g.state == State::Empty;
        g.state = State::PreparingRebalance;
        g.rebalance += 1;
        for m in &mut g.members {
            if let Some(tx) = m.sync.take() {
                let _ = tx.send(SyncOutcome::error(codes::REBALANCE_IN_PROGRESS));
            }
        }
        let timeout = g
            .members
            .iter()
            .map(|m| m.rebalance_timeout)
            .max()
            .unwrap_or(MIN_SESSION_TIMEOUT);
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
            for (at, force) in [(delay_until, false), (deadline, true)] {
                tokio::time::sleep_until(at).await;
                let Some(group) = this.existing(&group_id) else {
                    return;
                };
                let mut g = group.lock();
                if g.rebalance != rebalance || g.state != State::PreparingRebalance {
                    return;
                }
                if complete_join(&mut g, force) {
                    return;
                }
            }
        });
    }

    /// SyncGroup: waits for the leader's assignments.
    pub(crate) async fn sync(
        &self,
        group_id: &str,
        generation: i32,
        member_id: &str,
        assignments: Vec<(String, Bytes)>,
    ) -> SyncOutcome {
        let Some(group) = self.existing(group_id) else {
            return SyncOutcome::error(codes::UNKNOWN_MEMBER_ID);
        };
        let rx = {
            let mut g = group.lock();
            let state = g.state;
            let current = g.generation;
            let is_leader = g.leader.as_deref() == Some(member_id);
            let protocol_type = g.protocol_type.clone();
            let protocol_name = g.protocol_name.clone();
            let Some(m) = g.member(member_id) else {
                return SyncOutcome::error(codes::UNKNOWN_MEMBER_ID);
            };
            if generation != current {
                return SyncOutcome::error(codes::ILLEGAL_GENERATION);
            }
            m.last_seen = Instant::now();
            match state {
                State::Empty => return SyncOutcome::error(codes::UNKNOWN_MEMBER_ID),
                State::PreparingRebalance => {
                    return SyncOutcome::error(codes::REBALANCE_IN_PROGRESS);
                }
                State::Stable => {
                    return SyncOutcome {
                        error: codes::NONE,
                        assignment: m.assignment.clone(),
                        protocol_type,
                        protocol_name,
                    };
                }
                State::CompletingRebalance => {}
            }
            let (tx, rx) = oneshot::channel();
            if let Some(old) = m.sync.replace(tx) {
                let _ = old.send(SyncOutcome::error(codes::REBALANCE_IN_PROGRESS));
            }
            if is_leader {
                let mut by_member: HashMap<String, Bytes> = assignments.into_iter().collect();
                for m in &mut g.members {
                    m.assignment = by_member.remove(&m.id).unwrap_or_default();
                }
                g.state = State::Stable;
                info!(group = %g.id, generation = g.generation, members = g.members.len(), "group stable");
                for m in &mut g.members {
                    if let Some(tx) = m.sync.take() {
                        let _ = tx.send(SyncOutcome {
                            error: codes::NONE,
                            assignment: m.assignment.clone(),
                            protocol_type: protocol_type.clone(),
                            protocol_name: protocol_name.clone(),
                        });
                    }
                }
            }
            rx
        };
        rx.await
            .unwrap_or_else(|_| SyncOutcome::error(codes::REBALANCE_IN_PROGRESS))
    }

    /// Heartbeat: the error code.
    pub(crate) fn heartbeat(&self, group_id: &str, generation: i32, member_id: &str) -> i16 {
        let Some(group) = self.existing(group_id) else {
            return codes::UNKNOWN_MEMBER_ID;
        };
        let mut g = group.lock();
        let state = g.state;
        let current = g.generation;
        let Some(m) = g.member(member_id) else {
            return codes::UNKNOWN_MEMBER_ID;
        };
        if generation != current {
            return codes::ILLEGAL_GENERATION;
        }
        m.last_seen = Instant::now();
        match state {
            State::PreparingRebalance => codes::REBALANCE_IN_PROGRESS,
            State::CompletingRebalance | State::Stable => codes::NONE,
            State::Empty => codes::UNKNOWN_MEMBER_ID,
        }
    }

    /// LeaveGroup: the error code of each member.
    pub(crate) fn leave(self: &Arc<Self>, group_id: &str, members: &[String]) -> Vec<i16> {
        let Some(group) = self.existing(group_id) else {
            return vec![codes::UNKNOWN_MEMBER_ID; members.len()];
        };
        let mut g = group.lock();
        let mut out = Vec::with_capacity(members.len());
        let mut removed = false;
        for id in members {
            match g.members.iter().position(|m| &m.id == id) {
                Some(i) => {
                    let m = g.members.remove(i);
                    answer_removed(m);
                    info!(group = %g.id, member = %id, "member left");
                    removed = true;
                    out.push(codes::NONE);
                }
                None => out.push(codes::UNKNOWN_MEMBER_ID),
            }
        }
        if removed {
            self.after_removal(&mut g);
        }
        out
    }

    fn after_removal(self: &Arc<Self>, g: &mut Group) {
        if g.leader
            .as_ref()
            .is_some_and(|l| !g.members.iter().any(|m| &m.id == l))
        {
            g.leader = None;
        }
        if g.members.is_empty() {
            g.state = State::Empty;
            g.rebalance += 1;
            g.generation += 1;
            g.protocol_name = None;
            return;
        }
        match g.state {
            State::PreparingRebalance => {
                complete_join(g, false);
            }
            _ => self.prepare_rebalance(g),
        }
    }

    /// Whether an OffsetCommit of this member may be stored (the error code); a commit counts as a
    /// heartbeat.
    pub(crate) fn validate_commit(&self, group_id: &str, generation: i32, member_id: &str) -> i16 {
        let group = self.existing(group_id);
        if generation < 0 && member_id.is_empty() {
            // A commit from outside the group protocol (admin tools, assign()-based consumers).
            return match group {
                Some(g) if !g.lock().members.is_empty() => codes::UNKNOWN_MEMBER_ID,
                _ => codes::NONE,
            };
        }
        let Some(group) = group else {
            return codes::ILLEGAL_GENERATION;
        };
        let mut g = group.lock();
        let state = g.state;
        let current = g.generation;
        let Some(m) = g.member(member_id) else {
            return codes::UNKNOWN_MEMBER_ID;
        };
        if generation != current {
            return codes::ILLEGAL_GENERATION;
        }
        m.last_seen = Instant::now();
        if state == State::CompletingRebalance {
            return codes::REBALANCE_IN_PROGRESS;
        }
        codes::NONE
    }

    /// Removes members whose session expired; runs until aborted.
    pub(crate) async fn run_expiry(self: Arc<Self>) {
        loop {
            tokio::time::sleep(EXPIRY_CHECK).await;
            let groups: Vec<Arc<Mutex<Group>>> = self.groups.lock().values().cloned().collect();
            let now = Instant::now();
            for group in groups {
                let mut g = group.lock();
                let expired: Vec<String> = g
                    .members
                    .iter()
                    .filter(|m| m.join.is_none() && m.sync.is_none())
                    .filter(|m| now.duration_since(m.last_seen) > m.session_timeout)
                    .map(|m| m.id.clone())
                    .collect();
                if expired.is_empty() {
                    continue;
                }
                for id in &expired {
                    if let Some(i) = g.members.iter().position(|m| &m.id == id) {
                        let m = g.members.remove(i);
                        answer_removed(m);
                        info!(group = %g.id, member = %id, "member session expired");
                    }
                }
                self.after_removal(&mut g);
            }
        }
    }
}

/// Answers the pending requests of a removed member.
fn answer_removed(m: Member) {
    if let Some(tx) = m.join {
        let _ = tx.send(JoinOutcome::error(codes::UNKNOWN_MEMBER_ID, m.id.clone()));
    }
    if let Some(tx) = m.sync {
        let _ = tx.send(SyncOutcome::error(codes::UNKNOWN_MEMBER_ID));
    }
}

/// Completes the join phase when every member has rejoined (or `force`: the rebalance timed out).
/// Returns whether the join phase is over.
fn complete_join(g: &mut Group, force: bool) -> bool {
    if g.state != State::PreparingRebalance {
        return true;
    }
    let all_joined = g.members.iter().all(|m| m.join.is_some());
    if !all_joined && !force {
        return false;
    }
    // The initial delay of an empty group's first rebalance: the timer completes it.
    if !force && g.delay_until.is_some_and(|t| Instant::now() < t) {
        return false;
    }
    let before = g.members.len();
    let (stay, gone): (Vec<Member>, Vec<Member>) = std::mem::take(&mut g.members)
        .into_iter()
        .partition(|m| m.join.is_some());
    g.members = stay;
    for m in gone {
        info!(group = %g.id, member = %m.id, "member did not rejoin in time: removed");
        answer_removed(m);
    }
    g.generation += 1;
    if g.members.is_empty() {
        g.state = State::Empty;
        g.leader = None;
        g.protocol_name = None;
        debug!(group = %g.id, before, "group empty after rebalance");
        return true;
    }
    if g.leader
        .as_ref()
        .is_none_or(|l| !g.members.iter().any(|m| &m.id == l))
    {
        g.leader = g.members.first().map(|m| m.id.clone());
    }
    let leader = g.leader.clone().unwrap_or_default();
    // A protocol every member supports, in the leader's order of preference.
    let protocol = g.members.iter().find(|m| m.id == leader).and_then(|l| {
        l.protocols.iter().map(|(n, _)| n.clone()).find(|name| {
            g.members
                .iter()
                .all(|m| m.protocols.iter().any(|(n, _)| n == name))
        })
    });
    g.protocol_type = g.members.first().map(|m| m.protocol_type.clone());
    g.protocol_name = protocol.clone();
    g.state = State::CompletingRebalance;
    let protocol = protocol.unwrap_or_default();
    let member_list: Vec<(String, Option<String>, Bytes)> = g
        .members
        .iter()
        .map(|m| {
            let metadata = m
                .protocols
                .iter()
                .find(|(n, _)| *n == protocol)
                .map(|(_, md)| md.clone())
                .unwrap_or_default();
            (m.id.clone(), m.instance_id.clone(), metadata)
        })
        .collect();
    info!(
        group = %g.id,
        generation = g.generation,
        members = g.members.len(),
        protocol = %protocol,
        leader = %leader,
        "rebalance: join phase complete"
    );
    let now = Instant::now();
    let generation = g.generation;
    let protocol_type = g.protocol_type.clone();
    for m in &mut g.members {
        m.last_seen = now;
        if let Some(tx) = m.join.take() {
            let _ = tx.send(JoinOutcome {
                error: codes::NONE,
                generation,
                protocol_type: protocol_type.clone(),
                protocol_name: Some(protocol.clone()),
                leader: leader.clone(),
                member_id: m.id.clone(),
                members: if m.id == leader {
                    member_list.clone()
                } else {
                    Vec::new()
                },
            });
        }
    }
    true
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// FindCoordinator: the broker that answers for a group (any broker of the process would).
pub(crate) async fn find_coordinator(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: FindCoordinatorRequest,
) -> FindCoordinatorResponse {
    let keys: Vec<StrBytes> = if ctx.version >= 4 {
        request.coordinator_keys
    } else {
        vec![request.key]
    };
    let mut answers = Vec::with_capacity(keys.len());
    for key in keys {
        let mut c = Coordinator::default();
        if request.key_type != 0 {
            c.error_code = codes::INVALID_REQUEST;
            c.error_message = Some(s("transactions are not supported on diskless topics yet"));
            c.node_id = BrokerId(-1);
            c.port = -1;
        } else {
            match broker.cluster.coordinator_for(key.as_str()) {
                Some(node) => {
                    c.node_id = BrokerId(node.id);
                    c.host = s(&node.host);
                    c.port = node.port;
                }
                None => {
                    c.error_code = codes::COORDINATOR_NOT_AVAILABLE;
                    c.node_id = BrokerId(-1);
                    c.port = -1;
                }
            }
        }
        c.key = key;
        answers.push(c);
    }
    let mut response = FindCoordinatorResponse::default();
    if ctx.version >= 4 {
        response.coordinators = answers;
    } else if let Some(c) = answers.pop() {
        response.error_code = c.error_code;
        if ctx.version >= 1 {
            response.error_message = c.error_message;
        }
        response.node_id = c.node_id;
        response.host = c.host;
        response.port = c.port;
    }
    response
}

/// JoinGroup.
pub(crate) async fn join_group(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: JoinGroupRequest,
) -> JoinGroupResponse {
    let outcome = broker
        .groups
        .join(JoinParams {
            group_id: request.group_id.as_str().to_string(),
            member_id: request.member_id.as_str().to_string(),
            instance_id: request.group_instance_id.map(|s| s.as_str().to_string()),
            client_id: ctx.client_id.clone(),
            session_timeout_ms: request.session_timeout_ms,
            rebalance_timeout_ms: if ctx.version >= 1 {
                request.rebalance_timeout_ms
            } else {
                -1
            },
            protocol_type: request.protocol_type.as_str().to_string(),
            protocols: request
                .protocols
                .into_iter()
                .map(|p| (p.name.as_str().to_string(), p.metadata))
                .collect(),
        })
        .await;
    let mut response = JoinGroupResponse::default();
    response.error_code = outcome.error;
    response.generation_id = outcome.generation;
    if ctx.version >= 7 {
        response.protocol_type = outcome.protocol_type.map(StrBytes::from_string);
        response.protocol_name = outcome.protocol_name.map(StrBytes::from_string);
    } else {
        response.protocol_name = Some(StrBytes::from_string(
            outcome.protocol_name.unwrap_or_default(),
        ));
    }
    response.leader = StrBytes::from_string(outcome.leader);
    response.member_id = StrBytes::from_string(outcome.member_id);
    response.members = outcome
        .members
        .into_iter()
        .map(|(id, instance, metadata)| {
            let mut m = JoinGroupResponseMember::default();
            m.member_id = StrBytes::from_string(id);
            if ctx.version >= 5 {
                m.group_instance_id = instance.map(StrBytes::from_string);
            }
            m.metadata = metadata;
            m
        })
        .collect();
    response
}

/// SyncGroup.
pub(crate) async fn sync_group(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: SyncGroupRequest,
) -> SyncGroupResponse {
    let outcome = broker
        .groups
        .sync(
            request.group_id.as_str(),
            request.generation_id,
            request.member_id.as_str(),
            request
                .assignments
                .into_iter()
                .map(|a| (a.member_id.as_str().to_string(), a.assignment))
                .collect(),
        )
        .await;
    let mut response = SyncGroupResponse::default();
    response.error_code = outcome.error;
    response.assignment = outcome.assignment;
    if ctx.version >= 5 {
        response.protocol_type = outcome.protocol_type.map(StrBytes::from_string);
        response.protocol_name = outcome.protocol_name.map(StrBytes::from_string);
    }
    response
}

/// Heartbeat.
pub(crate) async fn heartbeat(
    broker: &Arc<Broker>,
    _ctx: &Ctx,
    request: HeartbeatRequest,
) -> HeartbeatResponse {
    let mut response = HeartbeatResponse::default();
    response.error_code = broker.groups.heartbeat(
        request.group_id.as_str(),
        request.generation_id,
        request.member_id.as_str(),
    );
    response
}

/// LeaveGroup: one member (versions 0-2) or several (3+).
pub(crate) async fn leave_group(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: LeaveGroupRequest,
) -> LeaveGroupResponse {
    let mut response = LeaveGroupResponse::default();
    if ctx.version >= 3 {
        let ids: Vec<String> = request
            .members
            .iter()
            .map(|m| m.member_id.as_str().to_string())
            .collect();
        let codes_out = broker.groups.leave(request.group_id.as_str(), &ids);
        response.members = request
            .members
            .into_iter()
            .zip(codes_out)
            .map(|(m, code)| {
                let mut r = MemberResponse::default();
                r.member_id = m.member_id;
                r.group_instance_id = m.group_instance_id;
                r.error_code = code;
                r
            })
            .collect();
    } else {
        let id = request.member_id.as_str().to_string();
        response.error_code = broker
            .groups
            .leave(request.group_id.as_str(), &[id])
            .first()
            .copied()
            .unwrap_or(codes::UNKNOWN_MEMBER_ID);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(member: &str) -> JoinParams {
        JoinParams {
            group_id: "g".into(),
            member_id: member.into(),
            instance_id: None,
            client_id: "c".into(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 5_000,
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"m"))],
        }
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
            gc.sync("g", generation, &follower.member_id, Vec::new()),
            gc.sync("g", generation, &leader.member_id, assignments),
        );
        assert_eq!(fs.error, codes::NONE);
        assert_eq!(&fs.assignment[..], b"F");
        assert_eq!(&ls.assignment[..], b"L");
        assert_eq!(
            gc.heartbeat("g", generation, &follower.member_id),
            codes::NONE
        );
        assert_eq!(
            gc.heartbeat("g", generation + 1, &follower.member_id),
            codes::ILLEGAL_GENERATION
        );
        assert_eq!(
            gc.validate_commit("g", generation, &leader.member_id),
            codes::NONE
        );

        // The leader leaves: the follower is told to rejoin and becomes the only member.
        assert_eq!(
            gc.leave("g", std::slice::from_ref(&leader.member_id)),
            vec![codes::NONE]
        );
        assert_eq!(
            gc.heartbeat("g", generation, &follower.member_id),
            codes::REBALANCE_IN_PROGRESS
        );
        let again = gc.join(params(&follower.member_id)).await;
        assert_eq!(again.error, codes::NONE);
        assert_eq!(again.generation, generation + 1);
        assert_eq!(again.leader, follower.member_id);
        assert_eq!(again.members.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_that_does_not_rejoin_is_dropped_at_the_rebalance_timeout() {
        let gc = GroupCoordinator::new();
        let first = gc.join(params("")).await;
        assert_eq!(first.error, codes::NONE);
        let s = gc
            .sync(
                "g",
                first.generation,
                &first.member_id,
                vec![(first.member_id.clone(), Bytes::from_static(b"x"))],
            )
            .await;
        assert_eq!(s.error, codes::NONE);
        // A second member joins; the first never rejoins.
        let second = gc.join(params("")).await;
        assert_eq!(second.error, codes::NONE);
        assert_eq!(second.members.len(), 1, "only the second member is left");
        assert_eq!(
            gc.heartbeat("g", second.generation, &first.member_id),
            codes::UNKNOWN_MEMBER_ID
        );
        assert_eq!(
            gc.join(params("nobody")).await.error,
            codes::UNKNOWN_MEMBER_ID
        );
    }
}
