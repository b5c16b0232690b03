//! Pins tansu 0.6.0's group coordinator behaviour that `client-suites/*.exclude` names as the cause
//! of the rebalance exclusions (librdkafka 0089, 0132: cause G1). When an upgrade changes it, this
//! test fails: run those tests again (`CLIENT_SUITES_PENDING=1` after making them `pending`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use bytes::Bytes;
use tansu_broker::coordinator::group::{Coordinator, administrator::Controller};
use tansu_sans_io::{Body, join_group_request::JoinGroupRequestProtocol};

/// One JoinGroup: (error code, generation, leader, member id, members listed).
async fn join<C: Coordinator>(c: &mut C, member: &str) -> (i16, i32, String, String, usize) {
    let protocols = [JoinGroupRequestProtocol::default()
        .name("range".into())
        .metadata(Bytes::from_static(b"m"))];
    let body = c
        .join(
            Some("pin"),
            "g-pin",
            6_000,
            Some(300_000),
            member,
            None,
            "consumer",
            Some(&protocols[..]),
            None,
        )
        .await
        .unwrap();
    match body {
        Body::JoinGroupResponse(r) => (
            r.error_code,
            r.generation_id,
            r.leader,
            r.member_id,
            r.members.map_or(0, |m| m.len()),
        ),
        other => panic!("{other:?}"),
    }
}

/// Kafka holds a new group's first JoinGroup for `group.initial.rebalance.delay.ms` (3 s), so a
/// member joining 500 ms later is in the same first generation. tansu 0.6.0 answers the first
/// member at once, alone, as leader (G1): the second member's join then makes a second generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_0_6_0_answers_a_new_groups_first_join_alone() {
    let dir = tempfile::tempdir().unwrap();
    let running = common::node(dir.path()).await;
    let groups = Controller::with_storage(running.storage.clone()).unwrap();

    let mut a = groups.clone();
    let (code, _, _, a_id, _) = join(&mut a, "").await;
    assert_eq!(code, 79, "MEMBER_ID_REQUIRED first");
    let first = tokio::spawn(async move { join(&mut a, &a_id).await });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let mut b = groups.clone();
    let (code, _, _, b_id, _) = join(&mut b, "").await;
    assert_eq!(code, 79);
    let second = tokio::spawn(async move { join(&mut b, &b_id).await });

    let (code, a_generation, leader, a_member, members) = first.await.unwrap();
    assert_eq!(code, 0);
    assert_eq!(
        (members, leader == a_member),
        (1, true),
        "tansu now holds a new group's first JoinGroup (Kafka's initial rebalance delay): \
         run librdkafka 0089 and 0132 again and lift their exclusions if they pass"
    );
    let (code, b_generation, _, _, _) = second.await.unwrap();
    assert_eq!(code, 0);
    assert!(
        b_generation > a_generation,
        "the second member's join made a new generation: {a_generation} then {b_generation}"
    );
    running.shutdown().await;
}
