//! The group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, and the admin APIs
//! ListGroups, DescribeGroups and DeleteGroups — requests decoded into calls of the process's
//! [`GroupCoordinator`](crate::group_coordinator::GroupCoordinator) (the classic group protocol's
//! state machine) and its outcomes encoded into responses.

use std::collections::HashSet;
use std::sync::Arc;

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{
    BrokerId, DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest,
    DescribeGroupsResponse, FindCoordinatorRequest, FindCoordinatorResponse, GroupId,
    HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
    LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse, SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::protocol::StrBytes;

use crate::codes;

use crate::broker::Broker;
use crate::ctx::Ctx;
use crate::group_coordinator::{JoinOutcome, JoinParams, SyncOutcome};

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// FindCoordinator: the broker that answers for a group (key type 0) or a transactional id (key
/// type 1); any broker of the process would, as both coordinators are the process's.
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
        if request.key_type != 0 && request.key_type != 1 {
            c.error_code = codes::INVALID_REQUEST;
            c.error_message = Some(s("unknown coordinator key type"));
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

/// The client's host as Kafka reports it (`/` and the address).
fn client_host(ctx: &Ctx) -> String {
    format!("/{}", ctx.peer.ip())
}

fn opt(v: Option<StrBytes>) -> Option<String> {
    v.map(|s| s.as_str().to_string())
}

/// JoinGroup.
pub(crate) async fn join_group(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: JoinGroupRequest,
) -> JoinGroupResponse {
    let outcome = match broker.groups.load(&broker.store).await {
        Err(code) => JoinOutcome::error(code, request.member_id.as_str().to_string()),
        Ok(()) => {
            broker
                .groups
                .join(JoinParams {
                    group_id: request.group_id.as_str().to_string(),
                    member_id: request.member_id.as_str().to_string(),
                    instance_id: if ctx.version >= 5 {
                        opt(request.group_instance_id)
                    } else {
                        None
                    },
                    client_id: ctx.client_id.clone(),
                    client_host: client_host(ctx),
                    require_known_member_id: ctx.version >= 4,
                    support_skipping_assignment: ctx.version >= 9,
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
                .await
        }
    };
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
    if ctx.version >= 9 {
        response.skip_assignment = outcome.skip_assignment;
    }
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
    let outcome = match broker.groups.load(&broker.store).await {
        Err(code) => SyncOutcome::error(code),
        Ok(()) => {
            let instance = if ctx.version >= 3 {
                opt(request.group_instance_id)
            } else {
                None
            };
            let (protocol_type, protocol_name) = if ctx.version >= 5 {
                (opt(request.protocol_type), opt(request.protocol_name))
            } else {
                (None, None)
            };
            broker
                .groups
                .sync(
                    request.group_id.as_str(),
                    request.generation_id,
                    request.member_id.as_str(),
                    instance.as_deref(),
                    (protocol_type.as_deref(), protocol_name.as_deref()),
                    request
                        .assignments
                        .into_iter()
                        .map(|a| (a.member_id.as_str().to_string(), a.assignment))
                        .collect(),
                )
                .await
        }
    };
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
    ctx: &Ctx,
    request: HeartbeatRequest,
) -> HeartbeatResponse {
    let mut response = HeartbeatResponse::default();
    response.error_code = match broker.groups.load(&broker.store).await {
        Err(code) => code,
        Ok(()) => {
            let instance = if ctx.version >= 3 {
                opt(request.group_instance_id)
            } else {
                None
            };
            broker.groups.heartbeat(
                request.group_id.as_str(),
                request.generation_id,
                request.member_id.as_str(),
                instance.as_deref(),
            )
        }
    };
    response
}

/// LeaveGroup: one member (versions 0-2) or several, by member id or group instance id (3+).
pub(crate) async fn leave_group(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: LeaveGroupRequest,
) -> LeaveGroupResponse {
    let mut response = LeaveGroupResponse::default();
    if let Err(code) = broker.groups.load(&broker.store).await {
        response.error_code = code;
        return response;
    }
    let group = request.group_id.as_str();
    if ctx.version >= 3 {
        let members: Vec<(String, Option<String>)> = request
            .members
            .iter()
            .map(|m| {
                (
                    m.member_id.as_str().to_string(),
                    m.group_instance_id.as_ref().map(|s| s.as_str().to_string()),
                )
            })
            .collect();
        match broker.groups.leave(group, &members) {
            Err(code) => response.error_code = code,
            Ok(codes_out) => {
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
            }
        }
    } else {
        let id = request.member_id.as_str().to_string();
        response.error_code = match broker.groups.leave(group, &[(id, None)]) {
            Err(code) => code,
            Ok(codes_out) => codes_out
                .first()
                .copied()
                .unwrap_or(codes::UNKNOWN_MEMBER_ID),
        };
    }
    response
}

/// ListGroups (version 4+: the states filter; 5+: the types filter, where every group is
/// `classic`).
pub(crate) async fn list_groups(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: ListGroupsRequest,
) -> ListGroupsResponse {
    let mut response = ListGroupsResponse::default();
    if let Err(code) = broker.groups.load(&broker.store).await {
        response.error_code = code;
        return response;
    }
    let states: Vec<String> = if ctx.version >= 4 {
        request
            .states_filter
            .iter()
            .map(|s| s.as_str().to_string())
            .collect()
    } else {
        Vec::new()
    };
    let classic = ctx.version < 5
        || request.types_filter.is_empty()
        || request
            .types_filter
            .iter()
            .any(|t| t.as_str().eq_ignore_ascii_case("classic"));
    if !classic {
        return response;
    }
    // As each Kafka broker lists the groups it coordinates (an admin client asks every broker and
    // merges the answers): this node lists the groups FindCoordinator names it for.
    response.groups = broker
        .groups
        .list(&states)
        .into_iter()
        .filter(|(id, _, _)| {
            broker
                .cluster
                .coordinator_for(id)
                .is_some_and(|node| node.id == ctx.node)
        })
        .map(|(id, protocol_type, state)| {
            let mut g = ListedGroup::default();
            g.group_id = GroupId(StrBytes::from_string(id));
            g.protocol_type = StrBytes::from_string(protocol_type);
            if ctx.version >= 4 {
                g.group_state = s(state);
            }
            if ctx.version >= 5 {
                g.group_type = s("classic");
            }
            g
        })
        .collect();
    response
}

/// DescribeGroups (a group that does not exist is described as `Dead`, as Kafka before version 6).
pub(crate) async fn describe_groups(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: DescribeGroupsRequest,
) -> DescribeGroupsResponse {
    let loaded = broker.groups.load(&broker.store).await;
    let mut response = DescribeGroupsResponse::default();
    for id in request.groups {
        let mut d = DescribedGroup::default();
        match loaded {
            Err(code) => d.error_code = code,
            Ok(()) => {
                let summary = broker.groups.describe(id.as_str());
                d.group_state = s(summary.state);
                d.protocol_type = StrBytes::from_string(summary.protocol_type);
                d.protocol_data = StrBytes::from_string(summary.protocol);
                d.members = summary
                    .members
                    .into_iter()
                    .map(|m| {
                        let mut dm = DescribedGroupMember::default();
                        dm.member_id = StrBytes::from_string(m.member_id);
                        if ctx.version >= 4 {
                            dm.group_instance_id = m.instance_id.map(StrBytes::from_string);
                        }
                        dm.client_id = StrBytes::from_string(m.client_id);
                        dm.client_host = StrBytes::from_string(m.client_host);
                        dm.member_metadata = m.metadata;
                        dm.member_assignment = m.assignment;
                        dm
                    })
                    .collect();
            }
        }
        d.group_id = id;
        response.groups.push(d);
    }
    response
}

/// DeleteGroups: each group that is empty (`NON_EMPTY_GROUP` otherwise, `GROUP_ID_NOT_FOUND` if
/// unknown), with its committed offsets.
pub(crate) async fn delete_groups(
    broker: &Arc<Broker>,
    _ctx: &Ctx,
    request: DeleteGroupsRequest,
) -> DeleteGroupsResponse {
    let loaded = broker.groups.load(&broker.store).await;
    let mut response = DeleteGroupsResponse::default();
    let mut seen = HashSet::new();
    for id in request.groups_names {
        if !seen.insert(id.as_str().to_string()) {
            continue;
        }
        let mut r = DeletableGroupResult::default();
        r.error_code = match loaded {
            Err(code) => code,
            Ok(()) => broker.groups.delete(id.as_str()).await,
        };
        r.group_id = id;
        response.results.push(r);
    }
    response
}
